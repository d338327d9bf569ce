"""The fields of a chat request that choose and feed the template, each read in one step.

:meth:`~tokenkeys.preprocess.chat.ChatPrologue.prepare` runs them in order (the first problem
found is the one reported): the prompt flags, the requested template (trusted or refused),
the template variables (request kwargs and fields over the server defaults), the tools. Each
follows vLLM's chat request handling (``ChatParams.with_defaults``,
``resolve_chat_template_kwargs``, ``merge_kwargs``), read at the release ``chat.py`` names.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from tokenkeys.errors import InvalidArgument
from tokenkeys.preprocess.chat_tools import check_tool_choice, normalize_tools, optional

#: Names that would collide with apply_chat_template's own arguments.
COLLIDING_KWARGS = frozenset({"conversation", "messages", "tools", "self", "tokenize"})
_REASONING_EFFORTS = frozenset({"none", "minimal", "low", "medium", "high", "xhigh", "max"})


def freeze(value: Any) -> Any:
    """JSON-like data made immutable: mappings read-only, lists tuples."""
    if isinstance(value, Mapping):
        return MappingProxyType({k: freeze(v) for k, v in value.items()})
    if isinstance(value, (list, tuple)):
        return tuple(freeze(v) for v in value)
    return value


def thaw(value: Any) -> Any:
    """The inverse of :func:`freeze` (frozen values came from JSON, whose arrays are lists)."""
    if isinstance(value, Mapping):
        return {k: thaw(v) for k, v in value.items()}
    if isinstance(value, tuple):
        return [thaw(v) for v in value]
    return value


@dataclass(frozen=True)
class PromptFlags:
    """Whether the render ends with the assistant's prompt or continues the last message."""

    add_generation_prompt: bool
    continue_final_message: bool


@dataclass(frozen=True)
class TemplateKwargs:
    """The template's variables, the documents, and a template named inside the kwargs."""

    variables: dict[str, Any]
    documents: list[dict[str, Any]] | None
    template: str | None


def prompt_flags(request: Mapping[str, Any]) -> PromptFlags:
    """``add_generation_prompt`` (default true) and ``continue_final_message``, not both."""
    flags = PromptFlags(
        _flag(request, "add_generation_prompt", True),
        _flag(request, "continue_final_message", False),
    )
    if flags.add_generation_prompt and flags.continue_final_message:
        raise InvalidArgument(
            "continue_final_message and add_generation_prompt cannot both be true (and "
            "add_generation_prompt defaults to true); send add_generation_prompt: false to "
            "continue the final message",
            field="continue_final_message",
        )
    return flags


def requested_template(request: Mapping[str, Any], trusted: bool) -> str | None:
    """The request's ``chat_template`` (a name or a text); refused unless the server trusts
    request templates, as is one named inside ``chat_template_kwargs``."""
    kwargs = _object(request.get("chat_template_kwargs"), "chat_template_kwargs")
    name = optional(request.get("chat_template"), str, "chat_template")
    if not trusted and (name is not None or kwargs.get("chat_template") is not None):
        raise InvalidArgument(
            "chat_template was sent with the request, but this server does not trust "
            "request chat templates (start it with --trust-request-chat-template)",
            field="chat_template",
        )
    bad = sorted(COLLIDING_KWARGS & kwargs.keys())
    if bad:
        raise InvalidArgument(
            f"chat_template_kwargs may not set {', '.join(bad)}; send messages and tools "
            "as the request's own fields",
            field="chat_template_kwargs",
        )
    return name


def template_kwargs(
    request: Mapping[str, Any], defaults: Mapping[str, Any], flags: PromptFlags
) -> TemplateKwargs:
    """The request's ``chat_template_kwargs`` and prompt fields laid over the server defaults.

    ``reasoning_effort`` also sets ``enable_thinking`` unless the kwargs do; a null or
    ``"auto"`` value never overrides (vLLM ``merge_kwargs``).
    """
    kwargs = _object(request.get("chat_template_kwargs"), "chat_template_kwargs")
    effort = request.get("reasoning_effort")
    if effort is not None and effort not in _REASONING_EFFORTS:
        raise InvalidArgument(
            f"reasoning_effort must be one of {', '.join(sorted(_REASONING_EFFORTS))}",
            field="reasoning_effort",
        )
    fields: dict[str, Any] = {
        "add_generation_prompt": flags.add_generation_prompt,
        "continue_final_message": flags.continue_final_message,
        "documents": request.get("documents"),
        "reasoning_effort": effort,
    }
    if effort is not None and "enable_thinking" not in kwargs:
        fields["enable_thinking"] = effort != "none"
    merged = _merge(defaults, _merge(kwargs, fields))
    documents = _documents(merged.pop("documents", None))
    merged.pop("add_generation_prompt", None)
    merged.pop("continue_final_message", None)
    template = merged.pop("chat_template", None)
    return TemplateKwargs(merged, documents, template)


def request_tools(request: Mapping[str, Any], drop_when_none: bool) -> list[Any] | None:
    """The normalized tools; none with ``tool_choice: "none"`` when the server drops them."""
    tool_choice = request.get("tool_choice")
    check_tool_choice(tool_choice)
    tools = normalize_tools(request.get("tools"))
    if tool_choice == "none" and drop_when_none:
        return None
    return tools


def _unset(value: Any) -> bool:
    # vLLM merge_kwargs: None and "auto" never override a default.
    return value is None or (isinstance(value, str) and value == "auto")


def _merge(defaults: Mapping[str, Any], overrides: Mapping[str, Any]) -> dict[str, Any]:
    return {**defaults, **{k: v for k, v in overrides.items() if not _unset(v)}}


def _flag(request: Mapping[str, Any], name: str, default: bool) -> bool:
    value = request.get(name)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise InvalidArgument(f"{name} must be true or false, got {value!r}", field=name)
    return value


def _object(value: Any, name: str) -> Mapping[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping) or not all(isinstance(k, str) for k in value):
        raise InvalidArgument(f"{name} must be a JSON object", field=name)
    return value


def _documents(value: Any) -> list[dict[str, Any]] | None:
    if value is None:
        return None
    value = thaw(value)  # server defaults are stored frozen
    if not isinstance(value, list) or not all(isinstance(d, Mapping) for d in value):
        raise InvalidArgument(
            "documents must be a list of objects (with 'title' and 'text')", field="documents"
        )
    return [dict(d) for d in value]
