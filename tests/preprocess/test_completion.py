"""Completion prompts: the forms OpenAI accepts, and the one rule both completion paths consult."""

from __future__ import annotations

import pytest

from tokenkeys.errors import InvalidArgument, LimitExceeded, Unsupported
from tokenkeys.limits import Limits
from tokenkeys.preprocess.completion import prompts_of, unsupported_reason
from tokenkeys.server.runtime.loading import load_models
from tokenkeys.tokenizer import TokenizerOptions

PRE = load_models([], TokenizerOptions(), Limits(max_tokens_per_request=64)).get(None).preprocessor


@pytest.mark.parametrize(
    "prompt,expected",
    [
        ("a", ["a"]),
        (["a", ""], ["a", ""]),
        ([1, 2], [[1, 2]]),
        ([[1], [2, 3]], [[1], [2, 3]]),
    ],
)
def test_prompt_forms(prompt, expected) -> None:
    assert prompts_of({"prompt": prompt}) == expected


@pytest.mark.parametrize("prompt", [None, 1, [], ["a", 1], [[1], []], [True], [[1.0]], {"a": 1}])
def test_bad_prompts(prompt) -> None:
    with pytest.raises(InvalidArgument, match="prompt"):
        prompts_of({"prompt": prompt})


@pytest.mark.parametrize(
    "request_,needle",
    [
        ({"truncate_prompt_tokens": 4}, "truncate_prompt_tokens"),
        ({"prompt_embeds": "abc"}, "prompt_embeds"),
    ],
)
def test_unsupported(request_, needle) -> None:
    assert needle in unsupported_reason({"prompt": "a", **request_})


def test_nulls_are_not_requests() -> None:
    assert (
        unsupported_reason({"prompt": "a", "suffix": None, "truncate_prompt_tokens": None}) is None
    )


def test_preprocessor_paths() -> None:
    texts = PRE.tokenize_completion({"prompt": ["Hello", "world"]})
    assert [t.ids for t in texts] == [[19556], [6693]]
    ids = PRE.tokenize_completion({"prompt": [1, 2, 3]}, token_strs=True)[0]
    assert ids.ids == [1, 2, 3] and ids.token_strs == ["<|im_start|>", "<|im_end|>", "<repo_name>"]
    with pytest.raises(InvalidArgument, match="outside the vocabulary"):
        PRE.tokenize_completion({"prompt": [49152]})
    with pytest.raises(LimitExceeded):
        PRE.tokenize_completion({"prompt": list(range(65))})
    with pytest.raises(InvalidArgument, match="suffix is only supported for models with FIM"):
        PRE.tokenize_completion({"prompt": "a", "suffix": "b"})  # vLLM 0.32's 400
    with pytest.raises(InvalidArgument, match="add_special_tokens"):
        PRE.tokenize_completion({"prompt": "a", "add_special_tokens": 1})


def test_chat_honours_the_request_add_special_tokens_field() -> None:
    chat = {"messages": [{"role": "user", "content": "hi"}]}
    plain = PRE.tokenize_chat(chat).tokens.ids
    assert PRE.tokenize_chat({**chat, "add_special_tokens": True}).tokens.ids == plain  # no BOS
    with pytest.raises(Unsupported, match="truncate_prompt_tokens"):
        PRE.tokenize_chat({**chat, "truncate_prompt_tokens": 3})
