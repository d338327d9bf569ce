"""Acceptance (issue 22): tokenkeys' render routes answer what ``vllm launch render`` answers.

A real vLLM 0.32.0 render server (``vllm_render.VllmRenderServer``) serves the tiny model's
folder; a tokenizer-only ``tokenkeys serve`` serves the same tokenizer files under the same name
and context length. Every request goes to both; the answers must be equal (status and body)
except for the request ids, which are random on both sides: the text corpus (both
``add_special_tokens``, one prompt and batched), the chat corpus (tools, multi-part content,
``add_generation_prompt``, ``continue_final_message``, ``chat_template_kwargs``, token-in chat),
sampling options with vLLM's defaults and its serialization, and vLLM's refusals in its words.
A second pair serves a copy of the model whose generation_config.json sets sampling defaults.

An image part for this text-only model is vLLM's 400 on both; image renders of a VLM are
compared in ``test_vllm_images.py``. The derender routes are compared in
``test_vllm_derender.py``; ``tokenkeys parity`` certifies every built-in shape here too.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import anthropic_corpus
import derender_cases
import httpx
import pytest
import render_cases

from chat_fixtures import CONVERSATIONS, TOOL_CONVERSATION, TOOLS, openai_form
from served_pair import SERVE_ARGS, Pair, TokenkeysServe, ok
from support import run_cli
from text_corpus import all_strings
from vllm_render import VllmRenderServer
from vllm_server import MAX_MODEL_LEN, MODEL_NAME, ForkServer, TinyModel

pytestmark = pytest.mark.realengine

#: tokenkeys serve with no engine: the drop-in for ``vllm launch render``.
TOKENIZER_ONLY = ("--engine", "none")
USER = [{"role": "user", "content": "Bonjour! 東京 🎌"}]


def _start(
    python: Path,
    fork_server: ForkServer | None,
    model: TinyModel,
    log_dir: Path,
    serve: tuple[str, ...],
    label: str,
):
    vllm = VllmRenderServer(python, model, log_dir, label, fork_server)
    ours = TokenkeysServe(*serve, *TOKENIZER_ONLY)
    try:
        vllm.wait_healthy()
        ours.wait_healthy()
    except BaseException:
        vllm.stop()
        ours.stop()
        raise
    return vllm, ours


@pytest.fixture(scope="module")
def render_pair(
    vllm_python: Path,
    vllm_fork_server: ForkServer | None,
    tiny_model: TinyModel,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Pair]:
    """``vllm launch render`` and tokenizer-only ``tokenkeys serve`` on the same files."""
    log_dir = tmp_path_factory.mktemp("render-logs")
    vllm, ours = _start(vllm_python, vllm_fork_server, tiny_model, log_dir, SERVE_ARGS, "render")
    try:
        with (
            httpx.Client(base_url=vllm.url, timeout=120) as engine,
            httpx.Client(base_url=ours.url, timeout=120) as client,
        ):
            yield Pair(engine, client)
    finally:
        vllm.stop()
        ours.stop()


def _strip_ids(answer: object) -> object:
    """An answer without its request ids (random on both sides)."""
    if isinstance(answer, list):
        return [_strip_ids(a) for a in answer]
    if isinstance(answer, dict):
        return {k: v for k, v in answer.items() if k != "request_id"}
    return answer


def assert_same(pair: Pair, path: str, body: dict) -> httpx.Response:
    """The same status and the same body (request ids aside) from both servers."""
    theirs, ours = pair.both(path, body)
    want, got = _strip_ids(theirs.json()), _strip_ids(ours.json())
    assert (ours.status_code, got) == (theirs.status_code, want), json.dumps(body)[:300]
    return theirs


def test_completion_render_equals_vllm_over_the_text_corpus(render_pair) -> None:
    texts = [t for t in all_strings() if t]  # an empty prompt is a refusal, tested below
    for special in (True, False):
        for text in texts:
            assert_same(
                render_pair,
                "/v1/completions/render",
                {"prompt": text, "add_special_tokens": special},
            )
        # Batched: one answer per prompt, ids suffixed -0, -1, ...
        theirs = assert_same(
            render_pair,
            "/v1/completions/render",
            {"prompt": texts[:20], "add_special_tokens": special, "max_tokens": 7},
        )
        assert len(theirs.json()) == 20


# (label, chat fields) of every conversation form compared.
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
                # vLLM's render server without a tool parser refuses the default "auto";
                # "none" still renders the tools (the refusal is compared below).
                "tool_choice": "none",
                "add_generation_prompt": agp,
            },
        )
        for agp in (True, False)
    ],
    (
        "multi-part",
        {"messages": [{"role": "user", "content": [{"type": "text", "text": "Bonjour,"}]}]},
    ),
    (
        "continue-final",
        {
            "messages": CONVERSATIONS["no_system"][:2],
            "add_generation_prompt": False,
            "continue_final_message": True,
        },
    ),
    ("kwargs", {"messages": USER, "chat_template_kwargs": {"enable_thinking": False}}),
    ("specials", {"messages": CONVERSATIONS["no_system"], "add_special_tokens": True}),
    ("token-in", {"messages": USER, "kv_transfer_params": {"prompt_token_ids": [1, 2, 3]}}),
]


@pytest.mark.parametrize(("label", "fields"), CHATS, ids=[c[0] for c in CHATS])
def test_chat_render_equals_vllm(render_pair, label: str, fields: dict) -> None:
    assert_same(render_pair, "/v1/chat/completions/render", fields)
    assert_same(render_pair, "/v1/chat/completions/render", {**fields, "stream": True})


# Sampling options: vLLM's defaults, its clamps and resets, its serialization (which fields are
# omitted at their defaults, which always appear, floats from integers).
OPTIONS: list[dict] = [
    {},
    {"temperature": 0, "max_tokens": 5, "seed": 3, "stop": ["x"], "stream": True},
    {"temperature": 0.5, "top_p": 0.9, "top_k": 5, "stop_token_ids": [5, 5, 2], "n": 2},
    {"logit_bias": {"3": 200, "04": -3}, "cache_salt": "abc", "ignore_eos": True},
    {"temperature": 1, "top_p": 1, "presence_penalty": 0, "seed": -1, "min_p": 0.1},
    {"vllm_xargs": {"a": 1}, "kv_transfer_params": {"x": 1}, "priority": 5},
    {"temperature": 0.001, "min_tokens": 3, "bad_words": ["a", "a"], "stop": "abc"},
    {"include_stop_str_in_output": True, "stop": ["abcd"], "skip_special_tokens": False},
    {"spaces_between_special_tokens": False, "stream": True, "stream_options": {}},
    {"stream": True, "stream_options": {"include_usage": True}, "repetition_penalty": 1.2},
    {"max_tokens": 16, "frequency_penalty": -1.5, "allowed_token_ids": [1, 2]},
    {"max_tokens": 4000},
    {"max_tokens": 17, "stream_interval": 2, "routed_experts_prompt_start": 3},
]
COMPLETION_ONLY: list[dict] = [
    {"logprobs": 3, "echo": True},
    {"echo": True, "max_tokens": 0},
    {"prompt_logprobs": 2},
]
CHAT_ONLY: list[dict] = [
    {"logprobs": True},
    {"logprobs": True, "top_logprobs": 4, "echo": True},
    {"max_completion_tokens": 9, "max_tokens": 20},
]


@pytest.mark.parametrize("options", OPTIONS + COMPLETION_ONLY, ids=str)
def test_completion_sampling_params_equal_vllm(render_pair, options: dict) -> None:
    assert_same(render_pair, "/v1/completions/render", {"prompt": "Hello world", **options})


@pytest.mark.parametrize("options", OPTIONS + CHAT_ONLY, ids=str)
def test_chat_sampling_params_equal_vllm(render_pair, options: dict) -> None:
    assert_same(render_pair, "/v1/chat/completions/render", {"messages": USER, **options})


LONG_TEXT = " ".join(["hello"] * (MAX_MODEL_LEN + 4))
# Refusals: the same status, type, param and message as vLLM's.
REFUSED: list[tuple[str, dict]] = [
    ("/v1/completions/render", {"model": "nope", "prompt": "hi"}),
    ("/v1/completions/render", {"prompt": ""}),
    ("/v1/completions/render", {"prompt": [[1, 2], [3]], "max_tokens": MAX_MODEL_LEN + 1}),
    ("/v1/completions/render", {"prompt": [5] * MAX_MODEL_LEN}),
    ("/v1/completions/render", {"prompt": [5] * (MAX_MODEL_LEN + 4)}),
    ("/v1/completions/render", {"prompt": LONG_TEXT}),
    ("/v1/completions/render", {"prompt": "hi", "max_tokens": 0}),
    ("/v1/completions/render", {"prompt": "hi", "use_beam_search": True}),
    ("/v1/chat/completions/render", {"messages": [{"role": "user", "content": LONG_TEXT}]}),
    (
        "/v1/chat/completions/render",
        {"messages": USER, "kv_transfer_params": {"prompt_token_ids": [5] * (MAX_MODEL_LEN + 4)}},
    ),
    ("/v1/chat/completions/render", {"messages": USER, "max_completion_tokens": 0}),
    ("/v1/chat/completions/render", {"messages": USER, "max_tokens": MAX_MODEL_LEN + 1}),
    ("/v1/chat/completions/render", {"messages": USER, "temperature": 3}),
    ("/v1/chat/completions/render", {"messages": USER, "temperature": -1}),
    ("/v1/chat/completions/render", {"messages": USER, "top_p": 0}),
    ("/v1/chat/completions/render", {"messages": USER, "top_k": -2}),
    ("/v1/chat/completions/render", {"messages": USER, "min_p": 2}),
    ("/v1/chat/completions/render", {"messages": USER, "presence_penalty": 5}),
    ("/v1/chat/completions/render", {"messages": USER, "repetition_penalty": 0}),
    ("/v1/chat/completions/render", {"messages": USER, "n": 0}),
    ("/v1/chat/completions/render", {"messages": USER, "temperature": 0, "n": 2}),
    ("/v1/chat/completions/render", {"messages": USER, "min_tokens": 50, "max_tokens": 10}),
    ("/v1/chat/completions/render", {"messages": USER, "stop": [""]}),
    ("/v1/chat/completions/render", {"messages": USER, "bad_words": [""]}),
    ("/v1/chat/completions/render", {"messages": USER, "logit_bias": {"x": 1}}),
    ("/v1/chat/completions/render", {"messages": USER, "cache_salt": ""}),
    ("/v1/chat/completions/render", {"messages": USER, "cache_salt": "a/b"}),
    ("/v1/chat/completions/render", {"messages": USER, "stream_options": {"include_usage": True}}),
    ("/v1/chat/completions/render", {"messages": USER, "top_logprobs": 3}),
    ("/v1/chat/completions/render", {"messages": USER, "tool_choice": "auto"}),
    ("/v1/chat/completions/render", {"messages": USER, "tools": TOOLS}),
    ("/v1/chat/completions/render", {"messages": USER, "tools": TOOLS, "tool_choice": "required"}),
    ("/v1/chat/completions/render", {"messages": USER, "tools": []}),
    ("/v1/chat/completions/render", {"messages": USER, "use_beam_search": True}),
]


@pytest.mark.parametrize(("path", "body"), REFUSED, ids=lambda v: str(v)[:60])
def test_refusals_equal_vllm(render_pair, path: str, body: dict) -> None:
    theirs = assert_same(render_pair, path, body)
    assert theirs.status_code in (400, 404)


def test_an_image_for_a_text_only_model_gets_vllms_400(render_pair) -> None:
    image = {"type": "image_url", "image_url": {"url": "http://127.0.0.1:9/x.png"}}
    body = {"messages": [{"role": "user", "content": [image]}]}
    theirs, ours = render_pair.both("/v1/chat/completions/render", body)
    assert theirs.status_code == ours.status_code == 400, (theirs.text, ours.text)
    # vLLM refuses before fetching the image: the tiny model is not multimodal.
    assert "is not a multimodal model" in theirs.text
    assert "is not a multimodal model" in ours.json()["error"]["message"]
    # As /tokenize answers the same request.
    tokenize = render_pair.ours.post("/tokenize", json={"model": "tiny", **body})
    assert tokenize.status_code == 400


# --- Anthropic Messages (issue 34): the render of vLLM's Messages-to-chat conversion ------------

MESSAGES = anthropic_corpus.messages_requests() + anthropic_corpus.tool_requests()


def test_messages_render_equals_vllm_over_the_corpus(render_pair) -> None:
    """128 + 8 requests (system forms, multi-turn, tool use and results, thinking blocks,
    inline system turns, stop sequences, thinking unset and disabled): the same answer, byte
    for byte but the request id, from ``vllm launch render`` and tokenkeys."""
    assert len(MESSAGES) >= 100
    for label, body in MESSAGES:
        theirs = assert_same(render_pair, "/v1/messages/render", body)
        assert theirs.status_code == 200, (label, theirs.text)
        assert assert_same(render_pair, "/v1/messages/render", {**body, "stream": True})


# Bad input: vLLM's status (the messages name the field on both sides, in each one's words).
MESSAGES_REFUSED: list[dict] = [
    {"max_tokens": 4, "messages": [{"role": "user", "content": [{"type": "bogus"}]}]},
    {"max_tokens": 0, "messages": [{"role": "user", "content": "hi"}]},
    {"max_tokens": 4, "messages": [{"role": "robot", "content": "hi"}]},
    {
        "max_tokens": 4,
        "messages": [{"role": "user", "content": "hi"}],
        "tool_choice": {"type": "tool"},
    },
    {
        "max_tokens": 2000,
        "messages": [{"role": "user", "content": "hi"}],
        "thinking": {"type": "enabled", "budget_tokens": 10},
    },
    {"max_tokens": 4, "messages": [{"role": "user", "content": "hi"}], "tools": [{"name": "f"}]},
    {"messages": [{"role": "user", "content": "hi"}]},
    {"model": "nope", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]},
    {
        "max_tokens": 4,
        "messages": [{"role": "user", "content": "hi"}],
        "tools": anthropic_corpus.TOOLS,
    },
]


@pytest.mark.parametrize("body", MESSAGES_REFUSED, ids=lambda v: str(v)[:60])
def test_messages_refusals_have_vllms_status(render_pair, body: dict) -> None:
    theirs, ours = render_pair.both("/v1/messages/render", body)
    assert theirs.status_code in (400, 404, 422), theirs.text
    assert ours.status_code == theirs.status_code, (ours.text, theirs.text)


# --- OpenAI Responses (issue 34) --------------------------------------------------------------


@pytest.mark.parametrize(
    ("label", "body"), anthropic_corpus.responses_requests(), ids=lambda v: str(v)[:40]
)
def test_responses_render_equals_vllm(render_pair, label: str, body: dict) -> None:
    if label == "bare-output-text":  # vLLM's schema refuses it: the status is compared
        theirs, ours = render_pair.both("/v1/responses/render", body)
        assert (ours.status_code, theirs.status_code) == (400, 400)
        return
    theirs = assert_same(render_pair, "/v1/responses/render", body)
    assert theirs.status_code == 200, theirs.text


def test_responses_render_refuses_previous_response_id_as_vllm(render_pair) -> None:
    theirs = assert_same(
        render_pair, "/v1/responses/render", {"input": "Hi", "previous_response_id": "resp_1"}
    )
    assert theirs.status_code == 400


def test_parity_certifies_every_built_in_shape_on_the_render_routes(render_pair) -> None:
    """``tokenkeys parity`` against ``vllm launch render``: every shape by its render route."""
    done = run_cli(
        "parity", "--engine", str(render_pair.engine.base_url), "--backend", "transformers5",
        "--json", "--timeout", "120", check=False,
    )  # fmt: skip
    report = json.loads(done.stdout)
    for shape in report["shapes"]:
        assert shape["status"] == "certified", shape
        assert shape["source"] == f"/v1/{RENDER_PATHS[shape['route']]}/render", shape
    assert done.returncode == 0, done.stderr


#: The render route of each parity route, under /v1/.
RENDER_PATHS = {
    "chat": "chat/completions",
    "completions": "completions",
    "messages": "messages",
    "responses": "responses",
}


@pytest.mark.parametrize("name", sorted(render_cases.CASES))
def test_vllms_render_tests_pass_on_both(render_pair, name: str) -> None:
    """vLLM's own render tests, assertions unchanged, hold for vLLM 0.32 and for tokenkeys."""
    for side, client in (("vllm", render_pair.engine), ("tokenkeys", render_pair.ours)):
        try:
            render_cases.CASES[name](client, MODEL_NAME)
        except AssertionError as failed:
            raise AssertionError(f"{side}: {failed}") from failed


