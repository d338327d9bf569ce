"""The budget of one chat template render: time, output, and the values a template may build.

A jinja render cannot be interrupted and Python allocates whatever it is asked for, so a hostile
template (``'a' * 10**9``, ``'{:999999999}'.format('')``, ``(['x' * 4000000] * 1000)|join``, a
macro doubling its output forty times) could take the memory of the whole server. The sandbox
environment (:mod:`~tokenkeys.template.sandbox`) consults the active :class:`RenderGuard`
*before* every operation that can build a value much larger than its inputs, and charges what
was built afterwards:

- one value may not exceed ``max_chars`` characters (or items), checked from the operands before
  it is built (repetition, concatenation, padding widths, format widths and precisions,
  replacement, joins, string conversion of containers, JSON indentation);
- all values built in one render may not exceed ``max_built`` characters in total, which bounds
  the memory a render can hold whatever it keeps alive;
- ``range`` items over the render are bounded, and the wall time is read every few dozen
  guarded operations (attribute, item, call, operator, filter).

Templates that stay within the limits render exactly as in transformers; what goes past one is
refused with :class:`~tokenkeys.errors.TemplateLimitExceeded` naming it (HTTP 400).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

import jinja2.utils

from tokenkeys.errors import TemplateLimitExceeded

# Integer powers whose result would exceed this many bits are refused: Python computes them
# without any bound, and printing one larger than 4300 digits fails anyway.
MAX_POWER_BITS = 1 << 20
# The deadline is compared with the clock once per this many guarded operations.
_TICKS_PER_CLOCK_READ = 64
# Characters assumed for the text of a value that is neither a string nor a container.
_SCALAR_CHARS = 24
# Characters of separators and quotes assumed around each item of a container's text.
_ITEM_CHARS = 4
_SEQUENCES = (str, list, tuple)
# Filters that turn their value into text first (str() of a container can be huge).
TEXT_FILTERS = frozenset(
    "string trim upper lower capitalize title center indent replace truncate wordwrap "
    "wordcount striptags urlize escape e forceescape safe urlencode pprint xmlattr".split()
)
# printf-style conversion specifiers: flags, width, precision (``*`` takes them from the args).
_PERCENT_SPEC = re.compile(
    r"%(?:\([^)]*\))?[#0\- +]*(\*|\d+)?(?:\.(\*|\d+))?[hlL]?[diouxXeEfFgGcrsa%]"
)
# str.format specs: [[fill]align][sign][z][#][0][width][grouping][.precision][type]
_FORMAT_SPEC = re.compile(r"^(?:.?[<>=^])?[+\- ]?z?#?0?(\d*)[,_]?(?:\.(\d+))?[a-zA-Z%]?$")


@dataclass
class RenderGuard:
    """Budgets of one render; consulted by the environment while the render is active."""

    max_chars: int
    max_range_items: int
    deadline: float | None
    monotonic: Callable[[], float]
    max_built: int = 1 << 62
    range_items: int = 0
    built: int = 0
    _ticks: int = field(default=0, repr=False)

    def tick(self) -> None:
        """Count one guarded operation; past the deadline, stop the render."""
        self._ticks += 1
        if self._ticks % _TICKS_PER_CLOCK_READ == 0 and self.deadline is not None:
            if self.monotonic() > self.deadline:
                raise TemplateLimitExceeded(
                    "chat_template rendering ran past the render time limit; the template does "
                    "too much work for this request (simplify it or raise the limit)",
                    field="chat_template",
                )

    def charge_range(self, items: int) -> None:
        """Account for ``items`` produced by ``range`` in this render."""
        self.range_items += items
        if self.range_items > self.max_range_items:
            raise TemplateLimitExceeded(
                f"chat_template iterated over more than {self.max_range_items} range() items "
                "in one render; loops that large are refused",
                field="chat_template",
            )

    def check_size(self, size: int, what: str) -> None:
        """Refuse building a value longer than the output limit."""
        if size > self.max_chars:
            raise TemplateLimitExceeded(
                f"chat_template {what} would build a value of {size} items, above the "
                f"{self.max_chars}-character output limit",
                field="chat_template",
            )

    def charge(self, value: Any) -> None:
        """Count a value this render built against the render's total."""
        if isinstance(value, (str, list, tuple, dict)):
            self.built += len(value)
            if self.built > self.max_built:
                raise TemplateLimitExceeded(
                    f"chat_template built more than {self.max_built} characters of values in "
                    "one render (max_built_chars); the template makes too many or too large "
                    "intermediate values",
                    field="chat_template",
                )

    def check_text(self, value: Any, what: str) -> None:
        """Refuse converting a container whose text would exceed the output limit."""
        if not isinstance(value, str) and text_size(value, self.max_chars) > self.max_chars:
            raise TemplateLimitExceeded(
                f"chat_template {what} would turn a value of more than {self.max_chars} "
                "characters into text, above the output limit",
                field="chat_template",
            )


