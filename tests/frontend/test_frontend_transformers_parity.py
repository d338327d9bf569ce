"""Chat-form /tokenize equals transformers' ``apply_chat_template(..., tokenize=True)``.

For smollm2, qwen2.5-instruct (with tools and tool calls) and phi-3-mini from tests/data, on
conversations with CJK, emoji and accents, add_generation_prompt on and off. The reference is
the tokenizer each backend stands for: ``PreTrainedTokenizerFast`` on tokenizer.json for the
default ``tokenizers`` backend, ``AutoTokenizer`` for ``--backend transformers`` (what vLLM
loads; for phi-3 it differs from tokenizer.json on spaces, see docs/api.md). /detokenize
round-trips the ids: decoding gives transformers' decode, and encoding that text gives the ids.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator

import httpx
import pytest

from tokenkeys.tokenizer import TokenizerOptions

from chat_fixtures import CHAT_MODELS, CONVERSATIONS, TOOL_CONVERSATION, TOOLS, openai_form
from conformance_data import data_path
from http_support import HttpServerThread, registry

transformers = pytest.importorskip("transformers")

MODELS = CHAT_MODELS
BACKENDS = ("tokenizers", "transformers")


@pytest.fixture(scope="module", params=BACKENDS)
def served(request) -> Iterator[tuple[httpx.Client, dict]]:
    folders = [data_path("tokenizers", name) for name in MODELS]
    backend = request.param
    if backend == "tokenizers":
        refs = {
            f.name: transformers.PreTrainedTokenizerFast.from_pretrained(
                str(f), local_files_only=True
            )
            for f in folders
        }
    else:
        refs = {
            f.name: transformers.AutoTokenizer.from_pretrained(str(f), local_files_only=True)
            for f in folders
        }
    models = registry(*folders, options=TokenizerOptions(backend=backend), engines=False)
    with HttpServerThread(models) as server, httpx.Client(base_url=server.url) as c:
        yield c, refs


def _reference_ids(tok, messages, **kwargs) -> list[int]:
    out = tok.apply_chat_template(copy.deepcopy(messages), tokenize=True, **kwargs)
    return list(out["input_ids"] if hasattr(out, "keys") else out)


def _tokenize(client: httpx.Client, body: dict) -> list[int]:
    response = client.post("/tokenize", json=body)
    assert response.status_code == 200, response.text
    result = response.json()
    assert result["count"] == len(result["tokens"])
    return result["tokens"]


def _round_trips(client: httpx.Client, tok, model: str, ids: list[int]) -> None:
    text = client.post("/detokenize", json={"model": model, "tokens": ids}).json()["prompt"]
    assert text == tok.decode(ids)
    again = {"model": model, "prompt": text, "add_special_tokens": False}
    assert _tokenize(client, again) == ids


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("conversation", sorted(CONVERSATIONS))
@pytest.mark.parametrize("agp", [True, False])
def test_chat_tokens_are_transformers_tokens(served, model, conversation, agp) -> None:
    client, refs = served
    messages = CONVERSATIONS[conversation]
    body = {"model": model, "messages": messages, "add_generation_prompt": agp}
    ids = _tokenize(client, body)
    assert ids == _reference_ids(refs[model], messages, add_generation_prompt=agp)
    _round_trips(client, refs[model], model, ids)


@pytest.mark.parametrize("agp", [True, False])
def test_qwen_tools_and_tool_calls_are_transformers_tokens(served, agp) -> None:
    client, refs = served
    model = "qwen2.5-instruct"
    body = {"model": model, "messages": openai_form(TOOL_CONVERSATION), "tools": TOOLS}
    ids = _tokenize(client, {**body, "add_generation_prompt": agp})
    reference = _reference_ids(
        refs[model], TOOL_CONVERSATION, tools=TOOLS, add_generation_prompt=agp
    )
    assert ids == reference
    _round_trips(client, refs[model], model, ids)


@pytest.mark.parametrize("model", MODELS)
def test_continue_final_message_is_transformers_tokens(served, model) -> None:
    client, refs = served
    messages = CONVERSATIONS["no_system"][:2]
    body = {
        "model": model,
        "messages": messages,
        "add_generation_prompt": False,
        "continue_final_message": True,
    }
    ids = _tokenize(client, body)
    assert ids == _reference_ids(refs[model], messages, continue_final_message=True)
