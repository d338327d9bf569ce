"""/tokenize, /detokenize and /tokenizer_info on a real server: vLLM clients, defaults, errors.

The vLLM-client tests send the exact bodies of vLLM's own tokenization tests
(``tests/entrypoints/openai/test_tokenization.py``, vllm-project/vllm at 0091c95) and check the
answers the way those tests do, with transformers as the reference tokenizer; the model is
served under a vLLM-style ``org/name`` and its tokenizer adds a BOS, so ``add_special_tokens``
is visible.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tokenkeys.errors import ConfigError
from tokenkeys.frontend import HttpConfig
from tokenkeys.frontend.config import resolve_paths
from tokenkeys.frontend.responses import DetokenizeResponse, ErrorResponse, TokenizeResponse
from tokenkeys.limits import Limits
from tokenkeys.preprocess.chat import ChatOptions
from tokenkeys.server.runtime.loading import ModelSource
from tokenkeys.tokenizer import TokenizerOptions

from http_support import HttpServerThread, bos_variant, registry

transformers = pytest.importorskip("transformers")

MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct"


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    return bos_variant(tmp_path_factory.mktemp("bos") / "smollm2-bos")


@pytest.fixture(scope="module")
def hf(folder):
    return transformers.PreTrainedTokenizerFast.from_pretrained(str(folder), local_files_only=True)


def _serve(models, config: HttpConfig | None = None) -> Iterator[httpx.Client]:
    with HttpServerThread(models, config) as server, httpx.Client(base_url=server.url) as c:
        yield c


@pytest.fixture(scope="module")
def client(folder) -> Iterator[httpx.Client]:
    yield from _serve(registry(ModelSource(MODEL, folder), engines=False))


# --- a vLLM client works unchanged ---


@pytest.mark.parametrize("add_special", [False, True])
def test_vllm_tokenize_completions(client, hf, add_special) -> None:
    prompt = "vllm1 This is a test prompt."
    tokens = hf.encode(prompt, add_special_tokens=add_special)
    response = client.post(
        "/tokenize", json={"add_special_tokens": add_special, "model": MODEL, "prompt": prompt}
    )
    response.raise_for_status()
    result = response.json()
    assert set(result) == {"count", "max_model_len", "tokens", "token_strs"}
    assert result["tokens"] == tokens
    assert result["count"] == len(tokens)
    assert result["max_model_len"] == 8192  # tokenizer_config's model_max_length
    assert result["token_strs"] is None
    TokenizeResponse.model_validate(result)


@pytest.mark.parametrize("with_tools", [False, True])
def test_vllm_tokenize_chat(client, hf, with_tools) -> None:
    tools = [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "parameters": {"type": "object", "properties": {"location": {"type": "string"}}},
            },
        }
    ]
    for add_generation in [False, True]:
        for add_special in [False, True]:
            conversation = [
                {"role": "user", "content": "Hi there!"},
                {"role": "assistant", "content": "Nice to meet you!"},
                {"role": "user", "content": "Can I ask a question? vllm1"},
            ]
            for continue_final in [False, True]:
                if add_generation and continue_final:
                    continue
                if continue_final:
                    conversation.append({"role": "assistant", "content": "Sure,"})
                extra = {"tools": tools} if with_tools else {}
                prompt = hf.apply_chat_template(
                    add_generation_prompt=add_generation,
                    continue_final_message=continue_final,
                    conversation=conversation,
                    tokenize=False,
                    **extra,
                )
                tokens = hf.encode(prompt, add_special_tokens=add_special)
                response = client.post(
                    "/tokenize",
                    json={
                        "add_generation_prompt": add_generation,
                        "continue_final_message": continue_final,
                        "add_special_tokens": add_special,
                        "messages": conversation,
                        "model": MODEL,
                        **extra,
                    },
                )
                response.raise_for_status()
                result = response.json()
                assert result["tokens"] == tokens
                assert result["count"] == len(tokens)
                assert result["token_strs"] is None


def test_vllm_tokenize_with_return_token_strs(client, hf) -> None:
    prompt = "This is a token_strs test prompt! vllm1"
    response = client.post(
        "/tokenize", json={"prompt": prompt, "model": MODEL, "return_token_strs": True}
    )
    response.raise_for_status()
    result = response.json()
    tokens = hf.encode(prompt, add_special_tokens=True)
    assert result["tokens"] == tokens and result["count"] == len(tokens)
    # Decoded text in context, where vLLM returns vocabulary spellings ("Ġis").
    assert result["token_strs"][:3] == ["<|endoftext|>", "This", " is"]
    assert hf.convert_ids_to_tokens(tokens)[2] == "Ġis"
    assert "".join(result["token_strs"]) == "<|endoftext|>" + prompt


def test_vllm_detokenize(client, hf) -> None:
    prompt = "This is a test prompt. vllm1"
    tokens = hf.encode(prompt, add_special_tokens=False)
    response = client.post("/detokenize", json={"model": MODEL, "tokens": tokens})
    response.raise_for_status()
    assert response.json() == {"prompt": prompt}
    DetokenizeResponse.model_validate(response.json())


def test_vllm_tokenizer_info(client, hf) -> None:
    response = client.get("/tokenizer_info")
    response.raise_for_status()
    result = response.json()
    assert isinstance(result["tokenizer_class"], str) and result["tokenizer_class"]
    field_types = {
        "add_bos_token": bool,
        "add_prefix_space": bool,
        "clean_up_tokenization_spaces": bool,
        "split_special_tokens": bool,
        "bos_token": str,
        "eos_token": str,
        "pad_token": str,
        "unk_token": str,
        "chat_template": str,
        "errors": str,
        "model_max_length": int,
        "additional_special_tokens": list,
        "added_tokens_decoder": dict,
    }
    for field, expected in field_types.items():
        if result.get(field) is not None:
            assert isinstance(result[field], expected), field
    for token_id, info in (result.get("added_tokens_decoder") or {}).items():
        assert isinstance(token_id, str) and isinstance(info["special"], bool) and info["content"]
    assert result["chat_template"].strip()
    assert (
        result["model_max_length"]
        >= client.post("/tokenize", json={"model": MODEL, "prompt": "Hello world!"}).json()[
            "max_model_len"
        ]
    )
    assert result["add_special_tokens"] is True and len(result["fingerprint"]) == 64


def test_lmcache_style_request(client) -> None:
    """The request of LMCache's vLLM integration guide, and the shape it prints."""
    response = client.post(
        "/tokenize",
        json={"model": MODEL, "prompt": "Explain the significance of KV cache in language models."},
    )
    assert list(response.json()) == ["count", "max_model_len", "tokens", "token_strs"]


