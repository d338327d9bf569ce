"""Acceptance: what vLLM refuses, tokenkeys refuses alike (status class and error type).

Same pair of servers as test_vllm_served_number.py. Each case is sent to both; a refusal must
have the same HTTP status class and OpenAI error ``type``, and an answer vLLM gives (e.g. a
prompt plus max_tokens past the context, which vLLM fits instead of refusing) must be given by
tokenkeys too. Where vLLM is the one at fault, the case pins both answers and docs/api.md ("Checked
against vLLM 0.32") gives the evidence and what tokenkeys does.
"""

from __future__ import annotations

import pytest

from chat_fixtures import TOOL_CONVERSATION
from served_pair import ok
from vllm_server import DEFAULT_CONFIG, MAX_MODEL_LEN

pytestmark = [pytest.mark.realengine, pytest.mark.vllm_servers(DEFAULT_CONFIG)]

TURN = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]
# vLLM answers a request that fails its pydantic schema with type "Bad Request" (the HTTP
# phrase, from its RequestValidationError handler) and every other 400 with "BadRequestError";
# tokenkeys always writes "BadRequestError" (docs/api.md). Both spellings name one class here.
SAME_TYPE = {"Bad Request": "BadRequestError"}

# (label, path, body) of requests vLLM 0.32 refuses.
REFUSED = [
    ("unknown model", "/tokenize", {"model": "nope", "prompt": "x"}),
    ("no prompt nor messages", "/tokenize", {}),
    (
        "continue and generation prompt",
        "/tokenize",
        {"messages": TURN, "continue_final_message": True, "add_generation_prompt": True},
    ),
    ("negative id", "/detokenize", {"tokens": [-1]}),
    ("empty prompt", "/v1/completions", {"prompt": ""}),
    ("prompt past the context", "/v1/completions", {"prompt": [5] * (MAX_MODEL_LEN + 1)}),
    ("prompt fills the context", "/v1/completions", {"prompt": [5] * MAX_MODEL_LEN}),
    ("max_tokens past the context", "/v1/completions", {"prompt": "hi", "max_tokens": 5000}),
    ("max_tokens 0", "/v1/completions", {"prompt": "hi", "max_tokens": 0}),
    ("id out of vocabulary", "/v1/completions", {"prompt": [10**9], "max_tokens": 1}),
    ("empty cache_salt", "/v1/completions", {"prompt": "hi", "cache_salt": ""}),
    ("negative temperature", "/v1/completions", {"prompt": "hi", "temperature": -1}),
    ("temperature above 2", "/v1/completions", {"prompt": "hi", "temperature": 2.5}),
    ("top_p 0", "/v1/completions", {"prompt": "hi", "top_p": 0}),
    ("top_k -2", "/v1/completions", {"prompt": "hi", "top_k": -2}),
    ("presence_penalty 3", "/v1/completions", {"prompt": "hi", "presence_penalty": 3}),
    ("frequency_penalty -3", "/v1/chat/completions", {"messages": TURN, "frequency_penalty": -3}),
    ("no messages", "/v1/chat/completions", {"messages": []}),
    # OpenAI's schema: function.arguments is a JSON string; an object is refused.
    ("tool-call arguments as an object", "/tokenize", {"messages": TOOL_CONVERSATION}),
    (
        "continue with the default generation prompt",
        "/v1/chat/completions",
        {"messages": TURN, "continue_final_message": True},
    ),
]


def _kind(response) -> tuple[int, str]:  # noqa: ANN001 - httpx.Response
    error = response.json()["error"]
    return response.status_code // 100, SAME_TYPE.get(error["type"], error["type"])


@pytest.mark.parametrize(("label", "path", "body"), REFUSED, ids=[c[0] for c in REFUSED])
def test_refused_alike(pair, label: str, path: str, body: dict) -> None:
    body = {"max_tokens": 1, **body} if path.startswith("/v1/") else body
    theirs, ours = pair.both(path, body)
    assert theirs.status_code >= 400, f"vLLM accepts {label}: {theirs.text[:300]}"
    assert ours.status_code >= 400, f"tokenkeys accepts {label}: {ours.text[:300]}"
    assert _kind(ours) == _kind(theirs), (theirs.text[:300], ours.text[:300])


def test_max_tokens_past_the_context_is_fitted_alike(pair) -> None:
    """vLLM lowers max_tokens to the room the prompt leaves instead of refusing."""
    body = {"prompt": [5] * (MAX_MODEL_LEN - 10), "max_tokens": 50, "ignore_eos": True}
    theirs, ours = pair.both("/v1/completions", body)
    want, got = ok(theirs)["usage"], ok(ours)["usage"]
    assert got["prompt_tokens"] == want["prompt_tokens"] == MAX_MODEL_LEN - 10
    assert got["completion_tokens"] == want["completion_tokens"] == 10


def test_detokenize_out_of_vocabulary_vllm_answers_empty_tokenkeys_refuses(pair) -> None:
    """vLLM's fault (docs/api.md): an id past the vocabulary decodes to nothing, silently."""
    theirs, ours = pair.both("/detokenize", {"tokens": [10**9]})
    assert ok(theirs)["prompt"] == ""
    assert ours.status_code == 400 and ours.json()["error"]["param"] == "tokens"
