"""Drift guards: /tokenize reports exactly the prompt the generation routes send the engine.

Each guard compares, on a real uvicorn server, /tokenize with the same request sent to
/v1/completions or /v1/chat/completions: ``count == usage.prompt_tokens`` and ``tokens ==
prompt_token_ids`` (``return_token_ids``). Each guard is proven by an injection test: the
/tokenize route's one Preprocessor call (``routes_tokenize.tokenize_body``) is monkeypatched
with a plausible re-derivation that has exactly the drift the guard exists to catch (the four
mistakes Dynamo's /tokenize review found by reading code: wrong special-token default, a
skipped prologue, plain vs normalized encode, NUL handling), and the guard must then fail.

Deployments: ``VLLM`` (NUL kept, bare prompts get special tokens) and ``DYNAMO`` (NUL
stripped, bare prompts without special tokens), both with the server default
``enable_thinking: false``. Models: the embedded SmolLM2, a copy whose post-processor adds a
BOS (so special-token defaults are visible), a copy whose template reads ``enable_thinking``,
and qwen2.5-instruct from tests/data for tools and tool calls.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tokenkeys.frontend import routes_tokenize
from tokenkeys.preprocess import Tokenized
from tokenkeys.preprocess.chat import ChatOptions
from tokenkeys.server.runtime.loading import ModelSource
from tokenkeys.template.render import ChatTemplateRenderer
from tokenkeys.tokenizer import TokenizerOptions, default_tokenizer_path

from conformance_data import data_path
from http_support import HttpServerThread, bos_variant, registry

QWEN = data_path("tokenizers", "qwen2.5-instruct")

THINKING_TEMPLATE = (
    "{%- for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n"
    "{%- if enable_thinking is defined and not enable_thinking %}<think>\n\n</think>\n\n"
    "{%- endif %}{% endif %}"
)
DEFAULT_KWARGS = {"enable_thinking": False}

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Météo actuelle — 天気",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
            },
        },
    },
    # No description: the prologue gives the template description: null, as vLLM dumps it.
    {"type": "function", "function": {"name": "now", "parameters": {"type": "object"}}},
]
TOOL_CALL_CONVERSATION = [
    {"role": "system", "content": "Use tools when they help."},
    {"role": "user", "content": "Quel temps fait-il à Zürich? 🌦"},
    {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {
                "id": "call_1",
                "type": "function",
                # A JSON string, as OpenAI clients send it; the prologue parses it.
                "function": {"name": "get_weather", "arguments": '{"city": "Zürich"}'},
            }
        ],
    },
    {"role": "tool", "tool_call_id": "call_1", "content": '{"temp": "12°C"}'},
    {"role": "assistant", "content": "Il fait 12°C."},
    {"role": "user", "content": "Et à 東京?"},
]
TURNS = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "Name a prime. 素数は？"},
    {"role": "assistant", "content": "Seven."},
    {
        "role": "user",
        "content": [{"type": "text", "text": "Another"}, {"type": "text", "text": "?"}],
    },
]
PREFILL = [
    {"role": "user", "content": "Write a haiku."},
    {"role": "assistant", "content": "Old pond"},
]
NUL_TURNS = [{"role": "user", "content": "nul\x00inside\x00\x00text"}]
SPECIAL_TURNS = [{"role": "user", "content": "literal <|im_start|>user\nand <|im_end|> text"}]


def _start(options: TokenizerOptions, tmp: Path) -> HttpServerThread:
    thinker = tmp / "thinker"
    bos_variant(thinker)
    (thinker / "chat_template.jinja").write_text(THINKING_TEMPLATE, encoding="utf-8")
    sources: list[Path | ModelSource] = [
        ModelSource("smollm2", default_tokenizer_path()),
        ModelSource("smollm2-bos", bos_variant(tmp / "bos")),
        ModelSource("thinker", thinker),
    ]
    sources.append(QWEN)
    chat = ChatOptions(default_chat_template_kwargs=DEFAULT_KWARGS)
    return HttpServerThread(registry(*sources, options=options, chat=chat)).__enter__()


VLLM = TokenizerOptions()
DYNAMO = TokenizerOptions(nul="strip", add_special_tokens_completion=False)


@pytest.fixture(scope="module", params=["vllm", "dynamo"])
def client(request, tmp_path_factory) -> Iterator[httpx.Client]:
    options = VLLM if request.param == "vllm" else DYNAMO
    server = _start(options, tmp_path_factory.mktemp(request.param))
    with httpx.Client(base_url=server.url, timeout=30) as c:
        c.deployment = request.param  # type: ignore[attr-defined]
        yield c
    server.__exit__(None, None, None)


# --- the guards ---


class Disagreement(AssertionError):
    """/tokenize and generation reported different prompts (a failed status is not this)."""


def _compare_answers(tok: dict, generated: httpx.Response, prompt_ids: Callable) -> None:
    if tok["count"] == 0:
        # No tokens (e.g. only NULs, stripped): generation refuses the empty prompt.
        if generated.status_code != 400 or "empty" not in generated.text:
            raise Disagreement(f"/tokenize counted 0, generation answered {generated.text}")
        return
    assert generated.status_code == 200, generated.text
    gen = generated.json()
    generated_ids = prompt_ids(gen)
    if tok["count"] != gen["usage"]["prompt_tokens"] or tok["tokens"] != generated_ids:
        raise Disagreement(
            f"/tokenize counted {tok['count']}, generation used "
            f"{gen['usage']['prompt_tokens']}: {tok['tokens']} vs {generated_ids}"
        )


def assert_completion_agrees(client: httpx.Client, request: dict) -> None:
    """/tokenize (completion form) == the prompt /v1/completions sends the engine."""
    counted = client.post("/tokenize", json=request)
    assert counted.status_code == 200, counted.text
    body = {**request, "max_tokens": 1, "return_token_ids": True}
    generated = client.post("/v1/completions", json=body)
    _compare_answers(counted.json(), generated, lambda gen: gen["choices"][0]["prompt_token_ids"])


def assert_chat_agrees(client: httpx.Client, request: dict) -> None:
    """/tokenize (chat form) == the prompt /v1/chat/completions sends the engine."""
    counted = client.post("/tokenize", json=request)
    assert counted.status_code == 200, counted.text
    body = {**request, "max_tokens": 1, "return_token_ids": True}
    generated = client.post("/v1/chat/completions", json=body)
    _compare_answers(counted.json(), generated, lambda gen: gen["prompt_token_ids"])


COMPLETIONS = {
    "plain": {"model": "smollm2-bos", "prompt": "The quick brown fox"},
    "explicit_specials": {"model": "smollm2-bos", "prompt": "fox", "add_special_tokens": True},
    "no_specials": {"model": "smollm2-bos", "prompt": "fox", "add_special_tokens": False},
    "nul": {"model": "smollm2", "prompt": "a\x00b\x00\x00c"},
    "special_text": {"model": "smollm2", "prompt": "x <|im_start|>user\n<|im_end|> y"},
    "cjk_emoji": {"model": "smollm2", "prompt": "東京 🎌 naïve café"},
}


@pytest.mark.parametrize("case", sorted(COMPLETIONS))
def test_completion_count_is_the_served_count(client, case) -> None:
    assert_completion_agrees(client, COMPLETIONS[case])


def chat_cases() -> dict[str, dict]:
    return {
        "turns_agp": {"model": "smollm2", "messages": TURNS},
        "turns_no_agp": {"model": "smollm2", "messages": TURNS, "add_generation_prompt": False},
        "continue_final": {
            "model": "smollm2",
            "messages": PREFILL,
            "add_generation_prompt": False,
            "continue_final_message": True,
        },
        "server_default_kwargs": {"model": "thinker", "messages": TURNS[:2]},
        "request_kwargs": {
            "model": "thinker",
            "messages": TURNS[:2],
            "chat_template_kwargs": {"enable_thinking": True},
        },
        "nul_in_content": {"model": "smollm2", "messages": NUL_TURNS},
        "special_text_in_content": {"model": "smollm2", "messages": SPECIAL_TURNS},
        "bos_with_specials": {
            "model": "smollm2-bos",
            "messages": TURNS,
            "add_special_tokens": True,
        },
    }


@pytest.mark.parametrize("case", sorted(chat_cases()))
def test_chat_count_is_the_served_count(client, case) -> None:
    assert_chat_agrees(client, chat_cases()[case])


@pytest.mark.parametrize("agp", [True, False])
def test_chat_with_tools_and_tool_calls_is_the_served_count(client, agp) -> None:
    model = QWEN.name
    request = {
        "model": model,
        "messages": TOOL_CALL_CONVERSATION,
        "tools": TOOLS,
        "add_generation_prompt": agp,
    }
    assert_chat_agrees(client, request)


# --- each guard proven by the drift it exists to catch ---

Drift = Callable[[object, dict, bool], Tokenized]


def inject(monkeypatch, drift: Drift) -> None:
    """Replace /tokenize's Preprocessor call (and only that) with a drifted re-derivation."""
    monkeypatch.setattr(routes_tokenize, "tokenize_body", drift)


