"""Chat rendering: our sandboxed renderer and prologue against transformers' own rendering.

Reference: transformers' ``apply_chat_template(tokenize=False)`` on the same template and
conversation, in the same process. Measured: the renderer alone (the same work as the
reference plus the render guard), and the whole prologue (request validation, vLLM message
normalization, kwargs filtering, freezing, then rendering), which is what /tokenize and
generation pay per chat request before encoding.
"""

from __future__ import annotations

import copy
from pathlib import Path

from timing import pct, sample, us

from tokenkeys.preprocess.chat import ChatPrologue
from tokenkeys.template.render import ChatTemplateRenderer

from conformance_data import data_path

ROOT = Path(__file__).resolve().parent.parent
QWEN = data_path("tokenizers", "qwen2.5-instruct")
SMOL = ROOT / "src" / "tokenkeys" / "data" / "smollm2-135m-instruct"

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Current weather of a city",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
            },
        },
    }
]


def _conversation(turns: int) -> list[dict]:
    messages = [{"role": "system", "content": "You are a helpful assistant. 你好 🎉"}]
    for i in range(turns):
        messages.append({"role": "user", "content": f"Question {i}: what is the weather like?"})
        messages.append({"role": "assistant", "content": f"Answer {i}: sunny, 21°C, light wind."})
    messages.append({"role": "user", "content": "And tomorrow?"})
    return messages


def _case(folder: Path, turns: int, tools: list | None, n: int) -> list[str]:
    import transformers

    tok = transformers.PreTrainedTokenizerFast.from_pretrained(str(folder), local_files_only=True)
    messages = _conversation(turns)
    renderer = ChatTemplateRenderer(tok.chat_template)
    prologue = ChatPrologue({"default": tok.chat_template}, tok.special_tokens_map)
    request = {"messages": messages, "tools": tools}

    def theirs() -> object:
        return tok.apply_chat_template(
            copy.deepcopy(messages), tools=tools, tokenize=False, add_generation_prompt=True
        )

    def ours() -> object:
        return renderer.render(
            messages, tools=tools, add_generation_prompt=True, special_tokens=tok.special_tokens_map
        )

    def whole() -> object:
        return prologue.render(prologue.prepare(request))

    assert ours() == theirs()
    ref, mine, full = sample(theirs, n), sample(ours, n), sample(whole, n)
    label = f"{folder.name}, {2 * turns + 2} messages" + (", tools" if tools else "")
    return [
        f"| {label} | {us(pct(ref, 50))} | {us(pct(mine, 50))} | "
        f"{pct(ref, 50) / pct(mine, 50):.2f}× | {us(pct(full, 50))} | {us(pct(full, 99))} |"
    ]


def run(quick: bool) -> str:
    """Render timings as a Markdown section."""
    n = 50 if quick else 400
    rows: list[str] = []
    rows += _case(SMOL, 2, None, n)
    rows += _case(SMOL, 32, None, n)
    rows += _case(QWEN, 2, TOOLS, n)
    rows += _case(QWEN, 32, TOOLS, n)
    return "\n".join(
        [
            "## Chat template rendering",
            "",
            "transformers' `apply_chat_template(tokenize=False)` is the reference (same template, "
            "same conversation, same process). *Speed* is reference time / renderer time (> 1 "
            "means faster than transformers). *Prologue* is the whole per-request chat path "
            "(validation, vLLM normalization, rendering).",
            "",
            "| case | transformers p50 | renderer p50 | speed | prologue p50 | prologue p99 |",
            "|---|---|---|---|---|---|",
            *rows,
        ]
    )
