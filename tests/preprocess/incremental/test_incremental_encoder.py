"""Spliced ids equal a full encode: every tokenizer in tests/data, both backends, built traps.

Prompts grow by appending fragments chosen to cut where caches break: inside special-token
text (``<|`` then ``im_end|>``), inside whitespace runs, between ``\\r`` and ``\\n``, inside
digit runs, before combining marks, inside words, at characters a normalizer changes (NFKC,
lowercase, NFC). The reference is the tokenizer's own encode of the whole text.
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tokenkeys.preprocess import Preprocessor
from tokenkeys.preprocess.incremental import IncrementalEncoder, IncrementalOptions
from tokenkeys.tokenizer import Tokenizer, TokenizerOptions, Truncation, default_tokenizer_path
from tokenkeys.tokenizer.splice import AddedTokenMatch, SplicePlan
from tokenkeys.tokenizer.splice_audit import SpliceDecision

from built_tokenizers import BUILT, write_folder
from conformance_data import data_path

DATA = ("smollm2-135m-instruct", "qwen2.5-instruct", "phi-3-mini", "gpt2", "t5-small")
TRANSFORMERS5 = ("smollm2-135m-instruct", "qwen2.5-instruct", "gpt2")
CASES = (
    [(name, "tokenizers") for name in (*DATA, *BUILT)]
    + [(name, "transformers5") for name in TRANSFORMERS5]
    + [("overlapping-specials", "transformers5"), ("strip-flags", "transformers5")]
)
FRAGMENTS = [
    "a", "b", "ab", "word", " word", "Hello", " the", "fox", "FOX", "İ", "ß", "ﬁ", "Ｆ", "①",
    "e", "\u0301", "\u0308", "é", "漢", "字", "😀", "\u200d", " ", "  ", "\t", "\r", "\n", "\r\n",
    "\n\n", "\u3000", "\x1c", "\xa0", "1", "23", "456", ".", ",", "'s", "<", "|", ">", "<|", "|>",
    "EOS", "im_", "end", "start", "<s", ">", "</", "mask", "<0x41>", "\x00",
]  # fmt: skip
SETTINGS = settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


def _path(name: str, root: Path) -> Path:
    if name in BUILT:
        return write_folder(name, root)
    if name == "smollm2-135m-instruct":
        return default_tokenizer_path()
    return data_path("tokenizers", name)


@pytest.fixture(scope="module", params=CASES, ids=lambda c: f"{c[0]}-{c[1]}")
def tokenizer(request, tmp_path_factory) -> Tokenizer:
    name, backend = request.param
    path = _path(name, tmp_path_factory.mktemp("tok"))
    return Tokenizer.load(path, TokenizerOptions(backend=backend))


def _fragments(tokenizer: Tokenizer) -> st.SearchStrategy[str]:
    added = sorted({a.content for a in tokenizer.specials.added} | {"<|im_start|>", "<|im_end|>"})
    partial = [t[: len(t) // 2] for t in added] + [t[len(t) // 2 :] for t in added]
    return st.sampled_from(FRAGMENTS + added[:40] + partial[:40])


def _full(tokenizer: Tokenizer, text: str, specials: bool) -> list[int]:
    return tokenizer.encode([text], add_special_tokens=specials)[0].ids


def test_every_tokenizer_here_is_decided(tokenizer: Tokenizer) -> None:
    """The data tokenizers and the built ones (but Metaspace 'first') all splice."""
    encoder = IncrementalEncoder(tokenizer)
    first = "Metaspace with prepend_scheme 'first'"
    assert encoder.enabled == (first not in encoder.reason), encoder.reason


@SETTINGS
@given(data=st.data(), specials=st.booleans())
def test_growing_prompts_equal_a_full_encode(tokenizer: Tokenizer, data, specials: bool) -> None:
    encoder = IncrementalEncoder(tokenizer, IncrementalOptions(verify_every=0))
    frags = data.draw(st.lists(_fragments(tokenizer), min_size=1, max_size=30))
    texts = ["".join(frags[:k]) for k in range(1, len(frags) + 1)]
    for text in texts:
        (got,) = encoder.encode([text], add_special_tokens=specials)
        assert got.ids == _full(tokenizer, text, specials), text
    # A batch of them at once, after the cache holds their prefixes.
    batch = encoder.encode(texts[::-1], add_special_tokens=specials)
    assert [e.ids for e in batch] == [_full(tokenizer, t, specials) for t in texts[::-1]]


def _messages(draw, frags: st.SearchStrategy[str], turns: int) -> list[dict]:
    roles = ["user", "assistant"]
    return [
        {"role": roles[i % 2], "content": "".join(draw(st.lists(frags, max_size=12)))}
        for i in range(turns)
    ]


@SETTINGS
@given(data=st.data(), specials=st.sampled_from([None, True, False]))
def test_multi_turn_chats_equal_a_full_encode(tokenizer: Tokenizer, data, specials) -> None:
    if not tokenizer.chat_templates:
        return
    pre = Preprocessor(tokenizer, incremental=IncrementalOptions(verify_every=0))
    messages = _messages(data.draw, _fragments(tokenizer), data.draw(st.integers(1, 8)))
    expect_specials = tokenizer.options.add_special_tokens_chat if specials is None else specials
    for turn in range(1, len(messages) + 1, 2):
        body = {"messages": messages[:turn]}
        if specials is not None:
            body["add_special_tokens"] = specials
        chat = pre.tokenize_chat(body)
        assert chat.tokens.ids == _full(tokenizer, chat.prompt, expect_specials)


def test_concurrent_conversations_share_one_cache(tokenizer: Tokenizer) -> None:
    encoder = IncrementalEncoder(tokenizer, IncrementalOptions(verify_every=0))
    plan = tokenizer.splice.plan
    # A token this tokenizer cuts after, standing in for its turn markers.
    mark = max(plan.boundaries, key=len) if plan else "<|im_end|>"
    failures: list[str] = []

    def converse(worker: int) -> None:
        prompt = f"{mark}system\nYou are  terse. 12 34{mark}\n"
        for turn in range(12):
            prompt += f"{mark}user\nq{worker} {turn}  ﬁ\r\n{mark}\n{mark}assistant\n"
            for text in (prompt, prompt + "partial " + mark[:2]):
                (got,) = encoder.encode([text], add_special_tokens=True)
                if got.ids != _full(tokenizer, text, True):
                    failures.append(text)
            prompt += f"a{worker}{turn}é{mark}\n"

    threads = [threading.Thread(target=converse, args=(w,)) for w in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert failures == []
    if encoder.enabled:
        assert encoder.stats.hits > 0


def test_offsets_and_truncation_encode_whole(tokenizer: Tokenizer) -> None:
    encoder = IncrementalEncoder(tokenizer)
    text = "<|im_start|>user\nhi there<|im_end|>\n"
    with_offsets = encoder.encode([text], add_special_tokens=True, offsets=True)
    assert with_offsets == tokenizer.encode([text], add_special_tokens=True, offsets=True)
    cut = Truncation(max_tokens=4, side="left")
    truncated = encoder.encode([text], add_special_tokens=True, truncation=cut)
    assert truncated == tokenizer.encode([text], add_special_tokens=True, truncation=cut)
    if encoder.enabled:
        assert encoder.stats.bypasses == {"offsets": 1, "truncation": 1}
        assert encoder.stats.hits + encoder.stats.misses == 0


def test_a_wrong_cut_is_caught_by_the_guard_and_turns_the_cache_off(caplog) -> None:
    """A plan that cuts inside words (no added token there) is wrong; the guard proves it."""
    tokenizer = Tokenizer.load(default_tokenizer_path())
    wrong = SplicePlan.build(
        [AddedTokenMatch("th", special=False, normalized=False)],
        split_special_tokens=False,
        prefix=(),
        suffix=(),
    )
    encoder = IncrementalEncoder(
        tokenizer, IncrementalOptions(verify_every=1), decision=SpliceDecision(wrong)
    )
    text = "the theory that these things think"
    with caplog.at_level(logging.ERROR):
        (got,) = encoder.encode([text], add_special_tokens=False)
    assert got.ids == _full(tokenizer, text, False)  # the request gets the full encode
    assert encoder.stats.guard_failures == 1 and not encoder.enabled
    assert "sha256" in encoder.reason and "sha256" in caplog.text
    assert len(encoder.cache) == 0
    (after,) = encoder.encode([text + " again"], add_special_tokens=False)
    assert after.ids == _full(tokenizer, text + " again", False)
    assert encoder.stats.bypasses == {"off": 1}


def test_the_guard_checks_one_in_n() -> None:
    tokenizer = Tokenizer.load(default_tokenizer_path())
    encoder = IncrementalEncoder(tokenizer, IncrementalOptions(verify_every=3))
    for turn in range(9):
        encoder.encode([f"<|im_start|>user\n{turn}<|im_end|>\n" * 2], add_special_tokens=False)
    assert encoder.stats.guard_checks == 3 and encoder.stats.guard_failures == 0


def test_a_zero_budget_turns_the_cache_off() -> None:
    tokenizer = Tokenizer.load(default_tokenizer_path())
    encoder = IncrementalEncoder(tokenizer, IncrementalOptions(max_bytes=0))
    assert not encoder.enabled and "0 bytes" in encoder.reason
    (got,) = encoder.encode(["<|im_start|>x<|im_end|>"], add_special_tokens=False)
    assert got.ids == _full(tokenizer, "<|im_start|>x<|im_end|>", False)


def test_the_budget_bounds_the_cache_and_answers_stay_exact() -> None:
    tokenizer = Tokenizer.load(default_tokenizer_path())
    encoder = IncrementalEncoder(tokenizer, IncrementalOptions(max_bytes=20_000, verify_every=0))
    for conv in range(40):
        prompt = f"<|im_start|>system\nconversation {conv}<|im_end|>\n"
        for turn in range(5):
            prompt += f"<|im_start|>user\n{'word ' * 20}{turn}<|im_end|>\n"
            (got,) = encoder.encode([prompt], add_special_tokens=False)
            assert got.ids == _full(tokenizer, prompt, False)
            assert encoder.cache.bytes <= 20_000
    assert encoder.cache.evictions > 0
