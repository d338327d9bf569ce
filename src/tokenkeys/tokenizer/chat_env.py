"""The sandboxed jinja2 environment that chat templates run in, with transformers' semantics.

Behaviour matched (transformers 5.24, ``src/transformers/utils/chat_template_utils.py``,
``_cached_compile_jinja_template``): an ``ImmutableSandboxedEnvironment`` with
``trim_blocks=True``, ``lstrip_blocks=True``, the ``loopcontrols`` extension and a
``{% generation %}`` block tag; a ``tojson`` filter that does not escape HTML and takes
``ensure_ascii, indent, separators, sort_keys`` in that order; the globals ``raise_exception``,
``strftime_now``, ``dict`` (a constructor only) and ``namespace`` (which refuses names starting
with an underscore).

Refused here although transformers renders them as empty text: dunder and interpreter-internal
attributes (``__class__``, ``__globals__``, ``gi_frame``), which only hostile templates read.

Added here, and invisible to any template that stays within its limits: a :class:`RenderGuard`
active during one render bounds sequence repetition and concatenation, integer powers, the items
produced by ``range`` and the wall time spent (checked cooperatively on every attribute, item,
call and arithmetic operation, since a running jinja render cannot be interrupted).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import jinja2
import jinja2.ext
import jinja2.nodes
import jinja2.parser
import jinja2.utils
from jinja2.exceptions import SecurityError, TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment, is_internal_attribute

from tokenkeys.errors import LimitExceeded

# Integer powers whose result would exceed this many bits are refused: Python computes them
# without any bound, and printing one larger than 4300 digits fails anyway.
_MAX_POWER_BITS = 1 << 20
# The deadline is compared with the clock once per this many guarded operations.
_TICKS_PER_CLOCK_READ = 64


class TemplateRaised(TemplateError):
    """The template called ``raise_exception(message)``; ``message`` is the template's text."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.template_message = message


