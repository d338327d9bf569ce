"""Prompt embeddings (issue 25 item 6) through the sidecar, keyed and checked against real vLLM.

vLLM 0.32 on CPU serves ``/v1/completions`` ``prompt_embeds`` when started with
``--enable-prompt-embeds`` (tried here: the tiny hybrid Gemma 3 ``32-fssfss``, whose server
``test_vllm_hybrid.py`` shares; vLLM runs it in bfloat16). Each block of such a prompt is keyed
with the SHA-256 of its rows in the model's dtype (``kv_cache_utils``
``_gen_prompt_embeds_extra_hash_keys``), its token ids are zeros, and ``BlockStored`` carries
the digest as the block's extra key. The tensors are written by the engine environment's torch
(tokenkeys reads them without torch: ``keys/torch_file.py``).

Shown here: the sidecar learns at start that vLLM takes embeddings and in which dtype; it
forwards such a request with its meaning; the digests and keys tokenkeys computes are the ones
vLLM publishes, in every group; the live key check counts those blocks as matches and no
mismatch; the same check flags a corrupted key; what cannot be keyed exactly is refused naming
the field; and in front of a vLLM started without the flag the request is refused naming it.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from prometheus_client import CollectorRegistry
from test_vllm_hybrid import LAYOUTS, Layout

from tokenkeys.engine.vllm.key_check import KeyCheck
from tokenkeys.engine.vllm.key_check import keys_checked as checked_counter
from tokenkeys.events.model import BlockStored, EventBatch
from tokenkeys.keys import KeyContext, block_keys, make_spec
from tokenkeys.keys.prompt_embeds import prompt_embeds_of

from served_pair import TokenkeysServe, keys_checked, running, sidecar_args, wait_for
from vllm_events import EventCollector
from vllm_server import BLOCK_SIZE, MODEL_NAME, PLAIN_CONFIG, VllmServer

LAYOUT: Layout = LAYOUTS[1]

pytestmark = [pytest.mark.realengine, pytest.mark.vllm_servers(LAYOUT.config)]
HIDDEN = 128  # build_tiny_model's hidden size

_WRITE = """
import base64, io, json, sys, torch
out = []
for rows, dtype, seed in json.loads(sys.argv[1]):
    torch.manual_seed(seed)
    tensor = torch.randn(rows, int(sys.argv[2])).to(getattr(torch, dtype))
    buf = io.BytesIO()
    torch.save(tensor, buf)
    out.append(base64.b64encode(buf.getvalue()).decode())
print(json.dumps(out))
"""


def payloads(python: Path, *tensors: tuple[int, str, int]) -> list[str]:
    """base64 ``torch.save`` payloads of random (rows, HIDDEN) tensors, by the engine's torch."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run(
        [str(python), "-c", _WRITE, json.dumps(tensors), str(HIDDEN)],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        check=True,
    )
    return json.loads(done.stdout)


@pytest.fixture(scope="module")
def vllm(vllm_pool) -> VllmServer:
    return vllm_pool.get(LAYOUT.config)


@pytest.fixture(scope="module")
def engine_events(vllm: VllmServer) -> Iterator[EventCollector]:
    collector = EventCollector(vllm.events_endpoint, vllm.replay_endpoint, vllm.topic, "0.32")
    try:
        yield collector
    finally:
        collector.close()


def complete(url: str, **body) -> httpx.Response:  # noqa: ANN003 - the request's fields
    return httpx.post(
        f"{url}/v1/completions", json={"model": MODEL_NAME, "max_tokens": 1, **body}, timeout=300
    )


def test_the_sidecar_learns_that_vllm_takes_embeddings_and_their_dtype(sidecar) -> None:
    assert (
        f"takes prompt embeddings of hidden size {HIDDEN}, hashed as bfloat16" in sidecar.log_text()
    )


