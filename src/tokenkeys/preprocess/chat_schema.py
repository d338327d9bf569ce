"""The chat request shapes vLLM 0.32 refuses before rendering, refused here the same way (400).

vLLM validates a chat body with pydantic before anything is rendered
(``vllm/entrypoints/openai/chat_completion/protocol.py`` ``ChatCompletionRequest`` and its
``check_tool_usage`` validator; messages are ``vllm/renderers/chat_utils.py``
``ChatCompletionMessageParam``, the union of OpenAI's message types and vLLM's
``CustomChatCompletionMessageParam``). tokenkeys renders leniently, so without these checks
/tokenize would report a count for a request generation on vLLM refuses. The rules, read from
that union (a message is accepted when one of its members accepts it; the custom member is the
most lenient, so its rules are the ones that refuse):

- a message is an object with a string ``role``;
- ``content``, when present, is a string or a list of parts (each a string or an object), or
  null on an assistant or function message (OpenAI's members make it optional there only);
- ``name`` and ``task`` are strings, ``tool_call_id`` and ``reasoning`` strings or null;
- ``tool_calls`` is null or a list of OpenAI tool calls: ``{"id": str, "type": "function",
  "function": {"name": str, "arguments": str}}`` (arguments as a JSON *string*, not an object);
  on an assistant message a custom tool call ``{"id", "type": "custom", "custom": {"name",
  "input"}}`` is accepted too;
- ``tools: []`` is refused, a ``tool_choice`` other than none needs ``tools``, and a named
  tool choice must name one of them (``check_tool_usage``).

Messages are checked in order and the first problem is reported with its path.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tokenkeys.errors import InvalidArgument, vllm_invalid

# Roles whose OpenAI message type allows null content.
_NULL_CONTENT_ROLES = frozenset({"assistant", "function"})


def _string(message: Mapping[str, Any], key: str, where: str, *, nullable: bool) -> None:
    if key not in message:
        return
    value = message[key]
    if isinstance(value, str) or (nullable and value is None):
        return
    wanted = "a string or null" if nullable else "a string"
    raise InvalidArgument(
        f"{where}.{key} must be {wanted}, got {_kind(value)}", field=f"{where}.{key}"
    )


def _kind(value: Any) -> str:
    return "null" if value is None else type(value).__name__


def _check_call(call: Any, where: str, role: str) -> None:
    if not isinstance(call, Mapping):
        raise InvalidArgument(f"{where} must be an object, got {_kind(call)}", field=where)
    if not isinstance(call.get("id"), str):
        raise InvalidArgument(f"{where}.id must be a string", field=f"{where}.id")
    kind = call.get("type")
    if kind == "custom" and role == "assistant":
        custom = call.get("custom")
        if not isinstance(custom, Mapping) or not all(
            isinstance(custom.get(k), str) for k in ("name", "input")
        ):
            raise InvalidArgument(
                f"{where}.custom must be an object with string name and input",
                field=f"{where}.custom",
            )
        return
    if kind != "function":
        raise InvalidArgument(
            f"{where}.type must be 'function', got {kind!r}", field=f"{where}.type"
        )
    function = call.get("function")
    if not isinstance(function, Mapping):
        raise InvalidArgument(
            f"{where}.function must be an object with name and arguments",
            field=f"{where}.function",
        )
    if not isinstance(function.get("name"), str):
        raise InvalidArgument(
            f"{where}.function.name must be a string", field=f"{where}.function.name"
        )
    arguments = function.get("arguments")
    if not isinstance(arguments, str):
        raise InvalidArgument(
            f"{where}.function.arguments must be a string (the arguments as JSON text, as "
            f"OpenAI and vLLM take them), got {_kind(arguments)}",
            field=f"{where}.function.arguments",
        )


def check_message(message: Any, where: str) -> None:
    """Refuse one message vLLM 0.32's message union refuses (see the module docstring)."""
    if not isinstance(message, Mapping):
        raise InvalidArgument(f"{where} must be an object, got {_kind(message)}", field=where)
    role = message.get("role")
    if not isinstance(role, str):
        raise InvalidArgument(f"{where}.role must be a string", field=f"{where}.role")
    if "content" in message:
        content = message["content"]
        if content is None:
            if role not in _NULL_CONTENT_ROLES:
                raise InvalidArgument(
                    f"{where}.content may be null only on an assistant message; send a string "
                    "or a list of content parts",
                    field=f"{where}.content",
                )
        elif isinstance(content, list):
            for j, part in enumerate(content):
                if not isinstance(part, (str, Mapping)):
                    raise InvalidArgument(
                        f"{where}.content[{j}] must be a string or an object, got {_kind(part)}",
                        field=f"{where}.content[{j}]",
                    )
        elif not isinstance(content, str):
            raise InvalidArgument(
                f"{where}.content must be a string or a list of content parts, got "
                f"{_kind(content)}",
                field=f"{where}.content",
            )
    for key in ("name", "task"):
        _string(message, key, where, nullable=key == "task")
    for key in ("tool_call_id", "reasoning", "reasoning_content"):
        _string(message, key, where, nullable=True)
    calls = message.get("tool_calls")
    if calls is not None:
        if not isinstance(calls, list):
            raise InvalidArgument(
                f"{where}.tool_calls must be a list of tool calls, got {_kind(calls)}",
                field=f"{where}.tool_calls",
            )
        for k, call in enumerate(calls):
            _check_call(call, f"{where}.tool_calls[{k}]", role)


def check_messages(messages: Any) -> None:
    """Refuse messages vLLM 0.32 refuses: a list whose every message passes ``check_message``.

    An empty list is accepted, as vLLM accepts it (the template renders what it renders).
    """
    if not isinstance(messages, list):
        raise InvalidArgument(
            f"messages must be a list of messages, got {_kind(messages)}", field="messages"
        )
    for i, message in enumerate(messages):
        check_message(message, f"messages[{i}]")


def check_tool_usage(request: Mapping[str, Any]) -> None:
    """vLLM 0.32 ``ChatCompletionRequest.check_tool_usage``, with its messages and params."""
    tools = request.get("tools")
    if tools == []:
        raise vllm_invalid(
            "`tools` must not be an empty array. Either provide at least one tool or omit "
            "the field entirely.",
            "tools",
        )
    choice = request.get("tool_choice")
    if choice is None or choice == "none":
        return
    if tools is None:
        raise vllm_invalid("When using `tool_choice`, `tools` must be set.", "tool_choice")
    if not isinstance(choice, Mapping):
        return  # "auto" and "required"; other strings are refused by check_tool_choice
    function = choice.get("function")
    name = function.get("name") if isinstance(function, Mapping) else None
    if isinstance(name, str) and isinstance(tools, list):
        names = [
            t["function"].get("name")
            for t in tools
            if isinstance(t, Mapping) and isinstance(t.get("function"), Mapping)
        ]
        if name not in names:
            raise InvalidArgument(
                "The tool specified in `tool_choice` does not match any of the specified `tools`",
                field="tool_choice",
            )


def check_chat_request(request: Mapping[str, Any]) -> None:
    """Every check of this module on a chat request: its messages, then its tool usage."""
    check_messages(request.get("messages"))
    check_tool_usage(request)