@dataclass
class RenderGuard:
    """Budgets of one render; consulted by the environment while the render is active."""

    max_chars: int
    max_range_items: int
    deadline: float | None
    monotonic: Callable[[], float]
    range_items: int = 0
    _ticks: int = field(default=0, repr=False)

    def tick(self) -> None:
        """Count one guarded operation; past the deadline, stop the render."""
        self._ticks += 1
        if self._ticks % _TICKS_PER_CLOCK_READ == 0 and self.deadline is not None:
            if self.monotonic() > self.deadline:
                raise LimitExceeded(
                    "chat_template rendering ran past the render time limit; the template does "
                    "too much work for this request (simplify it or raise the limit)",
                    field="chat_template",
                )

    def charge_range(self, items: int) -> None:
        """Account for ``items`` produced by ``range`` in this render."""
        self.range_items += items
        if self.range_items > self.max_range_items:
            raise LimitExceeded(
                f"chat_template iterated over more than {self.max_range_items} range() items "
                "in one render; loops that large are refused",
                field="chat_template",
            )

    def check_size(self, size: int, what: str) -> None:
        """Refuse building a value longer than the output limit."""
        if size > self.max_chars:
            raise LimitExceeded(
                f"chat_template {what} would build a value of {size} items, above the "
                f"{self.max_chars}-character output limit",
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


def _tick() -> None:
    guard = _ACTIVE_GUARD.get()
    if guard is not None:
        guard.tick()


_SEQUENCES = (str, list, tuple)


def _check_binop(operator: str, left: Any, right: Any) -> None:
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
            if abs(left).bit_length() * right > _MAX_POWER_BITS:
                raise LimitExceeded(
                    f"chat_template computes {left} ** {right}, an integer above "
                    f"{_MAX_POWER_BITS} bits; refused",
                    field="chat_template",
                )


class ChatSandbox(ImmutableSandboxedEnvironment):
    """transformers' sandbox plus the budgets of the active :class:`RenderGuard`."""

    intercepted_binops = frozenset({"*", "+", "**"})

    def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
        """Apply an arithmetic operator after checking the size of its result."""
        _check_binop(operator, left, right)
        return self.binop_table[operator](left, right)

    def getattr(self, obj: Any, attribute: str) -> Any:
        """Sandboxed attribute access, counted against the render time."""
        _tick()
        return super().getattr(obj, attribute)

    def getitem(self, obj: Any, argument: Any) -> Any:
        """Sandboxed item access, counted against the render time."""
        _tick()
        return super().getitem(obj, argument)

    def unsafe_undefined(self, obj: Any, attribute: str) -> Any:
        """Refuse dunder and interpreter-internal attributes at once (a deliberate difference).

        transformers' sandbox returns an undefined value that prints as empty text, so
        ``{{ ''.__class__ }}`` renders nothing; here it is an error, because no chat template
        reads interpreter internals and a template that tries is hostile. Other unsafe
        attributes (single-underscore names, mutating methods) keep jinja's behaviour.
        """
        if attribute.startswith("__") or is_internal_attribute(obj, attribute):
            raise SecurityError(
                f"access to attribute {attribute!r} of a {type(obj).__name__!r} object is refused"
            )
        return super().unsafe_undefined(obj, attribute)

    def call(__self, __context: Any, __obj: Any, *args: Any, **kwargs: Any) -> Any:  # noqa: N805
        """Sandboxed call, counted against the render time (jinja's double-underscore names)."""
        _tick()
        return super().call(__context, __obj, *args, **kwargs)


class GenerationTag(jinja2.ext.Extension):
    """``{% generation %}...{% endgeneration %}`` renders its body unchanged.

    transformers uses the tag to locate assistant tokens for training masks; rendered text is
    the body as is, which is all a prompt needs.
    """

    tags = {"generation"}

    def parse(self, parser: jinja2.parser.Parser) -> jinja2.nodes.Node:
        """Parse the block up to ``endgeneration`` into a call of :meth:`_body`."""
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        call = self.call_method("_body")
        return jinja2.nodes.CallBlock(call, [], [], body).set_lineno(lineno)

    def _body(self, caller: Callable[[], str]) -> str:
        return caller()


def _raise_exception(message: Any) -> None:
    raise TemplateRaised(str(message))


def _tojson(
    value: Any,
    ensure_ascii: bool = False,
    indent: int | str | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    # Same parameters, order and defaults as transformers' filter: jinja's own tojson escapes
    # HTML characters and sorts keys, which would change prompts.
    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


class _DictConstructor:
    """The ``dict`` global: builds plain dicts, exposes nothing else of the ``dict`` type."""

    def __call__(self, *args: Any, **kwargs: Any) -> dict[Any, Any]:
        return dict(*args, **kwargs)

    def fromkeys(self, *args: Any, **kwargs: Any) -> dict[Any, Any]:
        return dict.fromkeys(*args, **kwargs)


def _check_namespace_name(name: Any) -> None:
    if isinstance(name, str) and name.startswith("_"):
        raise SecurityError(
            f"chat templates may not store underscore-prefixed attributes on a namespace, got "
            f"{name!r}; rename the attribute"
        )


class ChatNamespace(jinja2.utils.Namespace):
    """jinja's ``namespace`` without underscore names (they reach interpreter internals)."""

    def __init__(*args: Any, **kwargs: Any) -> None:  # noqa: N805 - jinja's signature trick
        self, rest = args[0], args[1:]
        attrs = dict(*rest, **kwargs)
        for name in attrs:
            _check_namespace_name(name)
        jinja2.utils.Namespace.__init__(self, attrs)

    def __setitem__(self, name: str, value: Any) -> None:
        _check_namespace_name(name)
        jinja2.utils.Namespace.__setitem__(self, name, value)


def _bounded_range(*args: int) -> range:
    # jinja's sandbox already refuses a single range above 100,000 items; the guard also bounds
    # their sum, which nested loops multiply.
    result = range(*args)
    guard = _ACTIVE_GUARD.get()
    if guard is not None:
        guard.charge_range(len(result))
    if len(result) > jinja2.sandbox.MAX_RANGE:
        raise OverflowError(
            f"range of {len(result)} items; the sandbox allows {jinja2.sandbox.MAX_RANGE}"
        )
    return result


def build_environment(clock: Callable[[], datetime]) -> ChatSandbox:
    """Create the environment chat templates compile in; ``clock`` feeds ``strftime_now``."""
    env = ChatSandbox(
        trim_blocks=True,
        lstrip_blocks=True,
        extensions=[GenerationTag, jinja2.ext.loopcontrols],
    )

    def strftime_now(format: str) -> str:  # noqa: A002 - the name templates use
        return clock().strftime(format)

    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = strftime_now
    env.globals["dict"] = _DictConstructor()
    env.globals["namespace"] = ChatNamespace
    env.globals["range"] = _bounded_range
    return env
