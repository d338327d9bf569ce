"""Tokenize and decode a corpus with transformers itself; run by the ENGINE's Python.

Usage: ``python hf_tokenize.py REQUEST.json`` where the request is
``{"folder": ..., "texts": [...]}``; prints ``{"version", "class", "ids": {"false": [...],
"true": [...]}, "decoded": {"false": [...], "true": [...]}}`` (ids per add_special_tokens, the
decode of the add_special_tokens=True ids per skip_special_tokens). This is exactly the
``AutoTokenizer`` call vLLM makes for a model folder (``vllm/tokenizers/hf.py``).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def main(path: str) -> None:
    import transformers

    request = json.loads(Path(path).read_text(encoding="utf-8"))
    tok = transformers.AutoTokenizer.from_pretrained(request["folder"], local_files_only=True)
    texts = request["texts"]
    ids = {
        str(s).lower(): [tok(t, add_special_tokens=s)["input_ids"] for t in texts]
        for s in (False, True)
    }
    decoded = {
        str(skip).lower(): [tok.decode(i, skip_special_tokens=skip) for i in ids["true"]]
        for skip in (False, True)
    }
    out = {"version": transformers.__version__, "class": type(tok).__name__, "ids": ids}
    out["decoded"] = decoded
    sys.stdout.write(json.dumps(out))


if __name__ == "__main__":
    main(sys.argv[1])