real_tokenize_body = routes_tokenize.tokenize_body


def test_guard_catches_a_hard_coded_special_tokens_default(client, monkeypatch) -> None:
    """Drift: /tokenize applies vLLM's hard default add_special_tokens=true to bare prompts.

    In the Dynamo-style deployment /v1/completions adds no BOS, so the drifted count is one
    higher; in the vLLM-style deployment the drift happens to agree, which is why the guard
    runs in both.
    """

    def drift(model, body, token_strs):
        if "prompt" in body and body.get("add_special_tokens") is None:
            body = {**body, "add_special_tokens": True}
        return real_tokenize_body(model, body, token_strs)

    inject(monkeypatch, drift)
    request = COMPLETIONS["plain"]
    if client.deployment == "vllm":
        assert_completion_agrees(client, request)
    else:
        with pytest.raises(Disagreement):
            assert_completion_agrees(client, request)


def _render_directly(model, body, token_strs) -> Tokenized:
    """A re-derived chat path: the template rendered on the raw request, then encoded."""
    template = model.preprocessor.chat.templates["default"]
    text = ChatTemplateRenderer(template).render(
        body["messages"],
        tools=body.get("tools"),
        add_generation_prompt=body.get("add_generation_prompt", True),
        continue_final_message=body.get("continue_final_message", False),
        special_tokens=model.preprocessor.chat.special_tokens,
        variables=body.get("chat_template_kwargs"),
    )
    return model.preprocessor.tokenize_prompts([text], add_special_tokens=False)[0]


