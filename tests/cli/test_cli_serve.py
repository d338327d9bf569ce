"""`tokenkeys serve` as an operator runs it: a real process, then the CLI against it."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from conformance_data import data_path
from support import REPO, run_cli


@pytest.fixture
def served(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    # stderr goes to a file: an unread pipe would block the server once its logs fill it.
    log = (tmp_path / "serve.log").open("w+")
    proc = subprocess.Popen(
        [sys.executable, "-m", "tokenkeys.cli", "serve", "--grpc-port", "0", "--http-port", "0"],
        stdout=subprocess.PIPE,
        stderr=log,
        text=True,
        env=env,
    )
    target = None
    for line in proc.stdout:
        if "gRPC listening on " in line:
            target = line.split()[-1]
            break
    if target is None:
        proc.kill()
        pytest.fail(f"serve did not start: {(tmp_path / 'serve.log').read_text()}")
    yield target
    proc.terminate()
    code = proc.wait(60)
    log.close()
    tail = (tmp_path / "serve.log").read_text()[-2000:]
    assert code == 0, f"serve must exit 0 on SIGTERM, got {code}: {tail}"


def test_remote_tokenize_equals_in_process(served: str, tmp_path) -> None:
    texts = ["Hello world", "", "NUL\x00inside", "<|im_start|>user", "Ünïcödé 漢字 🎉"]
    (tmp_path / "texts.json").write_text(json.dumps(texts))
    local = run_cli("tokenize", "--json", "--input", "texts.json", cwd=tmp_path)
    remote = run_cli(
        "tokenize", "--json", "--input", "texts.json", "--remote", served, cwd=tmp_path
    )
    assert json.loads(local.stdout) == json.loads(remote.stdout)
    info = json.loads(run_cli("info", "--json", "--remote", served).stdout)
    assert info["model"] == "smollm2-135m-instruct"
    assert info["fingerprint"] == json.loads(run_cli("info", "--json").stdout)["fingerprint"]


def test_detokenize_cli(served: str) -> None:
    remote = run_cli("detokenize", "--json", "--remote", served, "19556", "905")
    assert json.loads(remote.stdout) == {"text": "Hello world"}
    bad = run_cli("detokenize", "--remote", served, "49152", check=False)
    assert bad.returncode == 2 and "outside the vocabulary" in bad.stderr


def test_unloadable_model_stops_serve_naming_the_file() -> None:
    path = data_path("tokenizers", "llama2-unloadable")
    result = run_cli("serve", "--model", str(path), "--grpc-port", "0", check=False)
    assert result.returncode == 2
    assert "tokenizer.json" in result.stderr and "Merges" in result.stderr


def test_no_spec_needs_a_remote_engine() -> None:
    """The simulated engine hashes with a spec; serving none would advertise hashes of nothing."""
    result = run_cli("serve", "--cache-key-profile", "none", "--grpc-port", "0", check=False)
    assert result.returncode == 2
    assert "--cache-key-profile none needs --engine" in result.stderr


def test_engine_none_serves_tokenizer_only_and_scales_with_workers() -> None:
    """``--engine none``: no engine to keep in one process, so ``--processes N`` needs no engine
    address and no cache-key spec; adapters need an engine and are refused."""
    from tokenkeys.cli import build_parser
    from tokenkeys.cli.serve import serve_config
    from tokenkeys.errors import ConfigError

    parse = build_parser().parse_args
    config = serve_config(parse(["serve", "--engine", "none", "--processes", "2"]))
    assert config.engine is None
    serve_config(parse(["serve", "--engine", "none", "--cache-key-profile", "none"]))
    with pytest.raises(ConfigError, match="--lora-modules needs an engine"):
        serve_config(parse(["serve", "--engine", "none", "--lora-modules", "a=/x"]))
    refused = run_cli("serve", "--processes", "2", "--grpc-port", "0", check=False)
    assert refused.returncode == 2 and "--engine none" in refused.stderr


def test_served_name_llmd_cannot_split_is_refused_at_start() -> None:
    """A served name with '@' would put a fourth part into kv@<host:port>@<model>: llm-d's
    parseTopic (tests/events/test_events_zmq.py) would lose the model, so serve refuses it."""
    result = run_cli(
        "serve", "--served-model-name", "org@model", "--grpc-port", "0", "--http-port", "0",
        check=False,
    )  # fmt: skip
    assert result.returncode == 2
    assert "served model name 'org@model'" in result.stderr
    assert "--served-model-name" in result.stderr and "parseTopic" in result.stderr


def test_an_http_engine_address_gets_the_vllm_scheme_hint() -> None:
    from tokenkeys.cli import build_parser
    from tokenkeys.cli.serve import serve_config
    from tokenkeys.errors import ConfigError

    args = build_parser().parse_args(["serve", "--engine", "http://10.0.0.7:8000"])
    with pytest.raises(ConfigError, match=r"--engine vllm\+http://10\.0\.0\.7:8000") as refused:
        serve_config(args)
    assert refused.value.field == "engine"
