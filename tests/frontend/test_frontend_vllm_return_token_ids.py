"""vLLM's own ``test_return_token_ids`` against ``tokenkeys serve`` (simulated engine).

Ported from ``tests/entrypoints/openai/test_return_token_ids.py`` (vllm-project/vllm, the 0.32
line) with its assertions unchanged, on the embedded SmolLM2 tokenizer (a ChatML template, as
the test's Qwen2.5 has) and the official ``openai`` client. What does not apply here, and why:

- ``logprobs``/``prompt_logprobs``/``return_tokens_as_token_ids`` (the test passes them
  alongside): the simulated engine produces no log probabilities and answers 501 for them, so
  the requests are sent without them; ``test_comparison_with_prompt_logprobs_and_logprobs`` is
  not ported.
- ``test_chat_completion_with_tool_use`` needs the hermes tool-call parser and a model that
  calls tools: not served here (501 naming the parser); its ``return_token_ids: False`` half is
  kept below.
- The simulated engine samples ids at random (special tokens among them) and stops on length,
  so output ids are decoded with ``skip_special_tokens=True``, as the served text is, and the
  chat checks that they end with ``<|im_end|>`` become: they decode to the text.

The defect this caught (issue 34): without ``return_token_ids`` the keys were left out; vLLM
sends them as ``null`` and the client's ``completion.choices[0].token_ids`` needs them.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import openai
import pytest
import pytest_asyncio
from transformers import AutoTokenizer

from tokenkeys.server.runtime.loading import ModelSource
from tokenkeys.tokenizer import default_tokenizer_path

from http_support import HttpServerThread, attach_engines, registry

MODEL_NAME = "smollm2"


@pytest.fixture(scope="module")
def server_url() -> AsyncIterator[str]:
    models = registry(ModelSource(MODEL_NAME, default_tokenizer_path()), engines=False)
    attach_engines(models, max_model_len=2048)
    with HttpServerThread(models) as thread:
        yield f"{thread.url}/v1"


@pytest_asyncio.fixture
async def client(server_url: str) -> AsyncIterator[openai.AsyncOpenAI]:
    async with openai.AsyncOpenAI(base_url=server_url, api_key="none") as c:
        yield c


@pytest.fixture(scope="module")
def tokenizer():  # noqa: ANN201 - what vLLM's get_tokenizer returns: a transformers tokenizer
    return AutoTokenizer.from_pretrained(str(default_tokenizer_path()))


@pytest.mark.asyncio
@pytest.mark.parametrize("return_token_ids", [True, False, None])
async def test_basic_completion_with_emoji(client, tokenizer, return_token_ids: bool | None):
    extra_body = None
    if return_token_ids is not None:
        extra_body = {"return_token_ids": return_token_ids}
    prompt = "Complete this sentence with emojis: I love coding 🚀"
    completion = await client.completions.create(
        model=MODEL_NAME, prompt=prompt, max_tokens=10, temperature=0, extra_body=extra_body
    )
    completion_dict = completion.model_dump()

    assert "prompt_token_ids" in completion_dict["choices"][0]
    if not return_token_ids:
        assert completion_dict["choices"][0].get("token_ids") is None
        assert completion_dict["choices"][0].get("prompt_token_ids") is None
        return
    assert isinstance(completion.choices[0].prompt_token_ids, list)

    encoded_tokens = tokenizer.encode(prompt)
    assert any(
        completion.choices[0].prompt_token_ids[i : i + len(encoded_tokens)] == encoded_tokens
        for i in range(len(completion.choices[0].prompt_token_ids) - len(encoded_tokens) + 1)
    )

    assert completion.choices[0].token_ids is not None
    assert isinstance(completion.choices[0].token_ids, list)
    assert len(completion.choices[0].token_ids) > 0

    decoded_text = tokenizer.decode(completion.choices[0].token_ids, skip_special_tokens=True)
    assert decoded_text.startswith(completion.choices[0].text)

    completion_without = await client.completions.create(
        model=MODEL_NAME,
        prompt=prompt,
        max_tokens=10,
        temperature=0,
        extra_body={"return_token_ids": False},
    )
    completion_without_dict = completion_without.model_dump()
    assert completion_without_dict["choices"][0].get("token_ids") is None
    assert completion_without_dict.get("prompt_token_ids") is None


@pytest.mark.asyncio
async def test_chat_completion_without_token_ids(client) -> None:
    """The ``return_token_ids: False`` half of ``test_chat_completion_with_tool_use``."""
    response_without = await client.chat.completions.create(
        model=MODEL_NAME,
        messages=[
            {"role": "system", "content": "You are a helpful assistant."},
            {"role": "user", "content": "What's the weather like in Paris?"},
        ],
        max_tokens=100,
        temperature=0,
        extra_body={"return_token_ids": False},
    )
    assert response_without.choices[0].token_ids is None
    assert response_without.prompt_token_ids is None


@pytest.mark.asyncio
async def test_chat_completion_with_emoji_and_token_ids(client, tokenizer) -> None:
    chat_messages = [
        {"role": "system", "content": "You like to use emojis in your responses."},
        {"role": "user", "content": "Repeat after me: I love cats 🐱"},
    ]
    response = await client.chat.completions.create(
        model=MODEL_NAME,
        messages=chat_messages,
        max_tokens=50,
        temperature=0,
        extra_body={"return_token_ids": True},
    )
    response_dict = response.model_dump()
    assert response.choices[0].token_ids is not None
    assert "prompt_token_ids" in response_dict
    assert response.choices[0].message.content is not None

    decoded_prompt = tokenizer.decode(response.prompt_token_ids)
    assert decoded_prompt.startswith(
        "<|im_start|>system\nYou like to use emojis in your responses."
    )
    assert decoded_prompt.endswith("I love cats 🐱<|im_end|>\n<|im_start|>assistant\n")

    decoded_response = tokenizer.decode(response.choices[0].token_ids, skip_special_tokens=True)
    assert decoded_response == response.choices[0].message.content

    stream = await client.chat.completions.create(
        model=MODEL_NAME,
        messages=chat_messages,
        max_tokens=50,
        temperature=0,
        stream=True,
        extra_body={"return_token_ids": True},
    )
    collected_content = ""
    collected_token_ids: list[int] = []
    first_chunk = True
    async for chunk in stream:
        if first_chunk:
            assert chunk.prompt_token_ids is not None
            assert isinstance(chunk.prompt_token_ids, list)
            decoded_prompt_stream = tokenizer.decode(chunk.prompt_token_ids)
            assert decoded_prompt_stream == decoded_prompt
            first_chunk = False
        else:
            chunk_dump = chunk.model_dump()
            assert "prompt_token_ids" not in chunk_dump, (
                "Subsequent chunks should not have prompt_token_ids"
            )
        if chunk.choices:
            if chunk.choices[0].delta.content:
                collected_content += chunk.choices[0].delta.content
            choice_dump = chunk.choices[0].model_dump()
            if "token_ids" in choice_dump:
                collected_token_ids.extend(chunk.choices[0].token_ids)

    assert len(collected_content) > 0
    assert len(collected_token_ids) > 0
    decoded_response = tokenizer.decode(collected_token_ids, skip_special_tokens=True)
    assert decoded_response == collected_content