_ACTIVE_GUARD: ContextVar[RenderGuard | None] = ContextVar("chat_render_guard", default=None)


@contextmanager
def guarded(guard: RenderGuard) -> Iterator[RenderGuard]:
    """Make ``guard`` the active budget of renders in this context (thread or task)."""
    token = _ACTIVE_GUARD.set(guard)
    try:
        yield guard
    finally:
        _ACTIVE_GUARD.reset(token)


def active() -> RenderGuard | None:
    """The budget of the render running in this context, if any."""
    return _ACTIVE_GUARD.get()


def text_size(value: Any, limit: int) -> int:
    """About how many characters ``str(value)`` has; stops counting once past ``limit``.

    Walks containers without converting them (a list repeating one large string a million
    times is small in memory and enormous as text), each container once.
    """
    total = 0
    stack = [value]
    seen: set[int] = set()
    while stack and total <= limit:
        item = stack.pop()
        if isinstance(item, str):
            total += len(item) + _ITEM_CHARS
            continue
        if isinstance(item, jinja2.utils.Namespace):
            item = object.__getattribute__(item, "_Namespace__attrs")
        if isinstance(item, (list, tuple, set, frozenset, Mapping)):
            if id(item) in seen:
                continue
            seen.add(id(item))
            total += _ITEM_CHARS
            if isinstance(item, Mapping):
                stack.extend(item.keys())
                stack.extend(item.values())
            else:
                stack.extend(item)
            continue
        total += _SCALAR_CHARS
    return total


def _percent_widths(fmt: str, args: Any) -> list[int]:
    """Widths and precisions a printf-style format asks for (``*`` ones from ``args``)."""
    numbers: list[int] = []
    star = False
    for match in _PERCENT_SPEC.finditer(fmt):
        for part in match.groups():
            if part == "*":
                star = True
            elif part:
                numbers.append(int(part))
    if star:
        values = args if isinstance(args, tuple) else (args,)
        numbers.extend(v for v in values if isinstance(v, int))
    return numbers


def check_percent(guard: RenderGuard, fmt: str, args: Any) -> None:
    """Refuse ``fmt % args`` asking for a width or precision above the output limit."""
    for number in _percent_widths(fmt, args):
        guard.check_size(number, "% formatting width or precision")
    values = args if isinstance(args, tuple) else (args,)
    for value in values:
        guard.check_text(value, "% formatting")


def check_format_spec(guard: RenderGuard, spec: str, value: Any) -> None:
    """Refuse a str.format field whose width or precision is above the output limit."""
    match = _FORMAT_SPEC.match(spec)
    digits = [g for g in match.groups() if g] if match else re.findall(r"\d+", spec)
    for number in digits:
        guard.check_size(int(number), "format width or precision")
    guard.check_text(value, "str.format")


def check_binop(operator: str, left: Any, right: Any) -> None:
    """Refuse an arithmetic operation whose result would exceed the budget."""
    guard = _ACTIVE_GUARD.get()
    if guard is None:
        return
    guard.tick()
    # Exact-type tests first: this runs for every + in every template, and strings dominate.
    if operator == "+":
        kind = type(left)
        if kind in _SEQUENCES and type(right) is kind:
            guard.check_size(len(left) + len(right), "concatenation")
    elif operator == "*":
        if isinstance(left, _SEQUENCES) and isinstance(right, int):
            guard.check_size(len(left) * max(right, 0), "repetition")
        elif isinstance(right, _SEQUENCES) and isinstance(left, int):
            guard.check_size(len(right) * max(left, 0), "repetition")
    elif operator == "**":
        if isinstance(left, int) and isinstance(right, int) and right > 0 and abs(left) > 1:
            if abs(left).bit_length() * right > MAX_POWER_BITS:
                raise TemplateLimitExceeded(
                    f"chat_template computes {left} ** {right}, an integer above "
                    f"{MAX_POWER_BITS} bits; refused",
                    field="chat_template",
                )
    elif operator == "%" and isinstance(left, str):
        check_percent(guard, left, right)


def join_size(guard: RenderGuard, items: Any, separator: str) -> int:
    """Characters of ``separator.join(map(str, items))``, checked item by item."""
    size = 0
    count = 0
    for item in items:
        size += len(item) if isinstance(item, str) else text_size(item, guard.max_chars)
        count += 1
        if size > guard.max_chars:
            break
    return size + len(separator) * max(count - 1, 0)


def _lines(text: str) -> int:
    return text.count("\n") + 1


def _indent_weight(value: Any, depth: int, limit: int) -> int:
    """Indentation levels over all lines of ``json.dumps(value, indent=...)`` (up to limit)."""
    if isinstance(value, Mapping):
        items = list(value.values())
    elif isinstance(value, (list, tuple)):
        items = list(value)
    else:
        return 0
    total = depth - 1
    for item in items:
        total += depth + _indent_weight(item, depth + 1, limit)
        if total > limit:
            break
    return total


