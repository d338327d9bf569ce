"""The sidecar's start probe of images: vLLM's identifier of a fresh image must be tokenkeys'.

A live image block is placed by its parent, tokens and extra keys, and the extra keys hold the
image's identifier, so a wrong identifier (a ``--mm-model-id`` that is not vLLM's ``--model``
argument, another image hash algorithm) leaves image blocks unplaced rather than flagged: another
client's image of the same size has the same placeholder tokens (``key_check`` module doc). The
probe proves the identifier where nobody else can interfere: one chat of random text, then a
fresh image of random pixels, rendered by the model's one Preprocessor and sent to vLLM. Every
block after the first block of random tokens is the probe's alone, so the check places it by
parent and tokens (``KeyCheck.expect(owned_from=...)``) and flags another hash or other published
extra keys there. A mismatch refuses the start, naming ``mm-model-id``.

The identifier's model id is vLLM's ``--model`` argument as given, which vLLM reports as the
``root`` of its base model card on ``/v1/models`` (vLLM 0.32
``entrypoints/launchers/api_server/app_state.py``: ``BaseModelPath(model_path=args.model)``,
``entrypoints/openai/models/serving.py``: ``root=base_model.model_path``); the sidecar adopts it
when ``--mm-model-id`` is not given (:func:`adopt_model_id`), and the probe proves it.
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import io
import logging
import os
import secrets
import time
from typing import Any

import orjson

from tokenkeys.engine.vllm.client import VllmHttpClient
from tokenkeys.engine.vllm.key_check import KeyCheck
from tokenkeys.errors import ConfigError
from tokenkeys.keys import KeyContext
from tokenkeys.preprocess.preprocessor import Preprocessor

log = logging.getLogger(__name__)

#: Seconds a start probe (the sidecar's fresh block, this fresh image) waits for vLLM's events.
PROBE_WAIT_S = 10.0

#: The probe image's side in pixels (small: the least vision work vLLM can do).
SIDE = 16


def _random_png() -> bytes:
    """A PNG of random RGB pixels: an image no other request has sent."""
    from PIL import Image  # the multimodal extra (the Preprocessor's images need it too)

    image = Image.frombytes("RGB", (SIDE, SIDE), os.urandom(SIDE * SIDE * 3))
    out = io.BytesIO()
    image.save(out, format="PNG")
    return out.getvalue()


def _chat(model: str, text: str, url: str) -> dict[str, Any]:
    part = {"type": "image_url", "image_url": {"url": url}}
    content = [{"type": "text", "text": text}, part]
    return {"model": model, "messages": [{"role": "user", "content": content}], "max_tokens": 1}


def _first_difference(a: list[int], b: list[int]) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), len(a))


def adopt_model_id(preprocessor: Preprocessor | None, root: str, url: str) -> None:
    """Hash images with vLLM's ``--model`` argument (``root``, see the module doc) where
    ``--mm-model-id`` is not given; a given one that is not ``root`` refuses the start."""
    if preprocessor is None or preprocessor.image_expander is None or not root:
        return
    given = preprocessor.images.model_id
    if given is None:
        log.info("image identifiers with model id %r, the --model vLLM at %s reports", root, url)
        preprocessor.adopt_image_model_id(root)
    elif given != root:
        raise ConfigError(
            f"--mm-model-id is {given!r}, vLLM at {url} was started with --model {root!r} (the "
            "model id it hashes into every image identifier); give vLLM's or leave it out",
            field="mm-model-id",
        )


async def probe_images(
    client: VllmHttpClient,
    check: KeyCheck,
    preprocessor: Preprocessor | None,
    context: KeyContext,
    wait_s: float = PROBE_WAIT_S,
) -> None:
    """Probe one fresh image through vLLM (see the module doc); ConfigError on a mismatch.

    Nothing is probed for a model that takes no images or has no model id (neither given nor
    adopted: its image prompts have no keys to check). A vLLM that refuses the image, or
    publishes no placed block within ``wait_s``, is logged: its image blocks are then checked
    on live traffic only.
    """
    if preprocessor is None or preprocessor.image_expander is None:
        return
    model, url = check.model, client.base_url
    if preprocessor.images.model_id is None:
        log.warning(
            "no image model id: image prompts of %s are forwarded without keys to check", model
        )
        return
    bs = check.block_size
    image = "data:image/png;base64," + base64.b64encode(_random_png()).decode()
    body = _chat(model, secrets.token_hex(4 * bs), image)
    ours = await asyncio.to_thread(preprocessor.tokenize_chat, body)
    other = await asyncio.to_thread(
        preprocessor.tokenize_chat, _chat(model, secrets.token_hex(4 * bs), image)
    )
    ids = ours.tokens.ids
    # The first block made of random tokens only: every block after it is the probe's alone.
    random_block = -(-_first_difference(ids, other.tokens.ids) // bs)
    if (random_block + 1) * bs > ours.features[0].offset:
        log.warning("image probe: the random text fills no whole block; not probed")
        return
    ctx = dataclasses.replace(context, mm_items=tuple(f.item() for f in ours.features))
    before = check.counted
    expected = check.expect(ids, ctx, owned_from=random_block + 1)
    answer = await client.forward("/v1/chat/completions", body, {})
    if answer.status != 200:
        log.warning(
            "image probe: vLLM at %s refused an image chat (%d %s); image blocks are checked "
            "on live traffic only",
            url,
            answer.status,
            _message(answer.body),
        )
        return
    deadline = time.monotonic() + wait_s
    while check.counted - before < expected and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    if not check.verified:
        raise ConfigError(
            f"image probe: vLLM at {url} keyed a fresh image's blocks otherwise than "
            f"tokenkeys ({check.first_mismatch})",
            field="mm-model-id",
        )
    if check.counted - before < expected:
        log.warning(
            "image probe: vLLM at %s published %d of %d blocks of a fresh image chat within "
            "%g s; image blocks are checked on live traffic only",
            url,
            check.counted - before,
            expected,
            wait_s,
        )
    else:
        log.info("image probe: vLLM's keys of a fresh image's blocks are tokenkeys'")


def _message(body: bytes) -> str:
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError:
        return body[:200].decode(errors="replace")
    error = doc.get("error") if isinstance(doc, dict) else None
    return str(error.get("message") if isinstance(error, dict) else doc)[:200]
