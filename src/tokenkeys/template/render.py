"""Render a chat template exactly as transformers' ``apply_chat_template(..., tokenize=False)``.

Matched against transformers 5.24 (``tokenization_utils_base.py`` ``apply_chat_template`` and
``utils/chat_template_utils.py`` ``render_jinja_template``), step by step:

1. an empty conversation is refused; keys whose value is None are dropped from each message;
2. ``continue_final_message`` together with ``add_generation_prompt`` is refused;
3. template variables are the special tokens (``bos_token``, ``eos_token``, ...) overridden by
   the caller's variables, plus ``messages``, ``tools``, ``documents`` and
   ``add_generation_prompt`` (always defined, False by default);
4. every input is rebuilt from plain JSON types (anything else becomes ``"<TypeName>"``);
5. a message's reasoning given as ``reasoning_content``, ``thinking`` or ``reasoning`` is
   copied to ``thinking`` and ``reasoning_content``;
6. ``continue_final_message``: a marker is appended to the final message's content (the last
   text part when content is a list), the template is rendered, and the text is cut where the
   marker lands, so the prompt ends inside the final message.

Every template failure becomes :class:`~tokenkeys.errors.InvalidArgument` naming
``chat_template`` (vLLM answers 400 for the same failures); render limits become
:class:`~tokenkeys.errors.TemplateLimitExceeded` (a LimitExceeded that is also reported as a
bad argument, 400: the template is at fault, not the size of the request).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from types import TracebackType
from typing import Any

import jinja2
from jinja2.exceptions import SecurityError, TemplateSyntaxError, UndefinedError

from tokenkeys.errors import InvalidArgument, TemplateLimitExceeded, TokenkeysError
from tokenkeys.template.sandbox import RenderGuard, TemplateRaised, build_environment, guarded
from tokenkeys.template.syntax import (
    ContentFormat,
    detect_content_format,
    free_variables,
    hostile_constructs,
)

# transformers' marker for continue_final_message (render_jinja_template, 5.24). The same text
# is used so that templates which transform content (strip, replace) treat it identically.
_CONTINUE_TAG = "CONTINUE_FINAL_MESSAGE_TAG "
# Names transformers accepts as a message's reasoning; the first is the one templates read.
_REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")
# Variables the renderer itself defines; callers may not pass them again.
_RESERVED = frozenset({"messages", "tools", "documents", "add_generation_prompt"})


@dataclass(frozen=True)
class RenderLimits:
    """Bounds on one template and one render, all configurable; past one: TemplateLimitExceeded.

    ``max_output_chars`` also bounds every single value a render builds; ``max_built_chars``
    bounds all of them together (intermediate values included), hence the memory one render
    can hold. ``max_render_seconds`` is enforced cooperatively (jinja cannot be interrupted):
    the clock ``monotonic`` is read during attribute, item, call, operator and filter
    evaluation. None disables it.
    """

    max_template_chars: int = 1 << 20
    max_output_chars: int = 1 << 22
    max_built_chars: int = 1 << 27
    max_range_items: int = 10_000_000
    max_render_seconds: float | None = 10.0
    monotonic: Callable[[], float] = field(default=time.monotonic, compare=False)

    def __post_init__(self) -> None:
        for name in (
            "max_template_chars",
            "max_output_chars",
            "max_built_chars",
            "max_range_items",
        ):
            if getattr(self, name) <= 0:
                raise ValueError(f"RenderLimits.{name} must be positive")
        if self.max_render_seconds is not None and not self.max_render_seconds > 0:
            raise ValueError("RenderLimits.max_render_seconds must be positive (or None)")
        if self.max_built_chars < self.max_output_chars:
            raise ValueError("RenderLimits.max_built_chars must be at least max_output_chars")


def _template_line(tb: TracebackType | None) -> int | None:
    """The template line of the innermost frame that ran template code, if any."""
    line = None
    while tb is not None:
        if tb.tb_frame.f_code.co_filename == "<template>":
            line = tb.tb_lineno
        tb = tb.tb_next
    return line


def _at(line: int | None) -> str:
    return f" (template line {line})" if line else ""


def _translate(exc: BaseException) -> TokenkeysError:
    """Map a failure raised while rendering to the tokenkeys tree."""
    if isinstance(exc, TokenkeysError):
        return exc
    where = _at(_template_line(exc.__traceback__))
    if isinstance(exc, TemplateRaised):
        return InvalidArgument(
            f"chat_template raised an error: {exc.template_message}",
            field="chat_template",
            template_message=exc.template_message,
        )
    if isinstance(exc, SecurityError):
        return InvalidArgument(
            f"chat_template was stopped by the sandbox{where}: {str(exc).rstrip('.')}. "
            "Templates may not reach private attributes, interpreter internals or mutate their "
            "inputs",
            field="chat_template",
            kind="sandbox",
        )
    if isinstance(exc, UndefinedError):
        return InvalidArgument(
            f"chat_template used an undefined value{where}: {exc}; the request lacks something "
            "the template needs (check roles, content and the chat_template_kwargs it reads)",
            field="chat_template",
        )
    if isinstance(exc, MemoryError):
        return TemplateLimitExceeded(
            "chat_template rendering ran out of memory; the template builds a value too large",
            field="chat_template",
        )
    if isinstance(exc, RecursionError):
        return InvalidArgument(
            f"chat_template recursed too deeply{where}; the render was stopped",
            field="chat_template",
            kind="recursion",
        )
    return InvalidArgument(
        f"chat_template failed while rendering{where}: {type(exc).__name__}: {exc}",
        field="chat_template",
    )


def _plain(value: Any) -> Any:
    """Rebuild a value from JSON types, as transformers' ``_plain_template_data`` does."""
    if value is None or type(value) in (str, int, float, bool):
        return value
    if isinstance(value, str):
        return str.__str__(value)
    if isinstance(value, int):
        return int.__int__(value)
    if isinstance(value, float):
        return float.__float__(value)
    if isinstance(value, Mapping):
        return {_plain(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, tuple):
        return tuple(_plain(v) for v in value)
    return f"<{type(value).__name__}>"


def _alias_reasoning(message: dict[str, Any]) -> dict[str, Any]:
    reasoning = next((message[k] for k in _REASONING_FIELDS if message.get(k) is not None), None)
    if reasoning is None:
        return message
    # Same construction as transformers: ``thinking`` first unless present, reasoning_content
    # kept in place or appended.
    return {"thinking": reasoning, **message, "reasoning_content": reasoning}


class ChatTemplateRenderer:
    """One compiled chat template; renders conversations as transformers does.

    Construction compiles the template once (raising InvalidArgument for a syntax error) and
    analyses it: :attr:`variables` are the names it reads, :attr:`content_format` is how vLLM
    would hand it message content. Instances are immutable and safe to share across threads.
    """

    def __init__(
        self,
        template: str,
        *,
        limits: RenderLimits | None = None,
        clock: Callable[[], datetime] = datetime.now,
    ) -> None:
        self.limits = limits or RenderLimits()
        if not isinstance(template, str):
            raise InvalidArgument(
                f"chat_template must be a string, got {type(template).__name__}",
                field="chat_template",
            )
        if len(template) > self.limits.max_template_chars:
            raise TemplateLimitExceeded(
                f"chat_template has {len(template)} characters; the limit is "
                f"{self.limits.max_template_chars}",
                field="chat_template",
            )
        self.template = template
        env = build_environment(clock)
        try:
            ast = env.parse(template)
            self._compiled = env.from_string(ast)
        except TemplateSyntaxError as exc:
            raise InvalidArgument(
                f"chat_template has a syntax error at line {exc.lineno}: {exc.message}",
                field="chat_template",
            ) from exc
        except (jinja2.TemplateError, RecursionError, ValueError) as exc:
            raise InvalidArgument(
                f"chat_template does not compile: {exc}", field="chat_template"
            ) from exc
        self.variables: frozenset[str] = free_variables(template)
        self.content_format: ContentFormat = detect_content_format(ast)
        #: Reads of interpreter internals (the sandbox refuses them when they run).
        self.hostile: tuple[str, ...] = tuple(hostile_constructs(ast))

    def render(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        tools: Sequence[Mapping[str, Any]] | None = None,
        documents: Sequence[Mapping[str, Any]] | None = None,
        add_generation_prompt: bool = False,
        continue_final_message: bool | str = False,
        special_tokens: Mapping[str, str] | None = None,
        variables: Mapping[str, Any] | None = None,
    ) -> str:
        """Render one conversation to prompt text.

        ``special_tokens`` are transformers' ``special_tokens_map`` (``bos_token``,
        ``eos_token``, ...); ``variables`` are extra template variables (chat_template_kwargs)
        and override special tokens of the same name. ``continue_final_message`` may name the
        field to continue (``"reasoning_content"``); True means ``"content"``.
        """
        if not messages:
            raise InvalidArgument(
                "messages is empty; a chat template needs at least one message",
                field="messages",
            )
        if continue_final_message and add_generation_prompt:
            raise InvalidArgument(
                "continue_final_message and add_generation_prompt cannot both be true: "
                "continue_final_message extends the last message, add_generation_prompt opens "
                "a new assistant turn; set add_generation_prompt to false",
                field="continue_final_message",
            )
        extra = dict(variables or {})
        clash = sorted(_RESERVED & extra.keys())
        if clash:
            raise InvalidArgument(
                f"template variables may not redefine {', '.join(clash)}; pass them as the "
                "request's own fields",
                field="chat_template_kwargs",
            )
        for tool in tools or ():
            if not isinstance(tool, Mapping):
                raise InvalidArgument(
                    f"tools must be JSON schema objects, got {type(tool).__name__}",
                    field="tools",
                )
        for document in documents or ():
            if not isinstance(document, Mapping):
                raise InvalidArgument(
                    "documents must be objects (with 'title' and 'text'), got "
                    f"{type(document).__name__}",
                    field="documents",
                )
        chat = [self._message(m) for m in messages]
        chat = [_alias_reasoning(m) for m in chat]
        final_text = None
        if continue_final_message:
            final_text = self._mark_final(chat, continue_final_message)
        context = {
            **_plain(dict(special_tokens or {})),
            **_plain(extra),
            "messages": chat,
            "tools": _plain(list(tools)) if tools is not None else None,
            "documents": _plain(list(documents)) if documents is not None else None,
            "add_generation_prompt": add_generation_prompt,
        }
        rendered = self._run(context)
        if final_text is not None:
            rendered = self._cut_at_marker(rendered, final_text)
        return rendered

    def render_raw(self, variables: Mapping[str, Any]) -> str:
        """Render with exactly ``variables``: none of apply_chat_template's preparation.

        The sandbox, filters, globals and limits are the same as :meth:`render`; only the
        message handling (None removal, reasoning aliases, defaults) is skipped.
        """
        return self._run(_plain(dict(variables)))

    @staticmethod
    def _message(message: Any) -> dict[str, Any]:
        if not isinstance(message, Mapping):
            raise InvalidArgument(
                f"each message must be an object, got {type(message).__name__}",
                field="messages",
            )
        # apply_chat_template drops None values: templates handle a missing key, not a null.
        return _plain({k: v for k, v in message.items() if v is not None})

    def _mark_final(self, chat: list[dict[str, Any]], continue_final_message: bool | str) -> str:
        """Append the marker to the final message's field; return the text it continues."""
        name = continue_final_message if isinstance(continue_final_message, str) else "content"
        final = chat[-1]
        value = final.get(name)
        if value is None:
            raise InvalidArgument(
                f'continue_final_message is set but the final message has no "{name}" to continue',
                field="continue_final_message",
            )
        names = [name]
        if name in _REASONING_FIELDS:
            names = [f for f in _REASONING_FIELDS if final.get(f) == value]
        if not any(n in self.template for n in names):
            raise InvalidArgument(
                f'continue_final_message continues "{name}", which this chat_template never '
                "mentions",
                field="continue_final_message",
            )
        if isinstance(value, (list, tuple)):
            for part in reversed(value):
                if isinstance(part, dict) and "text" in part:
                    text = part["text"]
                    if not isinstance(text, str):
                        break
                    part["text"] = text + _CONTINUE_TAG
                    return text
            raise InvalidArgument(
                "continue_final_message is set but the final message has no text part to continue",
                field="continue_final_message",
            )
        if not isinstance(value, str):
            raise InvalidArgument(
                f'continue_final_message needs the final message\'s "{name}" to be text, got '
                f"{type(value).__name__}",
                field="continue_final_message",
            )
        for n in names:
            final[n] = final[n] + _CONTINUE_TAG
        return value

    @staticmethod
    def _cut_at_marker(rendered: str, final_text: str) -> str:
        marker = _CONTINUE_TAG.strip()
        if final_text.strip() not in rendered or marker not in rendered:
            raise InvalidArgument(
                "continue_final_message is set but the final message does not appear in the "
                "rendered chat; this chat_template rewrites or drops the final message, so it "
                "cannot be continued",
                field="continue_final_message",
            )
        at = rendered.rindex(marker)
        if rendered[at : at + len(_CONTINUE_TAG)] == _CONTINUE_TAG:
            return rendered[:at]
        # The template trimmed the space after the marker, hence the content's trailing space.
        return rendered[:at].rstrip()

    def _run(self, context: dict[str, Any]) -> str:
        limits = self.limits
        deadline = (
            None
            if limits.max_render_seconds is None
            else limits.monotonic() + limits.max_render_seconds
        )
        guard = RenderGuard(
            max_chars=limits.max_output_chars,
            max_range_items=limits.max_range_items,
            deadline=deadline,
            monotonic=limits.monotonic,
            max_built=limits.max_built_chars,
        )
        pieces: list[str] = []
        size = 0
        try:
            with guarded(guard):
                for piece in self._compiled.generate(context):
                    size += len(piece)
                    if size > limits.max_output_chars:
                        raise TemplateLimitExceeded(
                            f"chat_template output exceeds the {limits.max_output_chars}-"
                            "character limit",
                            field="chat_template",
                        )
                    pieces.append(piece)
        except Exception as exc:  # every template failure is translated, none escapes raw
            raise _translate(exc) from exc
        return "".join(pieces)