# --- Derender (issue 34) ------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(derender_cases.CASES))
def test_vllms_derender_tests_pass_on_both(render_pair, name: str) -> None:
    """vLLM 0.32's own derender tests, assertions unchanged, hold for vLLM and for tokenkeys."""
    derender_cases.CASES[name](render_pair.engine, MODEL_NAME)
    derender_cases.CASES[name](render_pair.ours, MODEL_NAME)


#: Output texts derendered: the text corpus' first strings, special and added tokens, a split
#: multi-byte character, spaces at the edges.
DERENDERED = [
    *[t for t in all_strings() if t][:40],
    "Hi<repo_name>there<|im_end|>",
    "<|im_start|>assistant\nDone.<|im_end|><|endoftext|>",
    "  leading and trailing  ",
    "Hello ✅ world 日本語 🎌",
]


#: The texts also derendered as streams, one token per chunk.
STREAMED = DERENDERED[::5] + DERENDERED[-4:]


def _steady(answer: dict) -> dict:
    """An answer without its clock (``created``), which differs between any two calls."""
    if "chunk" in answer:
        return {**answer, "chunk": _steady(answer["chunk"])}
    return {k: v for k, v in answer.items() if k != "created"}


def _logprob(token: int, other: int) -> dict:
    """A sampled token's logprob entry with two candidates (itself and another)."""
    tops = [{"token_id": token, "logprob": -0.5, "rank": 1}, {"token_id": other, "logprob": -2}]
    return {"token_id": token, "logprob": -0.5, "rank": 1, "top_logprobs": tops}


