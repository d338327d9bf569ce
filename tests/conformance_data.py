"""The conformance data of the tests: real tokenizers and expected-output vectors in tests/data.

Everything the tests and benchmarks compare against is in the repository (tests/data/README.md
names each source and its licence), so a clean clone needs nothing beside it. Large items are
stored compressed: a tokenizer folder as ``<name>.tar.xz``, a large vector file as
``<file>.xz``. They are unpacked on first use into one temporary folder per process (removed
at exit), never into the checkout, and made read-only there: no test may change them.
"""

from __future__ import annotations

import atexit
import functools
import lzma
import os
import shutil
import tarfile
import tempfile
from pathlib import Path

from tokenkeys.tokenizer import DEFAULT_MODEL_NAME, default_tokenizer_path

DATA = Path(__file__).resolve().parent / "data"


def data_path(*parts: str) -> Path:
    """The file or folder ``tests/data/<parts...>``, unpacked when it is stored compressed.

    ``data_path("tokenizers", "qwen2.5-instruct")`` is a tokenizer folder,
    ``data_path("vectors", "llama.cpp")`` a folder of vectors, and
    ``data_path("vectors", "chat-templates", "e2e_chat_template_cases.json")`` a file stored as
    ``.json.xz``. A name that is in none of these forms raises FileNotFoundError: missing
    conformance data fails the test, it never skips it.
    """
    if parts == ("tokenizers", DEFAULT_MODEL_NAME):
        # The package embeds this tokenizer (src/tokenkeys/data, with its NOTICE): no second copy.
        return default_tokenizer_path()
    plain = DATA.joinpath(*parts)
    return plain if plain.exists() else _unpacked(parts)


@functools.cache
def _unpacked(parts: tuple[str, ...]) -> Path:
    plain, target = DATA.joinpath(*parts), _scratch_dir().joinpath(*parts)
    archive, packed = plain.with_name(plain.name + ".tar.xz"), plain.with_name(plain.name + ".xz")
    target.parent.mkdir(parents=True, exist_ok=True)
    if archive.is_file():
        with tarfile.open(archive, "r:xz") as tar:
            names = {m.name.split("/", 1)[0] for m in tar.getmembers()}
            if names != {plain.name}:
                raise ValueError(f"{archive}: holds {sorted(names)}, expected only {plain.name}/")
            # The "data" filter refuses links and paths outside the target (Python >= 3.11.4).
            extra = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}
            tar.extractall(target.parent, **extra)
    elif packed.is_file():
        with lzma.open(packed) as src, open(target, "wb") as dst:
            shutil.copyfileobj(src, dst)
    else:
        raise FileNotFoundError(
            f"{plain} is not in tests/data (neither as is, nor as .tar.xz or .xz); "
            "see tests/data/README.md"
        )
    _read_only(target)
    return target


def _read_only(path: Path) -> None:
    files = [path] if path.is_file() else [p for p in path.rglob("*") if p.is_file()]
    for file in files:
        os.chmod(file, 0o444)


@functools.cache
def _scratch_dir() -> Path:
    scratch = Path(tempfile.mkdtemp(prefix="tokenkeys-test-data-"))
    atexit.register(shutil.rmtree, scratch, ignore_errors=True)
    return scratch