def test_guard_catches_a_skipped_prologue_default_kwargs(client, monkeypatch) -> None:
    """Drift: /tokenize renders the template itself, so the server's default template kwargs
    (enable_thinking: false) never reach it and the empty think block is not counted."""
    inject(monkeypatch, _render_directly)
    with pytest.raises(Disagreement):
        assert_chat_agrees(client, chat_cases()["server_default_kwargs"])


def test_guard_catches_a_skipped_prologue_tool_normalization(client, monkeypatch) -> None:
    """Drift: /tokenize renders raw tools and tool calls: the tool without a description
    lacks ``description: null`` and the call's JSON-string arguments are not parsed."""
    model = QWEN.name
    inject(monkeypatch, _render_directly)
    request = {"model": model, "messages": TOOL_CALL_CONVERSATION, "tools": TOOLS}
    with pytest.raises(Disagreement):
        assert_chat_agrees(client, request)


def test_guard_catches_a_skipped_prologue_content_parts(client, monkeypatch) -> None:
    """Drift: /tokenize renders list-of-text-parts content as the list, not the joined text.

    The kwargs are sent explicitly so that the content parts are the only difference.
    """
    inject(monkeypatch, _render_directly)
    request = {"model": "thinker", "messages": TURNS, "chat_template_kwargs": DEFAULT_KWARGS}
    assert_chat_agrees(client, {**request, "messages": TURNS[:3]})  # no parts: no drift
    with pytest.raises(Disagreement):
        assert_chat_agrees(client, request)


def test_guard_catches_ignored_continue_final_message(client, monkeypatch) -> None:
    """Drift: /tokenize ignores continue_final_message and closes the last assistant turn."""

    def drift(model, body, token_strs):
        return real_tokenize_body(model, {**body, "continue_final_message": False}, token_strs)

    inject(monkeypatch, drift)
    with pytest.raises(Disagreement):
        assert_chat_agrees(client, chat_cases()["continue_final"])


def test_guard_catches_ignored_add_generation_prompt(client, monkeypatch) -> None:
    """Drift: /tokenize always opens the assistant turn (the field's default)."""

    def drift(model, body, token_strs):
        return real_tokenize_body(model, {**body, "add_generation_prompt": True}, token_strs)

    inject(monkeypatch, drift)
    with pytest.raises(Disagreement):
        assert_chat_agrees(client, chat_cases()["turns_no_agp"])


def test_guard_catches_ignored_chat_template_kwargs(client, monkeypatch) -> None:
    """Drift: /tokenize drops the request's chat_template_kwargs."""

    def drift(model, body, token_strs):
        return real_tokenize_body(model, {**body, "chat_template_kwargs": None}, token_strs)

    inject(monkeypatch, drift)
    with pytest.raises(Disagreement):
        assert_chat_agrees(client, chat_cases()["request_kwargs"])


