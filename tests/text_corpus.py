"""The project's text corpus: every string of the tokenizer vectors in tests/data, deduplicated.

llama.cpp's vocabulary test inputs (``vectors/llama.cpp/ggml-vocab-*.gguf.inp`` with the ids
Hugging Face tokenizers gave, per vocabulary) and the multilingual inputs
(``vectors/multilingual/inputs.json``). Shared by the conformance suites that compare tokenkeys
with a reference tokenizer or a real engine.
"""

from __future__ import annotations

import json

from conformance_data import data_path

# llama.cpp vocabularies whose inputs join the corpus.
LLAMA_CPP_VOCABS = ("gpt-2", "qwen2", "phi-3", "llama-spm")


def llama_cpp_cases(vocab: str) -> list[tuple[str, list[int]]]:
    """(text, expected ids) pairs of one llama.cpp vocabulary test."""
    base = data_path("vectors", "llama.cpp")
    texts = (base / f"ggml-vocab-{vocab}.gguf.inp").read_text(encoding="utf-8")
    outs = (base / f"ggml-vocab-{vocab}.gguf.out").read_text(encoding="utf-8")
    strings = texts.split("\n__ggml_vocab_test__\n")[:-1]
    expected = [[int(x) for x in line.split()] for line in outs.split("\n")[: len(strings)]]
    return list(zip(strings, expected, strict=True))


def all_strings() -> list[str]:
    """Every corpus text once, in a stable order."""
    out: list[str] = []
    for vocab in LLAMA_CPP_VOCABS:
        out += [s for s, _ in llama_cpp_cases(vocab)]
    inputs = json.loads((data_path("vectors", "multilingual") / "inputs.json").read_text())
    out += [e["text"] for e in inputs["inputs"]]
    return list(dict.fromkeys(out))