# --- defaults follow the deployment ---


def test_completion_default_is_what_completions_do(folder) -> None:
    """With bare prompts served without special tokens (Dynamo-style), /tokenize adds none
    unless asked; chat adds none by default in every deployment."""
    options = TokenizerOptions(add_special_tokens_completion=False)
    for c in _serve(registry(folder, options=options, engines=False)):
        plain = c.post("/tokenize", json={"prompt": "hi"}).json()["tokens"]
        asked = c.post("/tokenize", json={"prompt": "hi", "add_special_tokens": True}).json()
        assert plain == [6004] and asked["tokens"] == [0, 6004]
        chat = c.post("/tokenize", json={"messages": [{"role": "user", "content": "hi"}]})
        assert chat.json()["tokens"][0] != 0
        assert c.get("/tokenizer_info").json()["add_special_tokens"] is False


# --- errors ---


def _error(response: httpx.Response, status: int, param: str | None = None) -> str:
    assert response.status_code == status, response.text
    body = ErrorResponse.model_validate(response.json())
    assert body.error.code == status
    if param is not None:
        assert body.error.param == param
    return body.error.message


def test_unknown_model_is_404_listing_the_served_names(client) -> None:
    message = _error(client.post("/tokenize", json={"model": "x", "prompt": "a"}), 404, "model")
    assert MODEL in message
    _error(client.post("/detokenize", json={"model": "x", "tokens": [1]}), 404, "model")


@pytest.mark.parametrize(
    "body,param",
    [
        ({"prompt": 1}, "prompt"),
        ({"prompt": ["a", "b"]}, "prompt"),
        ({"prompt": "a", "add_special_tokens": "yes"}, "add_special_tokens"),
        ({"messages": "hi"}, "messages"),
        ({"messages": [{"role": "user", "content": "a"}], "prompt": "a"}, "prompt"),
        ({"text": "a"}, "prompt"),
        ({"messages": [{"role": "user", "content": "a"}], "chat_template": "{{ 1 }}"}, None),
        (
            {
                "messages": [{"role": "user", "content": "a"}],
                "continue_final_message": True,
            },
            "continue_final_message",
        ),
    ],
)
def test_invalid_bodies_are_400_not_422(client, body, param) -> None:
    _error(client.post("/tokenize", json=body), 400, param)


def test_untrusted_request_template_names_the_flag(client) -> None:
    body = {"messages": [{"role": "user", "content": "a"}], "chat_template": "{{ 1 }}"}
    assert "--trust-request-chat-template" in _error(client.post("/tokenize", json=body), 400)


