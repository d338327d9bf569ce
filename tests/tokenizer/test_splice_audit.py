"""Which tokenizers may be cut, and the reasons given for those that may not."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tokenkeys.tokenizer import Tokenizer, TokenizerOptions, default_tokenizer_path

from built_tokenizers import write_folder
from conformance_data import data_path


def _load(path: Path, **options) -> Tokenizer:
    return Tokenizer.load(path, TokenizerOptions(**options))


@pytest.mark.parametrize(
    ("name", "backend"),
    [
        ("qwen2.5-instruct", "tokenizers"),
        ("qwen2.5-instruct", "transformers5"),
        ("phi-3-mini", "tokenizers"),
        ("t5-small", "tokenizers"),
        ("gpt2", "transformers5"),
    ],
)
def test_the_data_tokenizers_splice(name: str, backend: str) -> None:
    decision = _load(data_path("tokenizers", name), backend=backend).splice
    assert decision.usable and decision.reason == ""


def test_t5_adds_its_eos_as_a_fixed_suffix() -> None:
    plan = _load(data_path("tokenizers", "t5-small")).splice.plan
    assert plan is not None and plan.prefix == () and plan.suffix == (1,)


def test_split_special_tokens_leaves_no_cut_when_every_added_token_is_special() -> None:
    decision = _load(default_tokenizer_path(), split_special_tokens=True).splice
    assert not decision.usable
    assert "split_special_tokens" in decision.reason


def test_metaspace_first_is_refused_with_its_reason(tmp_path: Path) -> None:
    decision = _load(write_folder("metaspace-first", tmp_path)).splice
    assert not decision.usable and "prepend_scheme 'first'" in decision.reason


def _edited(tmp_path: Path, edit) -> Path:
    source = default_tokenizer_path()
    folder = tmp_path / "edited"
    folder.mkdir()
    doc = json.loads((source / "tokenizer.json").read_text())
    edit(doc)
    (folder / "tokenizer.json").write_text(json.dumps(doc))
    (folder / "tokenizer_config.json").write_text((source / "tokenizer_config.json").read_text())
    return folder


def test_bpe_dropout_is_refused(tmp_path: Path) -> None:
    folder = _edited(tmp_path, lambda d: d["model"].update(dropout=0.1))
    decision = _load(folder).splice
    assert not decision.usable and "dropout" in decision.reason


def test_truncation_in_tokenizer_json_is_refused(tmp_path: Path) -> None:
    def truncate(doc: dict) -> None:
        doc["truncation"] = {
            "direction": "Right", "max_length": 8, "strategy": "LongestFirst", "stride": 0
        }  # fmt: skip

    decision = _load(_edited(tmp_path, truncate)).splice
    assert not decision.usable and "truncation" in decision.reason


def test_the_transformers_backend_is_refused() -> None:
    decision = _load(default_tokenizer_path(), backend="transformers").splice
    assert not decision.usable and "transformers" in decision.reason


def test_a_tokenizer_loaded_again_reuses_its_decisions_and_other_options_do_not(
    tmp_path: Path,
) -> None:
    """The decisions are kept by fingerprint (files, options, behaviour): the same folder loaded
    again reuses them; other options, or a copy whose tokenizer.json differs, decide afresh."""
    first, again = _load(default_tokenizer_path()), _load(default_tokenizer_path())
    assert first is not again
    assert again.splice is first.splice and again.token_floor is first.token_floor
    split = _load(default_tokenizer_path(), split_special_tokens=True)
    assert split.fingerprint != first.fingerprint and split.splice is not first.splice
    folder = tmp_path / "other"
    folder.mkdir()
    for file in default_tokenizer_path().iterdir():
        if file.is_file():
            (folder / file.name).write_bytes(file.read_bytes())
    spec = json.loads((folder / "tokenizer.json").read_text())
    spec["added_tokens"] = [dict(a, rstrip=True) for a in spec["added_tokens"]]
    (folder / "tokenizer.json").write_text(json.dumps(spec))
    other = _load(folder)
    assert other.fingerprint != first.fingerprint
    assert other.token_floor is None and first.token_floor is not None  # decided again
