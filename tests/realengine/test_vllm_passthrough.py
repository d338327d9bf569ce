"""Acceptance: every vLLM request field through the sidecar means what it means to vLLM (issue 20).

The same request goes straight to a real vLLM 0.32 and through ``tokenkeys serve --engine
vllm+http://...`` in front of it; the answers must be equal but for the parts each answer makes
anew (``id``, ``created``): greedy and seeded text, ``n`` choices, logprobs (chat's shape too),
stop strings, penalties, JSON-schema output, ``echo`` of a token prompt, streamed and not, and
through the official ``openai`` client. Each side gets its own ``cache_salt`` so that both
compute the whole prompt (a prefix hit would change nothing vLLM returns but ``cached_tokens``).
What the sidecar refuses (``docs/vllm.md``) answers 501 naming the field. Each of these runs
again through ``tokenkeys route`` in front of the sidecar, which routes, then forwards the
request to the sidecar's HTTP frontend (issue 33): every answer is still vLLM's, through the
official ``openai`` client too, sync and async, streamed and not.
"""

from __future__ import annotations

import copy
import itertools
from collections.abc import Iterator

import httpx
import openai
import pytest
from answers import answer_of, fresh, said
from route_process import RouteProcess

from served_pair import TokenkeysServe, random_prompt, wait_for
from vllm_server import (
    BLOCK_SIZE,
    DEFAULT_CONFIG,
    LORA_NAME,
    MAX_MODEL_LEN,
    MODEL_NAME,
    VllmServer,
)

pytestmark = [pytest.mark.realengine, pytest.mark.vllm_servers(DEFAULT_CONFIG)]

WORDS = "The sidecar forwards every field of the request to the engine behind it. " * 3
CHAT = [
    {"role": "system", "content": "You answer in one short sentence."},
    {"role": "user", "content": "Why do caches help? " + WORDS},
]
SCHEMA = {
    "type": "object",
    "properties": {"a": {"type": "integer"}, "b": {"type": "string", "maxLength": 8}},
    "required": ["a", "b"],
    "additionalProperties": False,
}
_salts = itertools.count()


@pytest.fixture(params=["sidecar", "router"])
def front(request):  # noqa: ANN001, ANN201
    """Where the request goes beside vLLM: the sidecar, or ``tokenkeys route`` in front of it,
    which routes, then forwards the request to the sidecar's HTTP frontend (issue 33)."""
    return request.getfixturevalue(request.param)


def _both(  # noqa: ANN202
    vllm: VllmServer,
    sidecar: TokenkeysServe | RouteProcess,
    path: str,
    body: dict,
    stream: bool,
    refused: bool = False,
):
    """vLLM's answer and the sidecar's, each (status, answer); vLLM's own must be a 200 unless
    ``refused`` (then both must be vLLM's refusal)."""
    answers = []
    for url in (vllm.url, sidecar.url):
        sent = copy.deepcopy({"model": MODEL_NAME, **body, "stream": stream})
        sent["cache_salt"] = f"salt-{next(_salts)}"
        answers.append(answer_of(httpx.post(url + path, json=sent, timeout=600), stream))
    assert answers[0][0] == (400 if refused else 200), answers[0]
    return answers[0][1], answers[1][1]


COMPLETIONS = {
    "greedy": {"prompt": WORDS, "max_tokens": 8, "temperature": 0},
    "seeded_n": {
        "prompt": WORDS,
        "max_tokens": 6,
        "temperature": 1.0,
        "top_p": 0.9,
        "top_k": 40,
        "seed": 7,
        "n": 2,
    },
    "logprobs_echo_ids": {
        "prompt": [1, 504, 3458, 314, 253, 1692, 28],
        "max_tokens": 4,
        "temperature": 0,
        "logprobs": 3,
        "prompt_logprobs": 1,
        "echo": True,
        "return_token_ids": True,
    },
    "stop_strings": {
        "prompt": WORDS,
        "max_tokens": 24,
        "temperature": 0,
        "stop": ["e", " the"],
        "include_stop_str_in_output": True,
    },
    "penalties_and_bounds": {
        "prompt": WORDS,
        "max_tokens": 10,
        "temperature": 0.8,
        "seed": 3,
        "presence_penalty": 0.5,
        "frequency_penalty": 0.4,
        "repetition_penalty": 1.2,
        "min_p": 0.05,
        "min_tokens": 6,
        "ignore_eos": True,
        "logit_bias": {"28": 4.0},
        "skip_special_tokens": False,
        "spaces_between_special_tokens": False,
        "user": "u-1",
        "priority": 0,
    },
    "json_schema": {
        "prompt": WORDS,
        "max_tokens": 30,
        "temperature": 0,
        "response_format": {"type": "json_schema", "json_schema": {"name": "s", "schema": SCHEMA}},
    },
}
CHATS = {
    "greedy_logprobs": {
        "messages": CHAT,
        "max_completion_tokens": 8,
        "temperature": 0,
        "logprobs": True,
        "top_logprobs": 2,
    },
    "seeded_n": {"messages": CHAT, "max_tokens": 6, "temperature": 1.0, "seed": 5, "n": 2},
    "structured_choice": {
        "messages": CHAT,
        "max_tokens": 6,
        "temperature": 0,
        "structured_outputs": {"choice": ["yes", "no", "maybe"]},
    },
    "stop_and_prompt_text": {
        "messages": CHAT,
        "max_tokens": 16,
        "temperature": 0,
        "stop": ["a"],
        "return_prompt_text": True,
        "return_token_ids": True,
    },
}


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize("case", sorted(COMPLETIONS))
def test_completions_fields_mean_what_they_mean_to_vllm(vllm, front, case, stream) -> None:
    body = COMPLETIONS[case]
    if stream:
        body = {**body, "stream_options": {"include_usage": True}}
    # vLLM refuses prompt_logprobs in a stream (400): the front answers its refusal.
    refused = stream and "prompt_logprobs" in body
    theirs, ours = _both(vllm, front, "/v1/completions", body, stream, refused)
    assert ours == theirs


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize("case", sorted(CHATS))
def test_chat_fields_mean_what_they_mean_to_vllm(vllm, front, case, stream) -> None:
    body = CHATS[case]
    if stream:
        body = {**body, "stream_options": {"include_usage": True}}
    theirs, ours = _both(vllm, front, "/v1/chat/completions", body, stream)
    assert ours == theirs


