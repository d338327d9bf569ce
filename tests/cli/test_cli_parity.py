"""``tokenkeys parity`` against ``tokenkeys serve`` itself as the engine (real processes on
loopback): every built-in shape certified; against a serve with another chat template the
differing shapes named with their first differing token; a corpus file; exit statuses."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest
from doc_blocks import checkout_env, run_shell, shell_block, swap_ports
from ports import free_port
from served import Served

from tokenkeys.parity.corpus import BUILT_IN

from support import run_cli

#: A ChatML template without SmolLM2's default system prompt: only conversations that bring
#: their own system message render the same on both sides.
PLAIN = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
#: The built-in shapes that carry a system message (or instructions) of their own.
WITH_SYSTEM = {"chat-system", "messages-system-blocks", "responses-instructions"}


@pytest.fixture(scope="module")
def engine() -> Iterator[str]:
    with Served() as served:
        yield f"http://{served.http_address}"


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("template") / "plain.jinja"
    path.write_text(PLAIN, encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def other_engine(template: Path) -> Iterator[str]:
    args = ("--chat-template", str(template), "--allowed-template-dir", str(template.parent))
    with Served(*args) as served:
        yield f"http://{served.http_address}"


def _parity(*args: str) -> tuple[int, str, str]:
    done = run_cli("parity", *args, check=False)
    return done.returncode, done.stdout, done.stderr


def test_every_built_in_shape_is_certified_against_serve(engine: str) -> None:
    code, out, err = _parity("--engine", engine, "--json")
    assert code == 0, err
    report = json.loads(out)
    assert report["model"] == "smollm2-135m-instruct"
    assert [s["name"] for s in report["shapes"]] == [s.name for s in BUILT_IN]
    assert {s["status"] for s in report["shapes"]} == {"certified"}
    assert report["certified"] == len(BUILT_IN)
    # Every shape came from the engine's render route of its own kind, never a fallback.
    routes = {s["route"]: s["source"] for s in report["shapes"]}
    assert routes == {
        "chat": "/v1/chat/completions/render",
        "completions": "/v1/completions/render",
        "messages": "/v1/messages/render",
        "responses": "/v1/responses/render",
    }
    assert all(s["tokens"] > 0 for s in report["shapes"])


def test_another_chat_template_names_the_differing_shapes(other_engine: str) -> None:
    code, out, _ = _parity("--engine", other_engine, "--json")
    assert code == 1
    shapes = {s["name"]: s for s in json.loads(out)["shapes"]}
    differing = {name for name, s in shapes.items() if s["status"] == "differs"}
    conversations = {s.name for s in BUILT_IN if s.route != "completions"}
    assert differing == conversations - WITH_SYSTEM
    plain = shapes["chat-plain"]
    # SmolLM2's template opens with its default system prompt; the plain one with the user turn.
    assert plain["index"] == 1
    at = plain["index"] - plain["engine"]["from"]
    assert plain["engine"]["text"][at] == "user"
    assert plain["tokenkeys"]["text"][at] == "system"
    assert plain["likely_cause"].startswith("likely: the template prologue")

    code, out, _ = _parity("--engine", other_engine)
    assert code == 1
    assert (
        "differs     chat-plain (chat, /v1/chat/completions/render): first differing token "
        "at 1" in out
    )
    assert "['user':" in out and "['system':" in out
    assert f"{len(BUILT_IN) - len(differing)} of {len(BUILT_IN)} shapes certified" in out


def test_the_engine_template_given_to_tokenkeys_certifies_again(
    other_engine: str, template: Path
) -> None:
    code, out, err = _parity("--engine", other_engine, "--chat-template", str(template))
    assert code == 0, out + err
    assert f"{len(BUILT_IN)} of {len(BUILT_IN)} shapes certified" in out


def test_a_corpus_file(engine: str, tmp_path: Path) -> None:
    corpus = tmp_path / "shapes.jsonl"
    shapes = [
        {"name": "mine", "route": "chat", "body": {"messages": [{"role": "user", "content": "x"}]}},
        {"name": "ids", "route": "completions", "body": {"prompt": [1, 2, 3]}},
        {"name": "refused", "route": "chat", "body": {"messages": []}},
    ]
    corpus.write_text("\n".join(json.dumps(s) for s in shapes) + "\n\n", encoding="utf-8")
    code, out, _ = _parity("--engine", engine, "--corpus", str(corpus), "--json")
    assert code == 1  # one shape the engine refuses is not certified
    results = {s["name"]: s for s in json.loads(out)["shapes"]}
    assert results["mine"]["status"] == results["ids"]["status"] == "certified"
    assert results["refused"]["status"] == "error"
    assert "/v1/chat/completions/render answered 400" in results["refused"]["error"]
    assert engine in results["refused"]["error"]


@pytest.mark.parametrize(
    ("line", "said"),
    [
        ('{"name": "a", "route": "embeddings", "body": {}}', "route 'embeddings' is not one of"),
        ('{"name": "a", "route": "chat"}', 'exactly "name", "route" and "body"'),
        ("{not json", "line 1: not JSON"),
    ],
)
def test_a_bad_corpus_is_a_usage_error(tmp_path: Path, line: str, said: str) -> None:
    corpus = tmp_path / "bad.jsonl"
    corpus.write_text(line + "\n", encoding="utf-8")
    code, _, err = _parity("--engine", "http://127.0.0.1:1", "--corpus", str(corpus))
    assert code == 2
    assert said in err


def test_usage_errors_and_an_absent_engine() -> None:
    code, _, err = _parity()
    assert code == 2 and "--engine" in err
    code, _, err = _parity("--engine", "127.0.0.1:8000")
    assert code == 2 and "give an http://HOST:PORT URL" in err
    code, _, err = _parity("--engine", "http://127.0.0.1:8000", "--timeout", "0")
    assert code == 2 and "--timeout 0.0: give a positive number of seconds" in err
    closed = f"http://127.0.0.1:{free_port()}"
    code, _, err = _parity("--engine", closed, "--timeout", "5")
    assert code == 2 and f"engine {closed} /v1/models" in err
    # With the model named, each shape reports the engine it could not reach.
    code, out, _ = _parity("--engine", closed, "--model", "m", "--timeout", "5", "--json")
    assert code == 1
    errors = [s["error"] for s in json.loads(out)["shapes"]]
    assert all(e.startswith(f"engine {closed} /v1/") for e in errors)


class _NoScaleOut(ThreadingHTTPServer):
    """A stand-in for ``vllm serve`` without ``--enable-scale-out`` (no real vLLM runs in this
    module): the render routes answer vLLM's 403, every other request goes to a real serve."""

    def __init__(self, target: str) -> None:
        super().__init__(("127.0.0.1", 0), _Relay)
        self.target = target

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class _Relay(BaseHTTPRequestHandler):
    server: _NoScaleOut

    def _answer(self, status: int, body: bytes) -> None:
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        answer = httpx.get(self.server.target + self.path)
        self._answer(answer.status_code, answer.content)

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        body = self.rfile.read(int(self.headers["content-length"]))
        if self.path.endswith("/render"):
            message = {"error": {"message": "Scale-out endpoints are disabled", "code": 403}}
            self._answer(403, json.dumps(message).encode())
            return
        answer = httpx.post(
            self.server.target + self.path,
            content=body,
            headers={"content-type": "application/json"},
        )
        self._answer(answer.status_code, answer.content)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture(scope="module")