def _output_ids(pair: Pair, text: str) -> list[int]:
    answer = pair.ours.post("/tokenize", json={"prompt": text, "add_special_tokens": False})
    return answer.json()["tokens"]


@pytest.mark.parametrize("skip", [True, False], ids=["skip", "keep"])
def test_derender_equals_vllm(render_pair, skip: bool) -> None:
    """Whole answers (chat and completions, seeded by the prompt or not, with output logprobs)
    and streams one token per chunk (each side carrying its own state, and each continuing the
    other's): the same answers and states, the clock aside."""
    prompt = ok(render_pair.ours.post("/v1/chat/completions/render", json={"messages": USER}))
    seed_ids = prompt["token_ids"]
    chat_request = {"messages": USER, "skip_special_tokens": skip, "return_token_ids": True}
    completion_request = {"prompt": "x", "skip_special_tokens": skip}
    for text in DERENDERED:
        ids = _output_ids(render_pair, text)
        if not ids:
            continue  # an answer without output ids is a 400 (vLLM's own test above)
        content = [_logprob(token, ids[0]) for token in ids]
        choice = {
            "index": 0,
            "token_ids": ids,
            "finish_reason": "length",
            "logprobs": {"content": content},
        }
        answer = {"request_id": "r1", "choices": [choice], "prompt_token_ids": seed_ids}
        for path, body in (
            ("/v1/chat/completions/derender", {"generate_response": answer}),
            (
                "/v1/chat/completions/derender",
                {"generate_response": answer, "chat_request": chat_request, "prompt_tokens": 9},
            ),
            (
                "/v1/completions/derender",
                {"generate_responses": [answer, answer], "completion_request": completion_request},
            ),
            (
                "/v1/completions/derender",
                {"generate_responses": [answer], "prompt_token_ids": [None]},
            ),
        ):
            theirs, ours = render_pair.both(path, body)
            assert theirs.status_code == 200, theirs.text
            assert _steady(ours.json()) == _steady(theirs.json()), (text, path)
        if text not in STREAMED:
            continue
        for path, original in (
            ("/v1/chat/completions/derender", {"chat_request": chat_request}),
            ("/v1/completions/derender", {"completion_request": completion_request}),
        ):
            state_v = state_t = None
            for n, token in enumerate(ids):
                last = n == len(ids) - 1
                chunk = {
                    "request_id": "r2",
                    "choices": [
                        {
                            "index": 0,
                            "token_ids": [token],
                            "finish_reason": "stop" if last else None,
                            "logprobs": {"content": [_logprob(token, ids[0])]},
                        }
                    ],
                    "usage": {"prompt_tokens": 3, "completion_tokens": n + 1, "total_tokens": n + 4}
                    if last
                    else None,
                }
                body = {
                    "stream": True,
                    "generate_chunk": chunk,
                    "prompt_token_ids": seed_ids,
                    **original,
                }
                theirs, ours = render_pair.both(path, {**body, "stream_state": state_v})
                assert theirs.status_code == 200, theirs.text
                assert _steady(ours.json()) == _steady(theirs.json()), (text, path, n)
                # And each side continues the other's state.
                on_ours, mine = render_pair.both(path, {**body, "stream_state": state_t})
                assert _steady(mine.json()) == _steady(on_ours.json()), (text, path, n)
                state_v, state_t = theirs.json()["stream_state"], mine.json()["stream_state"]


