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

Added here, and invisible to any template that stays within its limits: the budget of
:mod:`~tokenkeys.template.budget` is consulted before every operation that can build a
value much larger than its inputs (operators, ``~``, filters, str methods, ``str.format``,
macro and block output, ``range``, ``lipsum``, ``strftime_now``, the text of an expression) and
charged after it, and the wall time is read as the render goes (a running jinja render cannot
be interrupted).
"""

from __future__ import annotations

import functools
import json
import types
from collections.abc import Callable, Iterable
from datetime import datetime
from functools import update_wrapper
from typing import Any

import jinja2
import jinja2.ext
import jinja2.nodes
import jinja2.parser
import jinja2.utils
from jinja2.compiler import CodeGenerator, Frame
from jinja2.exceptions import SecurityError, TemplateError
from jinja2.sandbox import (
    ImmutableSandboxedEnvironment,
    SandboxedEscapeFormatter,
    SandboxedFormatter,
    is_internal_attribute,
)
from jinja2.utils import _PassArg, generate_lorem_ipsum
from markupsafe import Markup

from tokenkeys.template import budget
from tokenkeys.template.budget import RenderGuard, guarded

__all__ = ["ChatSandbox", "RenderGuard", "TemplateRaised", "build_environment", "guarded"]

# lipsum words run up to a dozen characters with their space and punctuation.
_LIPSUM_WORD_CHARS = 12
# strftime directives expand at most about twelvefold (%c: 24 characters from 2).
_STRFTIME_EXPANSION = 12


class TemplateRaised(TemplateError):
    """The template called ``raise_exception(message)``; ``message`` is the template's text."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.template_message = message


def _guarded_concat(pieces: Iterable[str]) -> str:
    """``environment.concat`` (macro bodies, ``{% set %}`` blocks, ``caller()``), bounded."""
    guard = budget.active()
    if guard is None:
        return "".join(pieces)
    parts = []
    size = 0
    for piece in pieces:
        size += len(piece)
        if size > guard.max_chars:
            guard.check_size(size, "block or macro output")
        parts.append(piece)
    text = "".join(parts)
    guard.charge(text)
    return text


class _GuardedCodeGenerator(CodeGenerator):
    """Compiles the ``~`` operator to :meth:`ChatSandbox.join_text`, which bounds its size.

    jinja compiles ``a ~ b`` to a call of ``str_join`` that no environment hook sees; this is
    the one construct whose size the sandbox could not otherwise check before it is built.
    """

    def visit_Concat(self, node: jinja2.nodes.Concat, frame: Frame) -> None:
        self.write("environment.join_text((")
        for arg in node.nodes:
            self.visit(arg, frame)
            self.write(", ")
        self.write("))")


class _BoundedFormat:
    """str.format fields checked against the budget before they are formatted."""

    def format_field(self, value: Any, format_spec: str) -> Any:
        guard = budget.active()
        if guard is not None:
            budget.check_format_spec(guard, format_spec, value)
        return super().format_field(value, format_spec)  # type: ignore[misc]


class _Formatter(_BoundedFormat, SandboxedFormatter):
    pass


class _EscapeFormatter(_BoundedFormat, SandboxedEscapeFormatter):
    pass


