"""The sidecar's option rules (the live key check: ``test_key_check.py``)."""

from __future__ import annotations

import argparse

import pytest

from tokenkeys.cli.common import add_tokenizer_options
from tokenkeys.cli.engine_options import add_engine_options, engine_config_from
from tokenkeys.engine.config import VllmEngineConfig
from tokenkeys.errors import ConfigError

from support import REPO


def _serve_args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_engine_options(parser)
    add_tokenizer_options(parser, many=True)
    return parser.parse_args(list(argv))


FOLDER = str(REPO / "src" / "tokenkeys" / "data" / "smollm2-135m-instruct")


@pytest.mark.parametrize(
    ("argv", "adopt"),
    [
        ((), True),  # the embedded tokenizer, under its folder's name until vLLM's is known
        (("--model", FOLDER), True),
        (("--model", f"tiny={FOLDER}"), False),
        (("--model", FOLDER, "--served-model-name", "tiny", "t"), False),
        (("--model", f"a={FOLDER}", "--model", f"b={FOLDER}"), False),
    ],
)
def test_a_model_without_a_given_name_takes_vllms(argv: tuple[str, ...], adopt: bool) -> None:
    vllm = ("--engine", "vllm+http://h:1", "--engine-kv-events", "tcp://h:2")
    config = engine_config_from(_serve_args(*vllm, *argv)).engine
    assert isinstance(config, VllmEngineConfig) and config.adopt_name is adopt


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
    vllm = config.engine
    assert config.kind == "vllm" and isinstance(vllm, VllmEngineConfig)
    assert vllm.url == "http://10.0.0.7:8000"
    assert (vllm.kv_events, vllm.kv_replay, vllm.kv_topic) == (
        "tcp://10.0.0.7:5557",
        "tcp://10.0.0.7:5558",
        "kv",
    )
    assert engine_config_from(_serve_args("--engine", "10.0.0.7:50051")).kind == "remote"
    assert (vllm.wait_s, vllm.probe) == (600.0, True)
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
    ).engine
    assert isinstance(waiting, VllmEngineConfig)
    assert (waiting.wait_s, waiting.probe) == (30.0, False)
    # No publisher given: taken from vLLM's /kv_event_sources at start (checks.prepare).
    adopting = engine_config_from(_serve_args("--engine", "vllm+http://h:1")).engine
    assert isinstance(adopting, VllmEngineConfig)
    assert (adopting.kv_events, adopting.kv_replay, adopting.kv_topic) == (None, None, "")


def test_the_simulated_engines_default_max_tokens_is_an_option() -> None:
    assert engine_config_from(_serve_args()).engine.default_max_tokens == 16
    chosen = engine_config_from(_serve_args("--default-max-tokens", "64"))
    assert chosen.engine.default_max_tokens == 64
    with pytest.raises(ConfigError) as caught:
        engine_config_from(_serve_args("--default-max-tokens", "0"))
    assert caught.value.field == "default-max-tokens"


@pytest.mark.parametrize(
    ("argv", "field", "words"),
    [
        (["--engine-kv-events", "tcp://h:1"], "engine-kv-events", "needs --engine vllm+http"),
        (
            ["--engine", "vllm+ftp://h:1", "--engine-kv-events", "tcp://h:2"],
            "engine",
            "--engine 'ftp://h:1' is not http://HOST:PORT",
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
