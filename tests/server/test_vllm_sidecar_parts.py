"""The sidecar's option rules (the live key check: ``test_key_check.py``)."""

from __future__ import annotations

import argparse

import pytest

from tokenkeys.cli.engine_options import add_engine_options, engine_config_from
from tokenkeys.errors import ConfigError


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
    assert (config.vllm.wait_s, config.vllm.probe) == (600.0, True)
    waiting = engine_config_from(
        _serve_args(
            "--engine",
            "vllm+http://h:1",
            "--engine-kv-events",
            "tcp://h:2",
            "--engine-wait",
            "30",
            "--no-engine-probe",
        )  # fmt: skip
    )
    assert waiting.vllm is not None and (waiting.vllm.wait_s, waiting.vllm.probe) == (30.0, False)


def test_the_simulated_engines_default_max_tokens_is_an_option() -> None:
    assert engine_config_from(_serve_args()).default_max_tokens == 16
    assert engine_config_from(_serve_args("--default-max-tokens", "64")).default_max_tokens == 64
    with pytest.raises(ConfigError) as caught:
        engine_config_from(_serve_args("--default-max-tokens", "0"))
    assert caught.value.field == "default-max-tokens"


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
        (
            ["--engine", "vllm+http://h:1", "--engine-kv-events", "tcp://h:2", "--engine-wait=-1"],
            "engine-wait",
            ">= 0",
        ),
    ],
)
def test_bad_vllm_engine_options_are_refused(argv, field, words) -> None:
    with pytest.raises(ConfigError) as caught:
        engine_config_from(_serve_args(*argv))
    assert caught.value.field == field
    assert words in caught.value.message
