"""The prompt-embeds extra key: torch.save files read without torch, digested as vLLM does.

The files in tests/data/torch_tensors were written by torch 2.13 (the vLLM engine environment's,
``tests/realengine/make_torch_files.py``) with the digests torch computes as vLLM 0.32's
``_gen_prompt_embeds_extra_hash_keys`` does; the reader must give the same bytes and digests,
and refuse every file it cannot read exactly, naming ``prompt_embeds``.
"""

from __future__ import annotations

import base64
import json

import pytest

from tokenkeys.errors import InvalidArgument
from tokenkeys.keys.prompt_embeds import prompt_embeds_of
from tokenkeys.keys.torch_file import load_tensor

from conformance_data import data_path

DATA = data_path("torch_tensors")
EXPECTED = json.loads((DATA / "expected.json").read_text())
UNIT = EXPECTED["hash_unit"]


def payload(name: str) -> str:
    return base64.b64encode((DATA / f"{name}.pt").read_bytes()).decode()


@pytest.mark.parametrize("name", sorted(EXPECTED["tensors"]))
def test_digests_equal_torchs(name: str) -> None:
    want = EXPECTED["tensors"][name]
    got = prompt_embeds_of(payload(name), dtype=want["dtype"], hash_unit=UNIT)
    assert [got.num_tokens, got.hidden_size] == want["shape"]
    assert [d.hex() for d in got.digests] == want["digests"]
    assert got.token_ids == [0] * want["shape"][0]


def test_an_offset_view_reads_only_its_rows() -> None:
    tensor = load_tensor((DATA / "f32_offset_rows.pt").read_bytes())
    assert tensor.shape == (8, 4) and len(tensor.data) == 8 * 4 * 4


@pytest.mark.parametrize(
    ("name", "dtype", "says"),
    [
        ("f32_transposed", "float32", "strided view"),
        ("int64_8x4", "float32", "LongStorage"),
        ("f64_8x4", "float32", "DoubleStorage"),
        ("legacy_8x4", "float32", "legacy format"),
        ("dict_of_tensor", "float32", "not one tensor"),
        ("bf16_10x8", "float32", "dtype bfloat16 is not the model's float32"),
    ],
)
def test_what_cannot_be_read_exactly_is_refused(name: str, dtype: str, says: str) -> None:
    with pytest.raises(InvalidArgument, match=says) as raised:
        prompt_embeds_of(payload(name), dtype=dtype, hash_unit=UNIT)
    assert raised.value.field == "prompt_embeds"


def test_bad_base64_and_wrong_hidden_size_are_refused() -> None:
    with pytest.raises(InvalidArgument, match="base64"):
        prompt_embeds_of("not base64!", dtype="float32", hash_unit=UNIT)
    with pytest.raises(InvalidArgument, match="hidden_size 6 does not match .* 8"):
        prompt_embeds_of(payload("f32_9x6"), dtype="float32", hash_unit=UNIT, hidden_size=8)


def test_a_pickle_naming_anything_else_runs_nothing() -> None:
    import io
    import pickle
    import zipfile

    class Evil:
        def __reduce__(self):
            return (print, ("ran",))

    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as archive:
        archive.writestr("x/data.pkl", pickle.dumps(Evil(), protocol=2))
    with pytest.raises(InvalidArgument, match=r"names (__builtin__|builtins)\.print"):
        load_tensor(buf.getvalue())


def test_what_save_tensor_writes_reads_back_and_keys_the_same() -> None:
    from tokenkeys.keys.torch_file import Tensor, save_tensor

    tensor = load_tensor((DATA / "bf16_10x8.pt").read_bytes())
    again = save_tensor(Tensor(tensor.dtype, tensor.shape, tensor.data))
    assert load_tensor(again) == tensor
    encoded = base64.b64encode(again).decode()
    got = prompt_embeds_of(encoded, dtype="bfloat16", hash_unit=UNIT)
    assert [d.hex() for d in got.digests] == EXPECTED["tensors"]["bf16_10x8"]["digests"]