def _str_method_size(guard: RenderGuard, name: str, text: str, args: tuple) -> int | None:
    """Upper bound of the result of ``text.<name>(*args)`` for the expanding str methods."""
    if name in ("center", "ljust", "rjust", "zfill") and args and isinstance(args[0], int):
        return max(args[0], len(text))
    if name == "expandtabs":
        size = args[0] if args and isinstance(args[0], int) else 8
        return len(text) + text.count("\t") * max(size, 0)
    if name == "replace" and len(args) >= 2:
        old, new = args[0], args[1]
        if isinstance(old, str) and isinstance(new, str):
            hits = text.count(old) if old else len(text) + 1
            if len(args) > 2 and isinstance(args[2], int) and args[2] >= 0:
                hits = min(hits, args[2])
            return len(text) + hits * max(len(new) - len(old), 0)
    if name == "join" and args:
        return join_size(guard, args[0], text)
    return None


def check_call(obj: Any, args: tuple, kwargs: Mapping[str, Any]) -> Any:
    """Before a sandboxed call: refuse an expanding str method over budget.

    Returns ``args`` unchanged, or with a one-shot iterator argument of ``join`` materialized
    (it is read twice: once to size the result, once to build it).
    """
    guard = _ACTIVE_GUARD.get()
    if guard is None:
        return args
    name = getattr(obj, "__name__", "")
    owner = getattr(obj, "__self__", None)
    if isinstance(owner, str) and not kwargs:
        if name == "join" and args and not isinstance(args[0], (list, tuple, str)):
            args = (list(args[0]), *args[1:])
        size = _str_method_size(guard, name, owner, args)
        if size is not None:
            guard.check_size(size, f"str.{name}")
    return args


def check_filter(name: str, value: Any, args: tuple, kwargs: Mapping[str, Any]) -> Any:
    """Before a filter runs: refuse a result over budget; returns the (possibly listed) value."""
    guard = _ACTIVE_GUARD.get()
    if guard is None:
        return value
    guard.tick()
    limit = guard.max_chars

    def arg(index: int, key: str, default: Any) -> Any:
        if len(args) > index:
            return args[index]
        return kwargs.get(key, default)

    text = value if isinstance(value, str) else None
    if name in ("join", "sum") and not isinstance(value, (list, tuple, str, Mapping)):
        value = list(value)  # an iterator is read twice: to size the result, then to build it
    if name == "join":
        separator = arg(0, "d", "")
        attribute = arg(1, "attribute", None)
        items = value
        if attribute is not None:
            items = [v.get(attribute) if isinstance(v, Mapping) else "" for v in value]
        guard.check_size(join_size(guard, items, str(separator)), "join filter")
        return value
    if name == "sum":
        start = arg(1, "start", 0)
        if isinstance(start, _SEQUENCES):
            total = len(start) + sum(len(v) for v in value if isinstance(v, _SEQUENCES))
            guard.check_size(total, "sum filter")
        return value
    if name == "tojson":
        guard.check_text(value, "tojson")
        indent = arg(1, "indent", None)
        width = len(indent) if isinstance(indent, str) else indent if isinstance(indent, int) else 0
        if width > 0:
            weight = _indent_weight(value, 1, limit)
            guard.check_size(weight * width, "tojson indentation")
        return value
    if name == "format" and isinstance(value, str):
        check_percent(guard, value, tuple(args) or dict(kwargs))
        return value
    if text is None:
        if name in TEXT_FILTERS:
            guard.check_text(value, f"{name} filter")
        return value
    if name == "center":
        width = arg(0, "width", 80)
        if isinstance(width, int):
            guard.check_size(max(width, len(text)), "center filter")
    elif name == "indent":
        width = arg(0, "width", 4)
        size = len(width) if isinstance(width, str) else width if isinstance(width, int) else 0
        guard.check_size(len(text) + size * _lines(text), "indent filter")
    elif name == "replace":
        size = _str_method_size(guard, "replace", text, (arg(0, "old", ""), arg(1, "new", "")))
        if size is not None:
            guard.check_size(size, "replace filter")
    elif name == "wordwrap":
        width = arg(0, "width", 79)
        wrap = arg(2, "wrapstring", None)
        if isinstance(width, int) and isinstance(wrap, str):
            guard.check_size(len(text) + (len(text) // max(width, 1) + 1) * len(wrap), "wordwrap")
    return value


def charge(value: Any) -> None:
    """Count a value built by the active render (no-op outside a render)."""
    guard = _ACTIVE_GUARD.get()
    if guard is not None:
        guard.charge(value)


def tick() -> None:
    """Count one guarded operation of the active render."""
    guard = _ACTIVE_GUARD.get()
    if guard is not None:
        guard.tick()
