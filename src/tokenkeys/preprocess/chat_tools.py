"""Request tools and tool_choice, shaped as vLLM hands them to chat templates.

Matched against vLLM's ``ChatCompletionToolsParam`` and ``FunctionDefinition`` (0.33-era
``main``, ``vllm/entrypoints/openai/chat_completion/protocol.py`` and
``vllm/entrypoints/generate/base/protocol.py``): vLLM validates each tool with pydantic and
passes ``tool.model_dump()`` to the template, so the template sees every declared field of the
function (null when absent) and none of the unknown ones.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from tokenkeys.errors import InvalidArgument

_TOOL_CHOICES = frozenset({"none", "auto", "required"})


def optional(value: Any, kinds: type | tuple[type, ...], where: str) -> Any:
    """Return ``value`` if it is None or of ``kinds``; otherwise raise InvalidArgument."""
    if value is not None and not isinstance(value, kinds):
        raise InvalidArgument(f"{where} has the wrong type ({type(value).__name__})", field=where)
    return value


def normalize_tools(tools: Any) -> list[dict[str, Any]] | None:
    """Tools as vLLM dumps ``ChatCompletionToolsParam`` for the template.

    ``{"type": "function", "function": {"name", "description", "parameters"[, "strict"]
    [, "defer_loading"]}[, "defer_loading"]}``: description and parameters are always present
    (null when absent), unknown keys are dropped, a top-level ``defer_loading`` is copied into
    the function when the function has none.
    """
    if tools is None:
        return None
    if not isinstance(tools, list):
        raise InvalidArgument("tools must be a list of tools", field="tools")
    out = []
    for i, tool in enumerate(tools):
        where = f"tools[{i}]"
        if not isinstance(tool, Mapping):
            raise InvalidArgument(f"{where} must be an object", field=where)
        if tool.get("type", "function") != "function":
            raise InvalidArgument(
                f"{where}.type must be 'function', got {tool.get('type')!r}", field=where
            )
        function = tool.get("function")
        if not isinstance(function, Mapping) or not isinstance(function.get("name"), str):
            raise InvalidArgument(f"{where}.function.name must be a string", field=where)
        top_defer = optional(tool.get("defer_loading"), bool, f"{where}.defer_loading")
        dumped: dict[str, Any] = {
            "name": function["name"],
            "description": optional(function.get("description"), str, f"{where}.description"),
            "parameters": optional(function.get("parameters"), Mapping, f"{where}.parameters"),
        }
        strict = optional(function.get("strict"), bool, f"{where}.function.strict")
        defer = optional(function.get("defer_loading"), bool, f"{where}.function.defer_loading")
        if defer is None:
            defer = top_defer
        if strict is not None:
            dumped["strict"] = strict
        if defer is not None:
            dumped["defer_loading"] = defer
        entry: dict[str, Any] = {"type": "function", "function": copy.deepcopy(dumped)}
        if top_defer is not None:
            entry["defer_loading"] = top_defer
        out.append(entry)
    return out


def check_tool_choice(value: Any) -> None:
    """Refuse a ``tool_choice`` that is not one of OpenAI's forms (vLLM's pydantic union)."""
    if value is None or (isinstance(value, str) and value in _TOOL_CHOICES):
        return
    function = value.get("function") if isinstance(value, Mapping) else None
    if isinstance(function, Mapping) and isinstance(function.get("name"), str):
        return
    raise InvalidArgument(
        "tool_choice must be 'none', 'auto', 'required' or "
        '{"type": "function", "function": {"name": ...}}',
        field="tool_choice",
    )
