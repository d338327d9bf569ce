"""The ``transformers5`` backend equals transformers 5.19.0 itself, the release vLLM 0.32 runs.

transformers is run inside the engine environment (``hf_tokenize.py``), on the project's text
corpus plus texts with Unicode numerals after a space (where SmolLM2's tokenizer.json and
transformers 5 disagree), for every folder whose tokenizer class the backend reproduces.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tokenkeys.tokenizer import Tokenizer, TokenizerOptions

from conformance_data import data_path
from text_corpus import all_strings
from vllm_env import TRANSFORMERS_VERSION

pytestmark = pytest.mark.realengine

SCRIPT = Path(__file__).resolve().parent / "hf_tokenize.py"
NUMERALS = ["x ١٢٣ hello", " ²³", "x ½ 3", " ٣", "costs ¾ of ৫ ๑๒", "Ⅻ 12", " ¹⁄₂"]
FOLDERS = ("smollm2-135m-instruct", "gpt2", "qwen2.5-instruct")


def _reference(python: Path, folder: Path, texts: list[str], tmp_path: Path) -> dict:
    request = tmp_path / "request.json"
    request.write_text(json.dumps({"folder": str(folder), "texts": texts}), encoding="utf-8")
    done = subprocess.run(
        [str(python), str(SCRIPT), str(request)], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout)


@pytest.mark.parametrize("name", FOLDERS)
def test_transformers5_backend_equals_transformers_5_19(
    name: str, vllm_python: Path, tmp_path: Path
) -> None:
    folder = data_path("tokenizers", name)
    texts = all_strings() + NUMERALS
    ref = _reference(vllm_python, folder, texts, tmp_path)
    assert ref["version"] == TRANSFORMERS_VERSION
    backend = Tokenizer.load(folder, TokenizerOptions(backend="transformers5")).backend
    for special in (False, True):
        got = backend.encode_batch(texts, add_special_tokens=special, offsets=False)
        assert [e.ids for e in got] == ref["ids"][str(special).lower()], f"{name} {special}"
    for skip in (False, True):
        decoded = backend.decode_batch(ref["ids"]["true"], skip_special_tokens=skip)
        assert decoded == ref["decoded"][str(skip).lower()], f"{name} skip={skip}"
