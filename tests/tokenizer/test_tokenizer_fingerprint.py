"""Fingerprint: same bytes and options anywhere give the same value; any change differs."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from tokenkeys.tokenizer import Tokenizer, TokenizerOptions, default_tokenizer_path, read_folder
from tokenkeys.tokenizer.fingerprint import canonical_manifest, fingerprint


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    dest = tmp_path / "tok"
    shutil.copytree(default_tokenizer_path(), dest)
    return dest


def fp(path: Path, **options: object) -> str:
    return Tokenizer.load(path, TokenizerOptions(**options)).fingerprint


def test_same_bytes_in_another_folder_with_other_mtimes(folder: Path, tmp_path: Path) -> None:
    other = tmp_path / "elsewhere" / "renamed"
    shutil.copytree(folder, other)
    for f in other.iterdir():
        os.utime(f, (1_000_000, 1_000_000))
    assert fp(folder) == fp(other) == fp(default_tokenizer_path())


def test_file_order_does_not_matter(folder: Path) -> None:
    entries = read_folder(folder).entries
    opts = TokenizerOptions()
    assert fingerprint(entries, opts, "tokenizers/1") == fingerprint(
        tuple(reversed(entries)), opts, "tokenizers/1"
    )


def test_unrelated_files_do_not_matter(folder: Path) -> None:
    before = fp(folder)
    (folder / "README.md").write_text("not part of the tokenizer")
    (folder / "model.safetensors").write_bytes(b"\0" * 10)
    assert fp(folder) == before


def test_any_byte_change_changes_it(folder: Path) -> None:
    before = fp(folder)
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config["model_max_length"] = 4096
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    assert fp(folder) != before


def test_a_new_file_changes_it(folder: Path) -> None:
    before = fp(folder)
    (folder / "generation_config.json").write_text('{"eos_token_id": [2, 0]}')
    assert fp(folder) != before


@pytest.mark.parametrize(
    "option",
    [
        {"backend": "transformers"},
        {"add_special_tokens_completion": False},
        {"add_special_tokens_chat": True},
        {"nul": "strip"},
        {"split_special_tokens": True},
        {"chat_template_sha256": "ab" * 32},
    ],
)
def test_every_behaviour_default_changes_it(folder: Path, option: dict) -> None:
    assert fp(folder, **option) != fp(folder)


def test_manifest_is_canonical_json(folder: Path) -> None:
    doc = json.loads(canonical_manifest(read_folder(folder).entries, TokenizerOptions(), "b/1"))
    assert doc["format"] == "tokenkeys.fingerprint/1"
    assert [f["path"] for f in doc["files"]] == sorted(f["path"] for f in doc["files"])
    assert doc["behaviour"] == "b/1"