def test_a_stream_without_include_usage_is_vllms_stream(vllm, front) -> None:
    body = {"prompt": WORDS, "max_tokens": 5, "temperature": 0}
    theirs, ours = _both(vllm, front, "/v1/completions", body, True)
    assert ours == theirs
    assert "usage" not in ours


def test_chat_without_max_tokens_fills_the_context_as_vllm_does(vllm, sidecar) -> None:
    # vLLM's chat default is the rest of the context: a prompt leaving a few dozen tokens of it
    # gets them all (finish "length"), not the simulated engine's 16.
    def conversation(repeats: int) -> list[dict]:
        return [{"role": "user", "content": "Caches help. " * repeats}]

    def count(repeats: int) -> int:
        body = {"model": MODEL_NAME, "messages": conversation(repeats)}
        return httpx.post(f"{sidecar.url}/tokenize", json=body, timeout=60).json()["count"]

    per = count(101) - count(100)
    repeats = 100 + (MAX_MODEL_LEN - 40 - count(100)) // per
    body = {"messages": conversation(repeats), "temperature": 0, "ignore_eos": True}
    theirs, ours = _both(vllm, sidecar, "/v1/chat/completions", body, False)
    assert ours == theirs
    usage = ours["usage"]
    assert usage["completion_tokens"] == MAX_MODEL_LEN - usage["prompt_tokens"] > 16


def test_the_openai_client_gets_vllms_answers(vllm, front) -> None:
    answers = []
    for url in (vllm.url, front.url):
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="none", timeout=600)
        salt = {"cache_salt": f"salt-{next(_salts)}"}
        whole = client.completions.create(
            model=MODEL_NAME, prompt=WORDS, max_tokens=6, temperature=0, logprobs=2, extra_body=salt
        )
        chunks = client.chat.completions.create(
            model=MODEL_NAME,
            messages=CHAT,  # type: ignore[arg-type]
            max_tokens=6,
            temperature=0.7,
            seed=9,
            n=2,
            stream=True,
            stream_options={"include_usage": True},
            extra_body={"cache_salt": f"salt-{next(_salts)}"},
        )
        joined = said([fresh(c.model_dump()) for c in chunks])
        answers.append((fresh(whole.model_dump()), joined))
    assert answers[1] == answers[0]


async def test_the_async_openai_client_gets_vllms_answers(vllm, front) -> None:
    answers = []
    for url in (vllm.url, front.url):
        client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="none", timeout=600)
        whole = await client.chat.completions.create(
            model=MODEL_NAME,
            messages=CHAT,  # type: ignore[arg-type]
            max_tokens=6,
            temperature=0,
            logprobs=True,
            top_logprobs=2,
            extra_body={"cache_salt": f"salt-{next(_salts)}"},
        )
        stream = await client.completions.create(
            model=MODEL_NAME,
            prompt=WORDS,
            max_tokens=6,
            temperature=0.9,
            seed=4,
            stream=True,
            stream_options={"include_usage": True},
            extra_body={"cache_salt": f"salt-{next(_salts)}"},
        )
        joined = said([fresh(c.model_dump()) async for c in stream])
        answers.append((fresh(whole.model_dump()), joined))
        await client.close()
    assert answers[1] == answers[0]


