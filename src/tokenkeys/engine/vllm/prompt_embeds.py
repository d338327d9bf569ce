"""Prompt embeddings through the sidecar: whether vLLM takes them, and in which dtype it hashes.

vLLM 0.32 takes a completions ``prompt_embeds`` (base64 of ``torch.save`` of a ``(num_tokens,
hidden_size)`` tensor) only when started with ``--enable-prompt-embeds``, casts it to the
model's dtype and keys each block with the SHA-256 of those bytes
(:mod:`tokenkeys.keys.prompt_embeds`). None of that is on an HTTP route, so the sidecar asks at
start (:func:`learn_prompt_embeds`):

1. a one-element tensor: vLLM answers 400 either "You must set ``--enable-prompt-embeds``"
   (off: such requests are refused naming the flag) or "hidden_size 1 does not match the model's
   hidden_size H" (on, and H) (``vllm/renderers/embed_utils.py`` ``safe_load_prompt_embeds``);
   any other answer is logged and treated as off;
2. a fresh tensor of one block and one row, of values exact in every float dtype: the digest
   vLLM publishes as the block's extra key is the SHA-256 of the tensor in exactly one of
   float32, bfloat16 and float16, the model's dtype.

A request's tensor must then be of that dtype (vLLM's cast would round with the CPU's rules);
its rows become the prompt (zeros, as vLLM hashes them) and its digests the key context.
"""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import logging
import random
import re
import struct
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tokenkeys.engine.config import VllmEngineConfig
from tokenkeys.engine.vllm.client import VllmHttpClient
from tokenkeys.engine.vllm.groups import Probe, probe_stores
from tokenkeys.events.model import BlockStored
from tokenkeys.keys import KeyContext
from tokenkeys.keys.prompt_embeds import MODEL_DTYPES, prompt_embeds_of
from tokenkeys.keys.torch_file import Tensor, save_tensor

log = logging.getLogger(__name__)

FLAG = "--enable-prompt-embeds"
_HIDDEN = re.compile(r"the model's hidden_size (\d+)")


@dataclass(frozen=True)
class EmbedsSupport:
    """vLLM takes prompt embeddings of ``hidden_size`` columns and hashes them as ``dtype``."""

    hidden_size: int
    dtype: str


def _payload(tensor: Tensor) -> str:
    return base64.b64encode(save_tensor(tensor)).decode()


def _encode(values: list[float], dtype: str) -> bytes:
    if dtype == "float32":
        return struct.pack(f"<{len(values)}f", *values)
    if dtype == "float16":
        return struct.pack(f"<{len(values)}e", *values)
    wide = struct.pack(f"<{len(values)}f", *values)  # bfloat16: the top half of each float32
    return b"".join(wide[i + 2 : i + 4] for i in range(0, len(wide), 4))


async def learn_prompt_embeds(
    client: VllmHttpClient,
    config: VllmEngineConfig,
    model: str,
    block_size: int,
    wire_version: str,
) -> EmbedsSupport | None:
    """What vLLM does with prompt embeddings (None: it was not started with the flag)."""
    tiny = {"model": model, "prompt_embeds": _payload(Tensor("bfloat16", (1, 1), b"\0\0"))}
    answer = await client.forward("/v1/completions", {**tiny, "max_tokens": 1}, {})
    text = answer.body.decode("utf-8", "replace")
    if answer.status == 400 and FLAG in text:
        log.info("vLLM at %s takes no prompt embeddings (no %s)", config.url, FLAG)
        return None
    found = _HIDDEN.search(text)
    if answer.status != 400 or found is None:
        log.warning(
            "vLLM at %s answered a one-element prompt_embeds probe with HTTP %d (%.200s), not "
            "vLLM 0.32's hidden-size refusal: prompt_embeds requests are refused",
            config.url,
            answer.status,
            text,
        )
        return None
    hidden = int(found.group(1))
    rows = block_size + 1
    digests: dict[str, bytes] = {}

    def fresh() -> Probe:
        # Fresh values (never cached, so vLLM stores the block), exact in every dtype.
        values = [random.SystemRandom().randrange(-16, 17) / 4 for _ in range(rows * hidden)]
        first = {
            d: hashlib.sha256(_encode(values[: block_size * hidden], d)).digest()
            for d in MODEL_DTYPES
        }
        digests.update({v: d for d, v in first.items()})
        tensor = Tensor("bfloat16", (rows, hidden), _encode(values, "bfloat16"))
        body = {"model": model, "prompt_embeds": _payload(tensor), "max_tokens": 1}
        return (
            body,
            lambda e: e.parent_block_hash is None and bool(set(first.values()) & _digests(e)),
        )

    stores = await probe_stores(client, config, fresh, wire_version)
    dtype = next(digests[d] for d in _digests(stores[0]) if d in digests)
    log.info(
        "vLLM at %s takes prompt embeddings of hidden size %d, hashed as %s",
        config.url,
        hidden,
        dtype,
    )
    return EmbedsSupport(hidden, dtype)


def _digests(event: BlockStored) -> set[bytes]:
    """The bytes among an event's first block's extra keys (vLLM's bare embeds digest)."""
    keys = (event.extra_keys or (None,))[0]
    items = keys if isinstance(keys, tuple | list) else (keys,)
    return {k for k in items if isinstance(k, bytes)}


def refusal(
    support: EmbedsSupport | None, body: Mapping[str, Any], where: str
) -> tuple[str, str] | None:
    """Why a completions body's ``prompt_embeds`` cannot pass (field, reason), or None."""
    embeds = body.get("prompt_embeds")
    if embeds is None:
        return None
    if support is None:
        return "prompt_embeds", (
            f"prompt_embeds is not supported: the vLLM at {where} was not started with {FLAG} "
            "(or the sidecar did not learn it: --no-engine-probe, or an answer the start log "
            "names)"
        )
    if body.get("prompt") is not None:
        return "prompt_embeds", (
            "prompt_embeds together with prompt is not supported through the sidecar: send "
            "one of them per request"
        )
    if isinstance(embeds, list) and len(embeds) != 1:
        return "prompt_embeds", (
            "prompt_embeds as a list of several tensors is not supported through the sidecar: "
            "send one tensor per request"
        )
    return None


def embedded_prompt(
    support: EmbedsSupport, body: Mapping[str, Any], context: KeyContext | None, hash_unit: int
) -> tuple[list[int], KeyContext]:
    """A ``prompt_embeds`` request's prompt as vLLM keys it: zeros, and the blocks' digests."""
    embeds = body["prompt_embeds"]
    value = embeds[0] if isinstance(embeds, list) else embeds
    read = prompt_embeds_of(
        value, dtype=support.dtype, hash_unit=hash_unit, hidden_size=support.hidden_size
    )
    ctx = dataclasses.replace(context or KeyContext(), prompt_embeds_digests=read.digests)
    return read.token_ids, ctx
