"""Write the torch.save files the prompt-embeds reader is tested on, and torch's own digests.

Run by the vLLM engine environment's Python (torch 2.13):
``python make_torch_files.py tests/data/torch_tensors``. The files and ``expected.json`` are
committed; this script says how they were made. Each digest is
``sha256(tensor_data(t[start:end]))`` as vLLM 0.32 computes it (``vllm/v1/utils.py``
``tensor_data``) for blocks of ``HASH_UNIT`` rows.
"""

import hashlib
import io
import json
import sys
from pathlib import Path

import torch

HASH_UNIT = 4


def tensor_data(t: torch.Tensor) -> bytes:
    return bytes(t.flatten().cpu().contiguous().view(torch.uint8).numpy().data)


def digests(t: torch.Tensor) -> list[str]:
    t = t.squeeze(0) if t.dim() > 2 else t
    n = t.shape[0] // HASH_UNIT
    return [
        hashlib.sha256(tensor_data(t[i * HASH_UNIT : (i + 1) * HASH_UNIT])).hexdigest()
        for i in range(n)
    ]


def main(out: Path) -> None:
    torch.manual_seed(0)
    cases = {
        "bf16_10x8": torch.randn(10, 8).to(torch.bfloat16),
        "f32_9x6": torch.randn(9, 6),
        "f16_8x5": torch.randn(8, 5).to(torch.float16),
        "f32_batch1_8x4": torch.randn(1, 8, 4),
        "f32_offset_rows": torch.randn(12, 4)[3:11],
    }
    refused = {
        "f32_transposed": torch.randn(4, 8).t(),
        "int64_8x4": torch.arange(32).reshape(8, 4),
        "f64_8x4": torch.randn(8, 4, dtype=torch.float64),
    }
    expected = {}
    for name, t in {**cases, **refused}.items():
        buf = io.BytesIO()
        torch.save(t, buf)
        (out / f"{name}.pt").write_bytes(buf.getvalue())
        if name in cases:
            shape = list(t.squeeze(0).shape if t.dim() > 2 else t.shape)
            expected[name] = {
                "dtype": str(t.dtype).removeprefix("torch."),
                "shape": shape,
                "digests": digests(t),
            }
    legacy = io.BytesIO()
    torch.save(torch.randn(8, 4), legacy, _use_new_zipfile_serialization=False)
    (out / "legacy_8x4.pt").write_bytes(legacy.getvalue())
    both = io.BytesIO()
    torch.save({"a": torch.randn(8, 4)}, both)
    (out / "dict_of_tensor.pt").write_bytes(both.getvalue())
    (out / "expected.json").write_text(
        json.dumps({"hash_unit": HASH_UNIT, "tensors": expected}, indent=1) + "\n"
    )


if __name__ == "__main__":
    main(Path(sys.argv[1]))
