"""The ``transformers5`` backend: the folder as transformers 5 builds it, on tokenizers alone.

Proven here against the installed transformers when it is a 5.x release (the class rebuild is
the same from 5.0 on for the classes reproduced), and in tests/realengine against transformers
5.19.0 itself and a live vLLM 0.32.0.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tokenkeys.artifacts import pull
from tokenkeys.client import TokenizerClient
from tokenkeys.errors import TokenizerLoadError
from tokenkeys.limits import Limits
from tokenkeys.preprocess import Preprocessor
from tokenkeys.server.runtime.loading import ModelSource, load_models
from tokenkeys.tokenizer import Tokenizer, TokenizerOptions, default_tokenizer_path

from conformance_data import data_path
from text_corpus import all_strings

# Texts where SmolLM2's tokenizer.json (Digits pre-tokenizer) and transformers 5's GPT2Tokenizer
# (GPT-2 pre-tokenization only) give different ids: a space before a Unicode numeral.
NUMERALS = ["x ١٢٣ hello", " ²³", "x ½ 3", " ٣", "costs ¾ of ৫ ๑๒"]
REPRODUCED = ("smollm2-135m-instruct", "gpt2", "qwen2.5-instruct")


def _load(path: Path, backend: str) -> Tokenizer:
    return Tokenizer.load(path, TokenizerOptions(backend=backend))


def _ids(tok: Tokenizer, texts: list[str], special: bool) -> list[list[int]]:
    return [
        e.ids for e in tok.backend.encode_batch(texts, add_special_tokens=special, offsets=False)
    ]


def test_smollm2_numerals_follow_gpt2_pre_tokenization() -> None:
    folder = default_tokenizer_path()
    rebuilt, as_is = _load(folder, "transformers5"), _load(folder, "tokenizers")
    assert _ids(rebuilt, ["x ١٢٣ hello"], False) == [[104, 16936, 111, 164, 112, 164, 113, 33662]]
    assert _ids(as_is, ["x ١٢٣ hello"], False) == [[104, 216, 164, 111, 164, 112, 164, 113, 33662]]
    # ASCII digits have no merges with a space in this vocabulary: both agree there.
    assert _ids(rebuilt, ["a 123"], False) == _ids(as_is, ["a 123"], False)


def test_the_fingerprint_tells_the_backends_apart() -> None:
    folder = default_tokenizer_path()
    prints = {b: _load(folder, b).fingerprint for b in ("tokenizers", "transformers5")}
    assert prints["tokenizers"] != prints["transformers5"]
    assert _load(folder, "transformers5").fingerprint == prints["transformers5"]


@pytest.mark.parametrize("name", REPRODUCED)
def test_equals_the_installed_transformers_5(name: str) -> None:
    transformers = pytest.importorskip("transformers")
    if not transformers.__version__.startswith("5."):
        pytest.skip(f"transformers {transformers.__version__} installed; the reference is 5.x")
    folder = data_path("tokenizers", name)
    ref = transformers.AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
    tok = _load(folder, "transformers5")
    texts = all_strings() + NUMERALS
    for special in (False, True):
        got = _ids(tok, texts, special)
        assert got == [ref(t, add_special_tokens=special)["input_ids"] for t in texts]
        for skip in (False, True):
            want = [ref.decode(ids, skip_special_tokens=skip) for ids in got]
            assert tok.backend.decode_batch(got, skip_special_tokens=skip) == want


def test_a_router_pulls_and_reproduces_the_transformers5_ids(grpc_server, tmp_path: Path) -> None:
    """The backend travels in the identity: a pulling router tokenizes as vLLM 0.32 does, with
    no transformers installed on either side."""
    options = TokenizerOptions(backend="transformers5")
    server = grpc_server(load_models([ModelSource.default()], options, Limits()))
    tokenizer = pull(server.target, cache=tmp_path)
    assert tokenizer.options.backend == "transformers5"
    assert tokenizer.fingerprint == server.models.get(None).tokenizer.fingerprint
    with TokenizerClient(server.target) as client:
        remote = [list(r.ids) for r in client.tokenize(NUMERALS).results]
    assert remote == [r.ids for r in Preprocessor(tokenizer).tokenize_prompts(NUMERALS)]
    assert remote[0] == [104, 16936, 111, 164, 112, 164, 113, 33662]


def test_an_unknown_tokenizer_class_is_refused_not_guessed() -> None:
    folder = data_path("tokenizers", "phi-3-mini")  # LlamaTokenizer: not reproduced
    with pytest.raises(TokenizerLoadError) as caught:
        _load(folder, "transformers5")
    assert "tokenizer_class 'LlamaTokenizer'" in caught.value.message
    assert caught.value.field == "backend"


def test_config_bos_and_eos_flags_do_not_reach_the_class(tmp_path: Path) -> None:
    """transformers 5 keeps the file's post-processor for these classes (5.19.0, 5.24.0)."""
    folder = tmp_path / "tok"
    shutil.copytree(default_tokenizer_path(), folder)
    config_path = folder / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config.update(add_bos_token=True, add_eos_token=True)
    config_path.write_text(json.dumps(config))
    tok = _load(folder, "transformers5")
    assert _ids(tok, ["hi"], True) == _ids(tok, ["hi"], False) == [[6004]]
    transformers = pytest.importorskip("transformers")
    if transformers.__version__.startswith("5."):
        ref = transformers.AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
        assert ref("hi")["input_ids"] == [6004]
