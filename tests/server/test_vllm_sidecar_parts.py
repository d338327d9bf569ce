"""The sidecar's parts that need no running vLLM: the live key check and the option rules.

The key check is fed BlockStored events built from keys of the real profile (what vLLM
publishes, as ``tests/realengine/test_vllm_keys.py`` proves against vLLM 0.32 itself); the
end-to-end behaviour against a real vLLM is ``tests/realengine/test_vllm_sidecar.py``.
"""

from __future__ import annotations

import argparse
import logging
import random

import pytest
from prometheus_client import CollectorRegistry

from tokenkeys.cli.engine_options import add_engine_options, engine_config_from
from tokenkeys.engine.vllm.key_check import KeyCheck, keys_checked
from tokenkeys.errors import ConfigError
from tokenkeys.events.model import BlockStored, EventBatch
from tokenkeys.keys import block_keys, make_spec

BS = 32
SPEC = make_spec("vllm/sha256_cbor@0.31", BS)


def _check() -> tuple[KeyCheck, CollectorRegistry]:
    registry = CollectorRegistry()
    return KeyCheck(SPEC, "m", keys_checked(registry)), registry


def _count(registry: CollectorRegistry, result: str) -> float:
    value = registry.get_sample_value(
        "tokenkeys_engine_keys_checked_total", {"model": "m", "result": result}
    )
    return value or 0.0


def _stored(prompt: list[int], spec=SPEC, first: int = 0, blocks: int | None = None):  # noqa: ANN001, ANN202
    keys = block_keys(prompt, spec)
    blocks = len(keys) - first if blocks is None else blocks
    chosen = keys[first : first + blocks]
    parent = keys[first - 1].event_key if first else None
    tokens = tuple(prompt[first * BS : (first + blocks) * BS])
    event = BlockStored(tuple(k.event_key for k in chosen), parent, tokens, BS)
    return EventBatch(0.0, (event,))


def _prompt(seed: int, length: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(49152) for _ in range(length)]


def test_the_engines_own_keys_match_block_by_block() -> None:
    check, registry = _check()
    prompt = _prompt(1, 5 * BS + 9)
    assert check.expect(prompt, None) == 5
    check.observe(_stored(prompt, first=0, blocks=2))  # a cache hit later stores the rest
    check.observe(_stored(prompt, first=2))
    assert (_count(registry, "match"), _count(registry, "mismatch")) == (5, 0)
    assert check.verified


def test_blocks_nobody_expected_are_not_checked() -> None:
    check, registry = _check()
    check.expect(_prompt(2, 2 * BS), None)
    check.observe(_stored(_prompt(3, 3 * BS)))  # generated tokens, or an unknown prompt
    assert (_count(registry, "match"), _count(registry, "mismatch")) == (0, 0)


def test_a_wrong_root_is_counted_logged_once_and_unverified(caplog) -> None:
    check, registry = _check()
    engine_spec = make_spec("vllm/sha256_cbor@0.31", BS, root_seed="0")  # PYTHONHASHSEED=0
    prompts = [_prompt(4, 3 * BS), _prompt(5, 2 * BS)]
    with caplog.at_level(logging.ERROR, logger="tokenkeys.engine.vllm.key_check"):
        for prompt in prompts:
            check.expect(prompt, None)
            check.observe(_stored(prompt, spec=engine_spec))
    assert (_count(registry, "match"), _count(registry, "mismatch")) == (0, 5)
    assert not check.verified
    assert len(caplog.records) == 1
    assert "root seed" in caplog.records[0].getMessage()


def test_a_later_block_mismatch_names_the_algorithm() -> None:
    check, _ = _check()
    prompt = _prompt(6, 3 * BS)
    check.expect(prompt, None)
    other = make_spec("vllm/sha256@0.31", BS)
    check.observe(_stored(prompt, spec=other, first=1))
    assert not check.verified
    assert check.first_mismatch is not None and "algorithm" in check.first_mismatch


def _serve_args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_engine_options(parser)
    return parser.parse_args(list(argv))


def test_vllm_engine_options() -> None:
    config = engine_config_from(
        _serve_args(
            "--engine",
            "vllm+http://10.0.0.7:8000",
            "--engine-kv-events",
            "tcp://10.0.0.7:5557",
            "--engine-kv-replay",
            "tcp://10.0.0.7:5558",
            "--engine-kv-topic",
            "kv",
        )  # fmt: skip
    )
    assert config.remote_engine is None and config.vllm is not None
    assert config.vllm.url == "http://10.0.0.7:8000"
    assert (config.vllm.kv_events, config.vllm.kv_replay, config.vllm.kv_topic) == (
        "tcp://10.0.0.7:5557",
        "tcp://10.0.0.7:5558",
        "kv",
    )
    assert engine_config_from(_serve_args("--engine", "10.0.0.7:50051")).vllm is None


@pytest.mark.parametrize(
    ("argv", "field", "words"),
    [
        (["--engine", "vllm+http://h:1"], "engine-kv-events", "needs --engine-kv-events"),
        (["--engine-kv-events", "tcp://h:1"], "engine-kv-events", "needs --engine vllm+http"),
        (
            ["--engine", "vllm+ftp://h:1", "--engine-kv-events", "tcp://h:2"],
            "engine",
            "vllm+http://HOST:PORT",
        ),
        (
            ["--engine", "vllm+http://h:1", "--engine-kv-events", "tcp://*:2"],
            "engine-kv-events",
            "tcp://HOST:PORT",
        ),
    ],
)
def test_bad_vllm_engine_options_are_refused(argv, field, words) -> None:
    with pytest.raises(ConfigError) as caught:
        engine_config_from(_serve_args(*argv))
    assert caught.value.field == field
    assert words in caught.value.message
