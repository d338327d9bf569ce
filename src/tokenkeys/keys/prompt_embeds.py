"""vLLM's prompt-embeds extra key: one SHA-256 per block of the embeddings the engine runs.

vLLM 0.32 (``vllm/v1/core/kv_cache_utils.py`` ``_gen_prompt_embeds_extra_hash_keys``) keys each
full block of a request given as ``prompt_embeds`` with ``("prompt_embeds",
sha256(tensor_data(prompt_embeds[start:end])))``, ``tensor_data`` being the block's rows as raw
row-major bytes (``vllm/v1/utils.py``); the block's token ids are zeros (``Request``: a prompt
without token ids has ``_all_token_ids = [0] * num_prompt_tokens``), and ``BlockStored`` carries
those zeros and the bare digest as the block's extra key (``to_event_extra_keys``). The tensor
hashed is the one ``safe_load_prompt_embeds`` (``vllm/renderers/embed_utils.py``) returns: a
leading dimension of 1 squeezed, two dimensions ``(num_tokens, hidden_size)``, cast to the
model's dtype.

:func:`prompt_embeds_of` reads the base64 ``torch.save`` payload without torch
(:mod:`tokenkeys.keys.torch_file`) and gives the digests of its full blocks, for the
:class:`~tokenkeys.keys.KeyContext` field ``prompt_embeds_digests``. A tensor whose dtype is not
the model's is refused rather than cast: the cast's rounding is the engine CPU's (its vector
units may flush subnormals), which this project does not reproduce.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
from dataclasses import dataclass

from tokenkeys.errors import InvalidArgument
from tokenkeys.keys.torch_file import FIELD, Tensor, load_tensor

#: ``torch.<dtype>`` names vLLM's model dtype can take here, as ``Tensor.dtype`` spells them.
MODEL_DTYPES = ("float32", "bfloat16", "float16")


@dataclass(frozen=True)
class PromptEmbeds:
    """A prompt given as embeddings: its length in tokens and the digest of each full block."""

    num_tokens: int
    hidden_size: int
    digests: tuple[bytes, ...]

    @property
    def token_ids(self) -> list[int]:
        """The ids vLLM hashes for such a prompt: one zero per embedding row."""
        return [0] * self.num_tokens


def decode_payload(value: object) -> bytes:
    """The bytes of a ``prompt_embeds`` field (base64, as vLLM reads it: ``validate=True``)."""
    if not isinstance(value, str | bytes) or not value:
        raise InvalidArgument(
            "prompt_embeds must be a non-empty base64 string of a torch.save tensor",
            field=FIELD,
        )
    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise InvalidArgument(f"prompt_embeds is not valid base64: {exc}", field=FIELD) from None


def engine_view(tensor: Tensor, dtype: str, hidden_size: int | None = None) -> Tensor:
    """The tensor as vLLM hashes it (leading 1 squeezed, 2-D, the model's dtype) or refused."""
    shape = tensor.shape[1:] if len(tensor.shape) > 2 and tensor.shape[0] == 1 else tensor.shape
    if len(shape) != 2:
        raise InvalidArgument(
            f"prompt_embeds must be a 2D tensor of shape (num_tokens, hidden_size); got shape "
            f"{tensor.shape}",
            field=FIELD,
        )
    if hidden_size is not None and shape[1] != hidden_size:
        raise InvalidArgument(
            f"prompt_embeds hidden_size {shape[1]} does not match the model's hidden_size "
            f"{hidden_size}",
            field=FIELD,
        )
    if tensor.dtype != dtype:
        raise InvalidArgument(
            f"prompt_embeds dtype {tensor.dtype} is not the model's {dtype}: the engine would "
            f"cast it with its own rounding, which tokenkeys does not reproduce; send a "
            f"{dtype} tensor",
            field=FIELD,
        )
    return Tensor(tensor.dtype, shape, tensor.data)


def block_digests(tensor: Tensor, hash_unit: int) -> tuple[bytes, ...]:
    """SHA-256 of each full block of ``hash_unit`` rows of a 2-D tensor's bytes."""
    row = tensor.shape[1] * tensor.itemsize
    span = hash_unit * row
    return tuple(
        hashlib.sha256(tensor.data[start : start + span]).digest()
        for start in range(0, (tensor.shape[0] // hash_unit) * span, span)
    )


def prompt_embeds_of(
    value: object, *, dtype: str, hash_unit: int, hidden_size: int | None = None
) -> PromptEmbeds:
    """A ``prompt_embeds`` field as vLLM keys it, for a model of ``dtype``."""
    if dtype not in MODEL_DTYPES:
        raise InvalidArgument(
            f"model dtype {dtype!r} is not one of {', '.join(MODEL_DTYPES)}", field="dtype"
        )
    tensor = engine_view(load_tensor(decode_payload(value)), dtype, hidden_size)
    if tensor.shape[0] == 0:
        raise InvalidArgument("prompt_embeds has no rows (num_tokens is 0)", field=FIELD)
    return PromptEmbeds(tensor.shape[0], tensor.shape[1], block_digests(tensor, hash_unit))
