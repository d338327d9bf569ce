"""``tokenkeys serve`` runs gRPC and HTTP side by side; chat and path options; SIGTERM."""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys

import httpx
import pytest

from tokenkeys.cli.serve_http import chat_options, load_chat_template
from tokenkeys.client import TokenizerClient
from tokenkeys.errors import ConfigError

from support import REPO, run_cli

TEMPLATE = "{% for m in messages %}[{{ m.role }}|{{ m.content }}|{{ flavour }}]{% endfor %}"


def _start(*args: str, env: dict[str, str]) -> tuple[subprocess.Popen, str, str]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "tokenkeys.cli", "serve", "--grpc-port", "0", "--http-port", "0"]
        + list(args),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO / "src"), **env},
    )
    grpc_target = http_target = ""
    assert proc.stdout is not None
    for line in proc.stdout:
        if "gRPC listening on " in line:
            grpc_target = line.split()[-1]
        if "HTTP listening on " in line:
            http_target = line.split()[-1]
            break
    if not http_target:
        proc.kill()
        raise AssertionError(f"server did not start: {proc.stderr.read() if proc.stderr else ''}")
    return proc, grpc_target, http_target


def test_serve_runs_grpc_and_http_and_stops_on_sigterm(tmp_path) -> None:
    template = tmp_path / "template.jinja"
    template.write_text(TEMPLATE, encoding="utf-8")
    env = {"TOKENKEYS_TOKENIZE_PATH": "/env/tok", "TOKENKEYS_DETOKENIZE_PATH": "/env/detok"}
    proc, grpc_target, http_target = _start(
        "--chat-template",
        str(template),
        "--allowed-template-dir",
        str(tmp_path),
        "--default-chat-template-kwargs",
        '{"flavour": "vanilla"}',
        "--tokenize-path",
        "/cli/tok",
        env=env,
    )
    try:
        base = f"http://{http_target}"
        # The flag wins over the environment; the environment over the default.
        counted = httpx.post(f"{base}/cli/tok", json={"prompt": "Hello world"}).json()
        assert httpx.post(f"{base}/env/tok", json={"prompt": "x"}).status_code == 404
        with TokenizerClient(grpc_target) as client:
            assert list(client.tokenize(["Hello world"]).results[0].ids) == counted["tokens"]
        text = httpx.post(f"{base}/env/detok", json={"tokens": counted["tokens"]}).json()
        assert text == {"prompt": "Hello world"}
        chat = {"messages": [{"role": "user", "content": "hi"}]}
        ids = httpx.post(f"{base}/cli/tok", json=chat).json()["tokens"]
        rendered = httpx.post(f"{base}/env/detok", json={"tokens": ids}).json()["prompt"]
        assert rendered == "[user|hi|vanilla]"
    finally:
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=20)
    assert code == 0
    with pytest.raises(httpx.TransportError):
        httpx.get(f"http://{http_target}/health", timeout=2)


def test_generation_runs_on_the_served_engines_with_lora_adapters() -> None:
    """The engines ``serve`` assembles answer HTTP generation; an adapter is a model name."""
    proc, _, http_target = _start("--lora-modules", "sql=/adapters/sql", env={})
    try:
        base = f"http://{http_target}"
        models = httpx.get(f"{base}/v1/models").json()["data"]
        assert models[-1] == {
            **models[-1],
            "id": "sql",
            "root": "/adapters/sql",
            "parent": "smollm2-135m-instruct",
        }
        prompt = "The router must tokenize every request before it picks a worker. " * 4
        body = {"prompt": prompt, "max_tokens": 2}
        counted = httpx.post(f"{base}/tokenize", json={"model": "sql", "prompt": prompt}).json()
        usages = []
        for model in ("smollm2-135m-instruct", "sql", "sql"):
            answer = httpx.post(f"{base}/v1/completions", json={**body, "model": model}).json()
            assert answer["model"] == model
            usages.append(answer["usage"])
        assert {u["prompt_tokens"] for u in usages} == {counted["count"]}
        # The adapter enters the cache keys: the base model's blocks are no hit for it.
        cached = [u["prompt_tokens_details"]["cached_tokens"] for u in usages]
        assert cached[1] == 0 and cached[2] > 0
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=20) == 0


@pytest.mark.parametrize(
    "args,needle",
    [
        (["--default-chat-template-kwargs", "{nope"], "not valid JSON"),
        (["--chat-template", "missing.jinja"], "no such file"),
        (["--tokenize-path", "/health"], "already a route"),
    ],
)
def test_bad_options_stop_serve_before_it_binds(args, needle) -> None:
    result = run_cli("serve", "--grpc-port", "0", "--http-port", "0", *args, check=False)
    assert result.returncode == 2 and needle in result.stderr


def test_chat_template_is_a_file_or_the_template_itself(tmp_path) -> None:
    path = tmp_path / "t.jinja"
    path.write_text("{{ 1 }}", encoding="utf-8")
    assert load_chat_template(str(path), [tmp_path]) == "{{ 1 }}"
    assert load_chat_template("{{ messages }}") == "{{ messages }}"
    with pytest.raises(ConfigError, match="no such file"):
        load_chat_template(str(tmp_path / "absent.jinja"), [tmp_path])
    args = argparse.Namespace(
        chat_template=None,
        default_chat_template_kwargs='{"enable_thinking": false}',
        trust_request_chat_template=True,
        chat_template_content_format="string",
    )
    options = chat_options(args)
    assert dict(options.default_chat_template_kwargs) == {"enable_thinking": False}
    assert options.trust_request_chat_template and options.content_format == "string"