def no_scale_out(engine: str) -> Iterator[str]:
    server = _NoScaleOut(engine)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.url
    finally:
        server.shutdown()
        server.server_close()


def test_without_render_routes_tokenize_and_the_engines_count_certify(no_scale_out: str) -> None:
    code, out, _ = _parity("--engine", no_scale_out, "--json")
    assert code == 0, out
    shapes = json.loads(out)["shapes"]
    for shape in shapes:
        assert shape["status"] == "certified", shape
        assert shape["source"].endswith("/render answered 403)")
        if shape["route"] in ("chat", "completions"):
            assert shape["source"].startswith("/tokenize (/v1/")
        else:  # the conversion tokenized, and the engine's own count of the request as sent
            assert shape["source"].startswith("/tokenize of tokenkeys' conversion and /v1/")


def test_the_documented_check_runs_as_written(tmp_path: Path) -> None:
    # ``tokenkeys`` is this checkout's; the block's two ports become free ones.
    env = checkout_env(tmp_path)
    grpc_port, http_port = free_port(), free_port()
    block = swap_ports(
        shell_block(
            "docs/router.md",
            "tests/cli/test_cli_parity.py::test_the_documented_check_runs_as_written",
        ),
        {50061: grpc_port, 8010: http_port},
    )
    with run_shell(block, cwd=tmp_path, env=env, listens={"serve": [http_port]}) as ran:
        lines = ran.stdout.splitlines()
    assert lines[-1] == (
        f"{len(BUILT_IN)} of {len(BUILT_IN)} shapes certified against "
        f"http://127.0.0.1:{http_port} (smollm2-135m-instruct)"
    )
    assert len(lines) == len(BUILT_IN) + 1
    assert all(line.startswith("certified   ") for line in lines[:-1])
