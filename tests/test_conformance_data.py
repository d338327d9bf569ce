"""tests/data: each item named with its licence, within budget, unpacked outside the clone."""

from __future__ import annotations

import stat

import pytest

from conformance_data import DATA, data_path
from support import REPO

# The budget for conformance data kept in the repository.
MAX_BYTES = 20 * 1024 * 1024


def test_every_item_is_named_in_the_readme_with_a_licence_beside_it() -> None:
    readme = (DATA / "README.md").read_text(encoding="utf-8")
    tokenizers = DATA / "tokenizers"
    for archive in sorted(tokenizers.glob("*.tar.xz")):
        assert f"`{archive.name}`" in readme, archive.name
    for licence in sorted(tokenizers.glob("LICENSE.*")) + sorted(tokenizers.glob("NOTICE.*")):
        assert f"`{licence.name}`" in readme, licence.name
    for folder in sorted(p for p in (DATA / "vectors").iterdir() if p.is_dir()):
        assert f"`{folder.name}`" in readme, folder.name
        licences = [p.name for p in folder.glob("LICENSE.*")]
        assert licences and all(f"`{name}`" in readme for name in licences), folder.name


def test_the_data_stays_within_its_budget() -> None:
    size = sum(p.stat().st_size for p in DATA.rglob("*") if p.is_file())
    assert size <= MAX_BYTES, f"tests/data holds {size / 2**20:.1f} MB (budget 20 MB)"


def test_archives_unpack_read_only_outside_the_checkout() -> None:
    folder = data_path("tokenizers", "gpt2")
    assert folder.is_dir() and not folder.is_relative_to(REPO)
    assert sorted(p.name for p in folder.iterdir()) == ["tokenizer.json", "tokenizer_config.json"]
    assert not folder.joinpath("tokenizer.json").stat().st_mode & stat.S_IWUSR
    assert data_path("tokenizers", "gpt2") == folder  # unpacked once per process
    cases = data_path("vectors", "chat-templates", "e2e_chat_template_cases.json")
    assert cases.is_file() and not cases.is_relative_to(REPO)


def test_plain_files_are_used_in_place_and_the_default_tokenizer_is_the_embedded_one() -> None:
    assert data_path("vectors", "llama.cpp") == DATA / "vectors" / "llama.cpp"
    embedded = REPO / "src" / "tokenkeys" / "data" / "smollm2-135m-instruct"
    assert data_path("tokenizers", "smollm2-135m-instruct") == embedded


def test_a_missing_item_fails_instead_of_skipping() -> None:
    with pytest.raises(FileNotFoundError, match="tests/data/README.md"):
        data_path("tokenizers", "no-such-tokenizer")
