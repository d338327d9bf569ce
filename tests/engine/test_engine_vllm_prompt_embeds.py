"""The sidecar's prompt-embeds rules: which bodies pass, and the prompt and context they key.

Against real vLLM (learning the flag and dtype, the keys, the live check):
``tests/realengine/test_vllm_prompt_embeds.py``.
"""

from __future__ import annotations

import base64
import struct

import pytest

from tokenkeys.engine.vllm.prompt_embeds import EmbedsSupport, _encode, embedded_prompt, refusal
from tokenkeys.errors import InvalidArgument
from tokenkeys.keys import KeyContext
from tokenkeys.keys.prompt_embeds import prompt_embeds_of
from tokenkeys.keys.torch_file import Tensor, save_tensor

SUPPORT = EmbedsSupport(hidden_size=4, dtype="bfloat16")


def payload(rows: int, dtype: str = "bfloat16") -> str:
    values = [(i % 13 - 6) / 4 for i in range(rows * 4)]
    return base64.b64encode(save_tensor(Tensor(dtype, (rows, 4), _encode(values, dtype)))).decode()


def test_the_probe_values_encode_exactly_in_every_dtype() -> None:
    values = [-4.0, -0.25, 0.0, 1.75, 4.0]
    as32 = struct.unpack("<5f", _encode(values, "float32"))
    as16 = struct.unpack("<5e", _encode(values, "float16"))
    widened = b"".join(b"\0\0" + _encode([v], "bfloat16") for v in values)
    assert list(as32) == list(as16) == list(struct.unpack("<5f", widened)) == values


def test_a_body_passes_only_when_vllm_takes_embeddings_and_one_tensor_alone() -> None:
    body = {"prompt_embeds": payload(9)}
    assert refusal(SUPPORT, {"prompt": "hi"}, "x") is None
    assert refusal(SUPPORT, body, "x") is None
    field, why = refusal(None, body, "http://vllm") or ("", "")
    assert field == "prompt_embeds" and "--enable-prompt-embeds" in why and "http://vllm" in why
    assert "together with prompt" in refusal(SUPPORT, {**body, "prompt": [1]}, "x")[1]
    two = {"prompt_embeds": [payload(9), payload(9)]}
    assert "several tensors" in refusal(SUPPORT, two, "x")[1]


def test_the_prompt_is_zeros_and_the_context_the_block_digests() -> None:
    salted = KeyContext(cache_salt="s")
    ids, ctx = embedded_prompt(SUPPORT, {"prompt_embeds": [payload(9)]}, salted, 4)
    assert ids == [0] * 9 and ctx.cache_salt == "s"
    assert (
        ctx.prompt_embeds_digests
        == prompt_embeds_of(payload(9), dtype="bfloat16", hash_unit=4).digests
    )
    assert len(ctx.prompt_embeds_digests) == 2


@pytest.mark.parametrize(
    ("body", "says"),
    [
        ({"prompt_embeds": payload(9, "float32")}, "dtype float32 is not the model's bfloat16"),
        (
            {
                "prompt_embeds": base64.b64encode(
                    save_tensor(Tensor("bfloat16", (2, 3), bytes(12)))
                ).decode()
            },
            "hidden_size 3",
        ),
        ({"prompt_embeds": 5}, "non-empty base64 string"),
    ],
)
def test_a_tensor_that_cannot_be_keyed_exactly_is_refused(body, says) -> None:  # noqa: ANN001
    with pytest.raises(InvalidArgument, match=says) as raised:
        embedded_prompt(SUPPORT, body, None, 4)
    assert raised.value.field == "prompt_embeds"