@pytest.mark.parametrize(
    ("path", "body", "field"),
    [
        ("/v1/chat/completions", {"messages": CHAT, "echo": True}, "echo"),
        ("/v1/completions", {"prompt": WORDS, "echo": True}, "echo"),
        (
            "/v1/completions",
            {"prompt": WORDS, "kv_transfer_params": {"do_remote_prefill": True}},
            "kv_transfer_params",
        ),
    ],
)
def test_what_cannot_pass_exactly_is_refused_naming_the_field(front, path, body, field) -> None:
    response = httpx.post(front.url + path, json={"model": MODEL_NAME, **body}, timeout=60)
    assert response.status_code == 501, response.text
    assert response.json()["error"]["param"] == field


def test_vllms_own_refusal_is_passed_back(vllm, front) -> None:
    body = {"model": MODEL_NAME, "prompt": WORDS, "max_tokens": 4, "logprobs": 10_000}
    theirs = httpx.post(f"{vllm.url}/v1/completions", json=body, timeout=60)
    ours = httpx.post(f"{front.url}/v1/completions", json=body, timeout=60)
    assert theirs.status_code == ours.status_code == 400
    assert ours.json() == theirs.json()


def test_version_is_vllms_and_tokenkeys(vllm, sidecar) -> None:
    theirs = httpx.get(f"{vllm.url}/version", timeout=30).json()
    ours = httpx.get(f"{sidecar.url}/version", timeout=30).json()
    assert ours["version"] == theirs["version"] == "0.32.0"
    assert ours["tokenkeys_version"]


@pytest.fixture(scope="module")
def router(sidecar: TokenkeysServe, tmp_path_factory) -> Iterator[RouteProcess]:
    cache = tmp_path_factory.mktemp("route-cache")
    process = RouteProcess("--worker", sidecar.target, "--poll-interval", "1", cache=str(cache))
    with process:
        yield process


@pytest.mark.parametrize("chat", [False, True], ids=["completions", "chat"])
@pytest.mark.parametrize(
    "sampling",
    [{"temperature": 0}, {"temperature": 0.8, "top_p": 0.9, "top_k": 30, "seed": 5}],
    ids=["greedy", "seeded"],
)
def test_through_the_router_the_sampling_fields_reach_vllm(vllm, router, chat, sampling) -> None:
    # tokenkeys route -> the sidecar's HTTP frontend -> vLLM: greedy and seeded text are
    # vLLM's own.
    path = "/v1/chat/completions" if chat else "/v1/completions"
    body = {"model": MODEL_NAME, "max_tokens": 8, **sampling}
    body |= {"messages": CHAT} if chat else {"prompt": WORDS}
    texts = []
    for url in (vllm.url, router.url):
        sent = {**body, "cache_salt": f"salt-{next(_salts)}"}
        answer = httpx.post(url + path, json=sent, timeout=600)
        assert answer.status_code == 200, answer.text
        choice = answer.json()["choices"][0]
        texts.append(choice["message"]["content"] if chat else choice["text"])
    assert texts[1] == texts[0]


def test_a_lora_adapter_by_name_through_the_router_is_vllms_and_keyed_as_its(vllm, router) -> None:
    # The harness's vLLM serves the adapter (--lora-modules ada=PATH); the router learns it
    # from the sidecar's /v1/models (vLLM's own list) and lists it too.
    cards = httpx.get(f"{router.url}/v1/models", timeout=30).json()["data"]
    assert [(c["id"], c["parent"]) for c in cards if c["parent"]] == [(LORA_NAME, MODEL_NAME)]
    body = {"model": LORA_NAME, "prompt": WORDS, "max_tokens": 8, "temperature": 0}
    for stream in (False, True):
        theirs, ours = _both(vllm, router, "/v1/completions", body, stream)
        assert ours == theirs and ours["model"] == LORA_NAME
    # The router keys the request as vLLM keys it, the adapter's name and registered path in
    # every block (vLLM 0.31+; its BlockStored carries lora_name): a fresh prompt sent with the
    # adapter is then matched for the adapter, not for the base model, and the promise is what
    # vLLM serves from its cache.
    prompt = random_prompt(33, 5 * BLOCK_SIZE + 3)
    sent = {"model": LORA_NAME, "prompt": prompt, "max_tokens": 1}
    with httpx.Client(base_url=router.url, timeout=600) as client:
        assert client.post("/v1/completions", json=sent).status_code == 200

        def matched(model: str) -> int:
            dry = client.post("/router/route", json={**sent, "model": model})
            return dry.json()["matched_blocks"]

        wait_for(lambda: matched(LORA_NAME) == 5, "the adapter's blocks at the router")
        assert matched(MODEL_NAME) == 0
        again = client.post("/v1/completions", json=sent)
    served = again.json()["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert int(again.headers["x-tokenkeys-expected-cached-tokens"]) == served == 5 * BLOCK_SIZE
