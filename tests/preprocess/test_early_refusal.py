"""A request of several large texts is refused at the first text over a token limit.

The backend is the real one, wrapped only to count the texts it was asked to encode.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from tokenkeys.errors import LimitExceeded
from tokenkeys.limits import Limits
from tokenkeys.preprocess import Preprocessor
from tokenkeys.tokenizer import Tokenizer, default_tokenizer_path


class CountingBackend:
    """The real backend; remembers how many texts each encode call carried."""

    def __init__(self, real: object) -> None:
        self._real = real
        self.calls: list[int] = []

    def __getattr__(self, name: str) -> object:
        return getattr(self._real, name)

    def encode_batch(self, texts, **kw):  # noqa: ANN001, ANN003, ANN201
        self.calls.append(len(texts))
        return self._real.encode_batch(texts, **kw)


@pytest.fixture(scope="module")
def tokenizer() -> Tokenizer:
    return Tokenizer.load(default_tokenizer_path())


def _counting(tokenizer: Tokenizer, limits: Limits) -> tuple[Preprocessor, CountingBackend]:
    backend = CountingBackend(tokenizer.backend)
    pre = Preprocessor(replace(tokenizer, backend=backend), limits)
    backend.calls.clear()  # the load-time probes of the cut plan (Tokenizer.splice) are no request
    return pre, backend


def test_large_texts_stop_at_the_first_over_the_per_text_limit(tokenizer: Tokenizer) -> None:
    pre, backend = _counting(tokenizer, Limits(max_tokens_per_text=100_000))
    big = "word " * 300_000  # 1.5 M characters, about 300k tokens
    with pytest.raises(LimitExceeded) as info:
        pre.tokenize_prompts([big, big, big])
    assert "texts[0]" in info.value.message
    assert backend.calls == [1], "the second and third texts were encoded anyway"


def test_large_texts_stop_when_the_request_total_is_crossed(tokenizer: Tokenizer) -> None:
    pre, backend = _counting(tokenizer, Limits(max_tokens_per_request=500_000))
    big = "word " * 300_000
    with pytest.raises(LimitExceeded) as info:
        # Three different texts: a text seen before would come from the tokenize cache.
        pre.tokenize_prompts([big + "a", big + "b", big + "c"])
    assert "max_tokens_per_request" in info.value.message
    assert backend.calls == [1, 1]


def test_small_requests_are_one_batch_with_the_same_ids(tokenizer: Tokenizer) -> None:
    pre, backend = _counting(tokenizer, Limits())
    texts = ["a b c", "hello world", "日本語"]
    batched = pre.tokenize_prompts(texts)
    assert backend.calls == [3]
    one_by_one = [pre.tokenize_prompts([t])[0] for t in texts]
    assert [r.ids for r in batched] == [r.ids for r in one_by_one]


def test_a_text_certain_to_exceed_the_limit_is_refused_without_encoding(
    tokenizer: Tokenizer,
) -> None:
    pre, backend = _counting(tokenizer, Limits(max_tokens_per_text=32_768))
    with pytest.raises(LimitExceeded) as info:
        pre.tokenize_prompts(["世界" * 2_000_000])  # 12 MB: at least 148k tokens by size
    assert "at least" in info.value.message and "max_tokens_per_text" in info.value.message
    assert backend.calls == [], "the text was encoded before it was refused"


def test_a_text_the_floor_cannot_decide_is_encoded_then_refused(tokenizer: Tokenizer) -> None:
    pre, backend = _counting(tokenizer, Limits(max_tokens_per_text=1_000))
    with pytest.raises(LimitExceeded) as info:
        pre.tokenize_prompts(["word " * 2_000])  # 10 kB: floor 124, count 2001
    assert "amounts to 2001 tokens" in info.value.message  # with the BOS
    assert backend.calls == [1]