GENERATION_DEFAULTS = {
    "temperature": 0.7,
    "top_p": 0.8,
    "top_k": 20,
    "repetition_penalty": 1.05,
    "max_new_tokens": 100,
}


@pytest.fixture(scope="module")
def defaults_pair(
    vllm_python: Path,
    vllm_fork_server: ForkServer | None,
    tiny_model: TinyModel,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Pair]:
    """Both servers on a copy of the tiny model whose generation_config.json sets defaults."""
    base = tmp_path_factory.mktemp("tiny-defaults")
    folder = base / "model"
    shutil.copytree(tiny_model.folder, folder)
    config = json.loads((folder / "generation_config.json").read_text())
    (folder / "generation_config.json").write_text(json.dumps({**config, **GENERATION_DEFAULTS}))
    serve = ("--model", f"tiny={folder}", *SERVE_ARGS[2:])
    model = TinyModel(folder, None)
    vllm, ours = _start(vllm_python, vllm_fork_server, model, base, serve, "render-defaults")
    try:
        with (
            httpx.Client(base_url=vllm.url, timeout=120) as engine,
            httpx.Client(base_url=ours.url, timeout=120) as client,
        ):
            yield Pair(engine, client)
    finally:
        vllm.stop()
        ours.stop()


@pytest.mark.parametrize("options", [{}, {"temperature": 0}, {"max_tokens": 500, "top_k": 0}])
def test_generation_config_defaults_equal_vllm(defaults_pair, options: dict) -> None:
    theirs = assert_same(
        defaults_pair, "/v1/chat/completions/render", {"messages": USER, **options}
    )
    if not options:
        assert theirs.json()["sampling_params"]["max_tokens"] == 100
    assert_same(defaults_pair, "/v1/completions/render", {"prompt": "Hello", **options})