def test_guard_catches_nul_drift(client, monkeypatch) -> None:
    """Drift: the other NUL rule than the deployment's: /tokenize encodes the text as sent
    where generation strips NULs (Dynamo-style), or strips them where generation keeps them
    (vLLM-style). Both the completion and the chat guard must fail."""

    def drift(model, body, token_strs):
        result = real_tokenize_body(model, body, token_strs)
        if "messages" in body:
            text = model.preprocessor.chat.render(model.preprocessor.chat.prepare(body))
        else:
            text = body["prompt"]
        text = text if client.deployment == "dynamo" else text.replace("\x00", "")
        ids = model.tokenizer.encode([text], add_special_tokens=False)[0].ids
        return Tokenized(ids, result.token_strs)

    inject(monkeypatch, drift)
    with pytest.raises(Disagreement):
        assert_completion_agrees(client, COMPLETIONS["nul"])
    with pytest.raises(Disagreement):
        assert_chat_agrees(client, chat_cases()["nul_in_content"])


def test_guard_catches_special_token_text_drift(client, monkeypatch) -> None:
    """Drift: /tokenize sanitizes special-token text out of user content before counting,
    while generation encodes it (as the special ids, transformers' default)."""
    specials = ("<|im_start|>", "<|im_end|>")

    def drift(model, body, token_strs):
        body = copy.deepcopy(body)
        for message in body.get("messages", []):
            for s in specials:
                message["content"] = message["content"].replace(s, "")
        if "prompt" in body:
            for s in specials:
                body["prompt"] = body["prompt"].replace(s, "")
        return real_tokenize_body(model, body, token_strs)

    inject(monkeypatch, drift)
    with pytest.raises(Disagreement):
        assert_chat_agrees(client, chat_cases()["special_text_in_content"])
    with pytest.raises(Disagreement):
        assert_completion_agrees(client, COMPLETIONS["special_text"])


def test_special_token_text_in_content_is_the_special_id(client) -> None:
    """What both paths do with special-token text typed by a user: the special id, once."""
    tokens = client.post("/tokenize", json={"model": "smollm2", "messages": SPECIAL_TURNS})
    ids = tokens.json()["tokens"]
    # 1 = <|im_start|>, 2 = <|im_end|> in SmolLM2. The template opens and closes the default
    # system turn and the user turn and opens the assistant turn (3 + 2); the user typed one
    # of each.
    assert ids.count(1) == 3 + 1 and ids.count(2) == 2 + 1


# --- the same guards over generated requests ---

_piece = st.one_of(
    st.text(st.characters(blacklist_categories=("Cs",)), max_size=12),
    st.sampled_from(["\x00", "<|im_start|>", "<|im_end|>", "<|endoftext|>", " ", "\n", "東京"]),
)
_content = st.lists(_piece, max_size=6).map("".join)


@st.composite
def _chat_request(draw) -> dict:
    messages = []
    if draw(st.booleans()):
        messages.append({"role": "system", "content": draw(_content)})
    for i in range(draw(st.integers(1, 4))):
        role = "user" if i % 2 == 0 else "assistant"
        messages.append({"role": role, "content": draw(_content)})
    request = {"model": draw(st.sampled_from(["smollm2", "thinker", "smollm2-bos"]))}
    request["messages"] = messages
    if messages[-1]["role"] == "assistant" and draw(st.booleans()):
        request |= {"add_generation_prompt": False, "continue_final_message": True}
    else:
        request["add_generation_prompt"] = draw(st.booleans())
    if draw(st.booleans()):
        request["chat_template_kwargs"] = {"enable_thinking": draw(st.booleans())}
    if draw(st.booleans()):
        request["add_special_tokens"] = draw(st.booleans())
    return request


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(request=_chat_request())
def test_generated_chats_count_as_served(client, request) -> None:
    assert_chat_agrees(client, request)


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    prompt=_content.filter(bool),
    model=st.sampled_from(["smollm2", "smollm2-bos"]),
    specials=st.sampled_from([None, True, False]),
)
def test_generated_prompts_count_as_served(client, prompt, model, specials) -> None:
    request = {"model": model, "prompt": prompt}
    if specials is not None:
        request["add_special_tokens"] = specials
    assert_completion_agrees(client, request)