def test_trusted_request_template_is_rendered(folder) -> None:
    chat = ChatOptions(trust_request_chat_template=True)
    for c in _serve(registry(folder, chat=chat, engines=False)):
        body = {"messages": [{"role": "user", "content": "a"}], "chat_template": "hi"}
        assert c.post("/tokenize", json=body).json()["tokens"] == [6004]


def test_non_json_bodies_are_400(client) -> None:
    _error(client.post("/tokenize", content=b"prompt=a"), 400, "body")
    headers = {"content-type": "application/json"}
    _error(client.post("/tokenize", content=b"{", headers=headers), 400, "body")
    _error(client.post("/tokenize", content=b"[1]", headers=headers), 400, "body")


@pytest.mark.parametrize(
    "body,needle",
    [
        ({"messages": [{"role": "user", "content": "a"}], "mm_processor_kwargs": {"a": 1}}, "mm_"),
        ({"messages": [{"role": "user", "content": "a"}], "media_io_kwargs": {"a": 1}}, "media_"),
        (
            {"messages": [{"role": "user", "content": "a"}], "truncate_prompt_tokens": 5},
            "truncate_prompt_tokens",
        ),
        ({"prompt": "a", "truncate_prompt_tokens": 5}, "truncate_prompt_tokens"),
    ],
)
def test_what_generation_cannot_do_exactly_is_501(client, body, needle) -> None:
    assert needle in _error(client.post("/tokenize", json=body), 501)


def test_an_image_for_a_text_only_model_is_vllms_400(client) -> None:
    image = {"type": "image_url", "image_url": {"url": "x"}}
    body = {"messages": [{"role": "user", "content": [image]}]}
    assert "is not a multimodal model" in _error(client.post("/tokenize", json=body), 400)


def test_extra_fields_are_ignored_like_vllm(client) -> None:
    plain = client.post("/tokenize", json={"prompt": "hi"}).json()
    extra = client.post("/tokenize", json={"prompt": "hi", "n": 3, "whatever": {"x": 1}}).json()
    assert plain == extra


def test_limits_are_413(folder) -> None:
    limits = Limits(max_request_bytes=200, max_chars_per_text=50)
    config = HttpConfig(limits=limits)
    for c in _serve(registry(folder, limits=limits, engines=False), config):
        message = _error(c.post("/tokenize", json={"prompt": "a" * 300}), 413, "body")
        assert "max_request_bytes" in message
        message = _error(c.post("/tokenize", json={"prompt": "a" * 60}), 413)
        assert "max_chars_per_text" in message

        def chunked() -> Iterator[bytes]:  # no Content-Length: counted while reading
            yield b'{"prompt": "'
            yield b"a" * 300
            yield b'"}'

        headers = {"content-type": "application/json"}
        _error(c.post("/tokenize", content=chunked(), headers=headers), 413, "body")


def test_detokenize_refuses_ids_outside_the_vocabulary(client) -> None:
    message = _error(client.post("/detokenize", json={"tokens": [1, 49152]}), 400, "tokens")
    assert "49152" in message and "0..49151" in message
    _error(client.post("/detokenize", json={"tokens": [-1]}), 400, "tokens")
    _error(client.post("/detokenize", json={"tokens": [1.0]}), 400, "tokens")


# --- paths ---


def test_paths_are_configurable(folder) -> None:
    config = HttpConfig(tokenize_path="/v2/tok", detokenize_path="/v2/detok")
    for c in _serve(registry(folder, engines=False), config):
        assert c.post("/v2/tok", json={"prompt": "hi"}).json()["tokens"] == [0, 6004]
        assert c.post("/v2/detok", json={"tokens": [6004]}).json() == {"prompt": "hi"}
        _error(c.post("/tokenize", json={"prompt": "hi"}), 404)


def test_the_command_line_wins_over_the_environment() -> None:
    env = {"TOKENKEYS_TOKENIZE_PATH": "/env/tok", "TOKENKEYS_DETOKENIZE_PATH": "/env/detok"}
    assert resolve_paths(None, None, {}) == ("/tokenize", "/detokenize")
    assert resolve_paths(None, None, env) == ("/env/tok", "/env/detok")
    assert resolve_paths("/cli/tok", None, env) == ("/cli/tok", "/env/detok")
    assert resolve_paths(None, None, {"TOKENKEYS_TOKENIZE_PATH": ""})[0] == "/tokenize"


@pytest.mark.parametrize(
    "paths",
    [("tokenize", "/d"), ("/t ok", "/d"), ("/t", "/t"), ("/health", "/d"), ("/t/{x}", "/d")],
)
def test_bad_paths_are_refused_at_start(paths) -> None:
    with pytest.raises(ConfigError):
        HttpConfig(tokenize_path=paths[0], detokenize_path=paths[1])