def test_embeddings_are_forwarded_keyed_as_vllm_keys_them_and_checked(
    vllm, sidecar, engine_events, vllm_python
) -> None:
    (embeds,) = payloads(vllm_python, (97, "bfloat16", 11))
    ours = prompt_embeds_of(embeds, dtype="bfloat16", hash_unit=BLOCK_SIZE, hidden_size=HIDDEN)
    context = KeyContext(prompt_embeds_digests=ours.digests)
    keys = [k.event_key for k in block_keys(ours.token_ids, LAYOUT.spec, context)]
    before = keys_checked(sidecar.url)
    first = complete(sidecar.url, prompt_embeds=embeds)
    assert first.status_code == 200, first.text
    assert first.json()["usage"]["prompt_tokens"] == 97

    def mine() -> list[BlockStored]:
        return [
            e for e in engine_events.stored() if e.block_hashes and e.block_hashes[-1] == keys[-1]
        ]

    engine_events.wait_until(lambda: len(mine()) == len(LAYOUT.groups), "every group's store")
    by_group = {e.group_idx: e for e in mine()}
    full = by_group[LAYOUT.full]
    assert list(full.block_hashes) == keys  # 3 blocks, each keyed with its rows' digest
    assert [tuple(k) for k in full.extra_keys] == [(d,) for d in ours.digests]
    assert set(full.token_ids) == {0} and len(full.token_ids) == 96
    for group in LAYOUT.windows:  # a 32-token window hashes the span's last block
        assert list(by_group[group].block_hashes) == keys[-LAYOUT.tail_blocks :]
    after = wait_for(
        lambda: (c := keys_checked(sidecar.url))["match"] >= before["match"] + 3 and c,
        "the embeddings' blocks checked",
    )
    assert after["mismatch"] == before["mismatch"] == 0
    again = complete(sidecar.url, prompt_embeds=embeds)
    assert again.json()["usage"]["prompt_tokens_details"]["cached_tokens"] == 96

    # The same events through a check of its own: exact keys match, a corrupted one is flagged.
    batch = EventBatch(0.0, tuple(mine()))
    right = KeyCheck(LAYOUT.spec, MODEL_NAME, checked_counter(CollectorRegistry()))
    right.expect(ours.token_ids, context)
    right.observe(batch)
    assert right.counted == 5 and right.verified
    corrupted = make_spec(
        "vllm/sha256_cbor@0.31", BLOCK_SIZE, root_seed="not vLLM's", groups=list(LAYOUT.spec.groups)
    )
    wrong = KeyCheck(corrupted, MODEL_NAME, checked_counter(CollectorRegistry()))
    wrong.expect(ours.token_ids, context)
    wrong.observe(batch)
    assert not wrong.verified and wrong.counted >= 1
    assert "prompt-embeds handling" in (wrong.first_mismatch or "")


def test_what_cannot_be_keyed_exactly_is_refused_naming_the_field(sidecar, vllm_python) -> None:
    wide, short = payloads(vllm_python, (40, "float32", 12), (40, "bfloat16", 13))
    cast = complete(sidecar.url, prompt_embeds=wide)  # vLLM would round it to bfloat16 itself
    assert cast.status_code == 400, cast.text
    assert "dtype float32 is not the model's bfloat16" in cast.text
    assert "prompt_embeds" in cast.text
    both = complete(sidecar.url, prompt_embeds=short, prompt=[1, 2, 3])
    assert both.status_code == 501 and "together with prompt" in both.text
    garbled = complete(sidecar.url, prompt_embeds="bm90IGEgdGVuc29y")  # "not a tensor"
    assert garbled.status_code == 400 and "zip-format torch.save" in garbled.text


#: A server without ``--enable-prompt-embeds``: the Llama without the adapter, which
#: test_vllm_grpc_face.py uses too; the schedule runs this module right after that one, in the
#: same process (family ``vllm-other``), so one start serves both.
PLAIN = PLAIN_CONFIG


@pytest.mark.vllm_servers(PLAIN)
def test_in_front_of_a_vllm_without_the_flag_they_are_refused_naming_it(
    vllm_pool, vllm_python
) -> None:
    assert not PLAIN.prompt_embeds
    plain = vllm_pool.get(PLAIN)
    (embeds,) = payloads(vllm_python, (40, "bfloat16", 14))
    process = TokenkeysServe(*sidecar_args(plain))
    with running(process):
        refused = complete(process.url, prompt_embeds=embeds)
        assert "takes no prompt embeddings (no --enable-prompt-embeds)" in process.log_text()
    assert refused.status_code == 501, refused.text
    assert "--enable-prompt-embeds" in refused.text and "prompt_embeds" in refused.text
    # vLLM's own answer to it, for the record: the 400 naming the same flag.
    theirs = complete(plain.url, prompt_embeds=embeds)
    assert theirs.status_code == 400 and "--enable-prompt-embeds" in theirs.text