class ChatSandbox(ImmutableSandboxedEnvironment):
    """transformers' sandbox plus the budgets of the active :class:`RenderGuard`."""

    code_generator_class = _GuardedCodeGenerator
    intercepted_binops = frozenset({"*", "+", "**", "%"})
    concat = staticmethod(_guarded_concat)

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        # In the constructor, not in build_environment: every instance, including the one
        # that only analyses a template (template.syntax), must never run a filter unguarded.
        self.filters["tojson"] = _tojson
        self.filters = {name: _guard_filter(name, f) for name, f in self.filters.items()}
        self.finalize = _finalize
        self.globals["lipsum"] = _bounded_lipsum
        self.globals["range"] = _bounded_range

    def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
        """Apply an arithmetic operator after checking the size of its result."""
        budget.check_binop(operator, left, right)
        result = self.binop_table[operator](left, right)
        budget.charge(result)
        return result

    def join_text(self, values: Iterable[Any]) -> str:
        """The ``~`` operator: the values as text, joined, within the budget."""
        guard = budget.active()
        if guard is None:
            return "".join(map(str, values))
        parts = []
        size = 0
        for value in values:
            if not isinstance(value, str):
                guard.check_text(value, "~ concatenation")
                value = str(value)
            size += len(value)
            parts.append(value)
        guard.check_size(size, "~ concatenation")
        text = "".join(parts)
        guard.charge(text)
        return text

    def wrap_str_format(self, value: Any) -> Callable[..., str] | None:
        """``str.format`` and ``format_map`` of sandboxed code, with bounded widths.

        Same contract as jinja's (applied at attribute access, so every call is covered), with
        a formatter that checks each field's width and precision before formatting it.
        """
        if not isinstance(value, (types.MethodType, types.BuiltinMethodType)) or (
            value.__name__ not in ("format", "format_map")
        ):
            return None
        owner = value.__self__
        if not isinstance(owner, str):
            return None
        kind = type(owner)
        is_map = value.__name__ == "format_map"
        if isinstance(owner, Markup):
            formatter: SandboxedFormatter = _EscapeFormatter(self, escape=owner.escape)
        else:
            formatter = _Formatter(self)

        def wrapper(*args: Any, **kwargs: Any) -> str:
            if is_map:
                if kwargs or len(args) != 1:
                    raise TypeError("format_map() takes exactly one positional argument")
                args, kwargs = (), args[0]
            budget.tick()
            text = kind(formatter.vformat(owner, args, kwargs))
            budget.charge(text)
            return text

        return update_wrapper(wrapper, value)

    def getattr(self, obj: Any, attribute: str) -> Any:
        """Sandboxed attribute access, counted against the render time."""
        budget.tick()
        return super().getattr(obj, attribute)

    def getitem(self, obj: Any, argument: Any) -> Any:
        """Sandboxed item access, counted against the render time."""
        budget.tick()
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
        """Sandboxed call, checked and charged against the budget (jinja's dunder names)."""
        budget.tick()
        args = budget.check_call(__obj, args, kwargs)
        result = super().call(__context, __obj, *args, **kwargs)
        budget.charge(result)
        return result


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
    guard = budget.active()
    if guard is not None:
        guard.charge_range(len(result))
    if len(result) > jinja2.sandbox.MAX_RANGE:
        raise OverflowError(
            f"range of {len(result)} items; the sandbox allows {jinja2.sandbox.MAX_RANGE}"
        )
    return result


def _guard_filter(name: str, function: Callable[..., Any]) -> Callable[..., Any]:
    """``function`` (a jinja filter) checked before it runs and charged after."""
    # Filters marked pass_context/pass_environment/pass_eval_context get that first.
    offset = 0 if _PassArg.from_obj(function) is None else 1

    @functools.wraps(function)  # keeps jinja_pass_arg, which says what jinja passes first
    def guarded_filter(*args: Any, **kwargs: Any) -> Any:
        if budget.active() is None:
            # jinja folds filters of constants while compiling, outside any render and so
            # outside any budget ('x'|center(10**9) would allocate then); refusing here makes
            # the compiler leave the filter to the guarded render.
            raise RuntimeError("chat template filters run only inside a guarded render")
        if len(args) > offset:
            value = args[offset]
            checked = budget.check_filter(name, value, args[offset + 1 :], kwargs)
            if checked is not value:
                args = (*args[:offset], checked, *args[offset + 1 :])
        result = function(*args, **kwargs)
        budget.charge(result)
        return result

    return guarded_filter


def _finalize(value: Any) -> Any:
    # Every {{ expression }} passes here before str(): a container's text is sized first.
    if not isinstance(value, str):
        guard = budget.active()
        if guard is not None:
            guard.check_text(value, "output of an expression")
    return value


def _bounded_lipsum(n: int = 5, html: bool = True, min: int = 20, max: int = 100) -> str:  # noqa: A002
    guard = budget.active()
    if guard is not None and isinstance(n, int) and isinstance(max, int):
        guard.check_size(n * max * _LIPSUM_WORD_CHARS, "lipsum")
    return generate_lorem_ipsum(n=n, html=html, min=min, max=max)


def build_environment(clock: Callable[[], datetime]) -> ChatSandbox:
    """Create the environment chat templates compile in; ``clock`` feeds ``strftime_now``."""
    env = ChatSandbox(
        trim_blocks=True,
        lstrip_blocks=True,
        extensions=[GenerationTag, jinja2.ext.loopcontrols],
    )

    def strftime_now(format: str) -> str:  # noqa: A002 - the name templates use
        guard = budget.active()
        if guard is not None:
            guard.check_size(len(str(format)) * _STRFTIME_EXPANSION, "strftime_now")
        return clock().strftime(format)

    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = strftime_now
    env.globals["dict"] = _DictConstructor()
    env.globals["namespace"] = ChatNamespace
    return env
