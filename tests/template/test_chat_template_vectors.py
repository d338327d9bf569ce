"""Conformance: rendered text equals the expected output of tests/data/vectors/chat-templates.

The vectors (from huggingface.js, MIT) are 53 real templates with inputs and expected text, plus
one formatting case. 49 render byte-exact with the inputs as given. Four encode behaviour of the
JavaScript renderer that produced them, which differs from transformers by design; each is
checked under its documented condition rather than skipped:

- ``HuggingFaceTB/SmolLM3-3B`` calls ``strftime_now``: the clock is frozen at the vector's date
  (10 July 2025) through the renderer's injectable clock.
- ``MadeAgents/Hammer2.1`` renders ``tools|string``: Python prints a dict with single quotes,
  JavaScript as JSON. The output must equal the target once ``str(tools)`` is replaced with
  ``json.dumps(tools)``, and nothing else may differ.
- ``ai21labs/AI21-Jamba-Large-1.6`` sets ``add_generation_prompt`` only when it is undefined;
  transformers always defines it (False by default), the vector left it undefined. With
  ``add_generation_prompt=True`` the output equals the target; with the default, it equals the
  target minus the generation prompt.
- ``meetkai/functionary-medium-v2.2`` concatenates a ``content`` that is null in the vector;
  transformers 5 drops null-valued message keys first, so the template fails there (and here,
  with InvalidArgument), while the environment itself renders the raw input to the target.

The formatting case (``TEST_CUSTOM_FORMATTING``) has a template and a reformatted copy: both
must render the same text for the same conversation.
"""

from __future__ import annotations

import json
from datetime import datetime

import pytest

from tokenkeys.errors import InvalidArgument
from tokenkeys.template.render import ChatTemplateRenderer

from conformance_data import data_path

VECTORS = data_path("vectors", "chat-templates", "e2e_chat_template_cases.json")

DOCUMENTED = {
    "HuggingFaceTB/SmolLM3-3B",
    "MadeAgents/Hammer2.1",
    "ai21labs/AI21-Jamba-Large-1.6",
    "meetkai/functionary-medium-v2.2",
}


def _cases() -> list[tuple[str, str, dict]]:
    data = json.loads(VECTORS.read_text(encoding="utf-8"))
    return [
        (group, name, case)
        for group in ("TEST_DEFAULT_TEMPLATES", "TEST_CUSTOM_TEMPLATES")
        for name, case in data[group].items()
    ]


CASES = _cases()


def _split(case: dict) -> tuple[list, dict]:
    data = dict(case["data"])
    messages = data.pop("messages")
    args = {
        "tools": data.pop("tools", None),
        "documents": data.pop("documents", None),
        "add_generation_prompt": data.pop("add_generation_prompt", False),
        "variables": data,
    }
    return messages, args


@pytest.mark.parametrize(
    "name,case",
    [(n, c) for _, n, c in CASES if n not in DOCUMENTED],
    ids=[n for _, n, _ in CASES if n not in DOCUMENTED],
)
def test_vector_renders_exactly(name: str, case: dict) -> None:
    messages, args = _split(case)
    assert ChatTemplateRenderer(case["chat_template"]).render(messages, **args) == case["target"]


def _case(name: str) -> dict:
    return next(c for _, n, c in CASES if n == name)


def test_counts() -> None:
    # 53 rendering cases: 49 exact plus the 4 documented ones; a new vector must be classified.
    assert len(CASES) == 53
    assert len([n for _, n, _ in CASES if n not in DOCUMENTED]) == 49
    assert DOCUMENTED <= {n for _, n, _ in CASES}


def test_smollm3_date_with_frozen_clock() -> None:
    case = _case("HuggingFaceTB/SmolLM3-3B")
    messages, args = _split(case)
    frozen = ChatTemplateRenderer(case["chat_template"], clock=lambda: datetime(2025, 7, 10))
    assert frozen.render(messages, **args) == case["target"]
    other = ChatTemplateRenderer(case["chat_template"], clock=lambda: datetime(2031, 1, 2))
    assert "Today Date: 02 January 2031" in other.render(messages, **args)


def test_hammer_python_dict_rendering() -> None:
    case = _case("MadeAgents/Hammer2.1")
    messages, args = _split(case)
    out = ChatTemplateRenderer(case["chat_template"]).render(messages, **args)
    tools = args["tools"]
    assert str(tools) in out and out != case["target"]
    assert out.replace(str(tools), json.dumps(tools)) == case["target"]


def test_jamba_add_generation_prompt_always_defined() -> None:
    case = _case("ai21labs/AI21-Jamba-Large-1.6")
    messages, args = _split(case)
    renderer = ChatTemplateRenderer(case["chat_template"])
    assert renderer.render(messages, **{**args, "add_generation_prompt": True}) == case["target"]
    default = renderer.render(messages, **args)
    assert case["target"].startswith(default)
    assert case["target"][len(default) :] == "<|bom|><|assistant|>"


def test_functionary_null_content() -> None:
    case = _case("meetkai/functionary-medium-v2.2")
    messages, args = _split(case)
    renderer = ChatTemplateRenderer(case["chat_template"])
    with pytest.raises(InvalidArgument, match="undefined"):
        renderer.render(messages, **args)
    raw = {**args.pop("variables"), **args, "messages": messages}
    assert renderer.render_raw(raw) == case["target"]


def test_formatting_case_renders_the_same() -> None:
    data = json.loads(VECTORS.read_text(encoding="utf-8"))["TEST_CUSTOM_FORMATTING"]
    assert len(data) == 1
    (case,) = data.values()
    messages = [
        {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What is this?"}]},
        {"role": "assistant", "content": [{"type": "text", "text": "A cat on a mat."}]},
        {"role": "user", "content": [{"type": "text", "text": "Sure? "}, {"type": "image"}]},
    ]
    for agp in (False, True):
        original = ChatTemplateRenderer(case["chat_template"]).render(
            messages, add_generation_prompt=agp
        )
        formatted = ChatTemplateRenderer(case["target"]).render(messages, add_generation_prompt=agp)
        assert original == formatted
        assert original.startswith("<|im_start|>User:<image>What is this?<end_of_utterance>\n")
