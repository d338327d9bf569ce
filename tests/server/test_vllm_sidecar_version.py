"""The sidecar reads the KV-event layout of the vLLM it fronts from vLLM's ``GET /version``, and
the names it serves its model under from ``GET /v1/models`` when none was given.

Against a real HTTP server on loopback answering as vLLM's ``/version`` does
(``{"version": "0.32.0"}``, ``vllm/entrypoints/openai/api_server.py`` in 0.32) but with a
release no layout is known for, or with no ``/version`` at all: the start is refused, naming the
version, the supported releases and the option. Against the real vLLM 0.32 the default is
``tests/realengine/test_vllm_sidecar.py`` (its sidecar is started without the option), and
the served name ``tests/realengine/test_vllm_sidecar_start.py``.
"""

from __future__ import annotations

import json
import threading
from collections import Counter
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from engine_stack import default_models, start_stack

from tokenkeys.engine.config import EngineConfig, VllmEngineConfig
from tokenkeys.engine.vllm.checks import prepare
from tokenkeys.errors import ConfigError, NotFound, TokenkeysError
from tokenkeys.limits import Limits
from tokenkeys.server.runtime.engines import EngineRuntime
from tokenkeys.server.runtime.loading import ModelSource, load_models
from tokenkeys.tokenizer import TokenizerOptions, default_tokenizer_path

from support import run_cli

EVENTS = "tcp://127.0.0.1:9"  # never reached: the start stops before the event stream
URL = "http://127.0.0.1:9"
EMBEDDED = default_tokenizer_path()
LOAD = (TokenizerOptions(), Limits())


#: ``/v1/models`` of a vLLM 0.32 started with ``--served-model-name tiny t --lora-modules
#: ada=...`` (``OpenAIServingModels.show_available_models``: one card per served name, root the
#: model path; adapters after them with their parent, the first name).
MODELS = [
    {
        "id": "tiny",
        "object": "model",
        "root": "/models/tiny",
        "parent": None,
        "max_model_len": 4096,
    },
    {"id": "t", "object": "model", "root": "/models/tiny", "parent": None, "max_model_len": 4096},
    {"id": "ada", "object": "model", "root": "/adapters/ada", "parent": "tiny"},
]


class _Engine(ThreadingHTTPServer):
    """Answers GET ``/health`` 200, ``/version`` with ``version`` (None: 404, as any unknown
    path), ``/v1/models`` with ``models`` and ``/kv_event_sources`` with ``sources`` (None:
    404); counts hits."""

    def __init__(
        self, version: str | None, models: list[dict] | None = None, sources: dict | None = None
    ) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.version = version
        self.models = MODELS if models is None else models
        self.sources = sources
        self.hits: Counter[str] = Counter()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class _Handler(BaseHTTPRequestHandler):
    server: _Engine

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        self.server.hits[self.path] += 1
        if self.path == "/health":  # up, as vLLM answers once it serves (the sidecar waits)
            body, status = b"", 200
        elif self.path == "/version" and self.server.version is not None:
            body, status = json.dumps({"version": self.server.version}).encode(), 200
        elif self.path == "/kv_event_sources" and self.server.sources is not None:
            body, status = json.dumps(self.server.sources).encode(), 200
        elif self.path == "/v1/models":
            body, status = json.dumps({"object": "list", "data": self.server.models}).encode(), 200
        else:
            body, status = b'{"detail": "Not Found"}', 404
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:  # quiet
        pass


@pytest.fixture
def engine(request: pytest.FixtureRequest) -> Iterator[_Engine]:
    server = _Engine(*request.param) if isinstance(request.param, tuple) else _Engine(request.param)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


def _config(engine: _Engine, version: str | None = None) -> EngineConfig:
    # The events endpoint is never reached: every case here stops at the start checks.
    vllm = VllmEngineConfig(engine.url, "tcp://127.0.0.1:9")
    return EngineConfig(engine=vllm, kv_events_vllm_version=version)


@pytest.mark.parametrize("engine", ["0.99.0", "0.10.1"], indirect=True)
async def test_an_engine_release_without_a_known_layout_refuses_the_start(engine) -> None:
    with pytest.raises(ConfigError) as caught:
        await start_stack(_config(engine))
    assert caught.value.field == "kv-events-vllm-version"
    assert caught.value.message == (
        f"cannot tell the KV-event layout of vLLM at {engine.url}: vLLM {engine.version} has no "
        "KV-event layout known here; supported: vLLM 0.11 to 0.33; give "
        "--kv-events-vllm-version with the release whose layout its events follow"
    )
    assert engine.hits == {"/health": 1, "/version": 1}  # refused once up, before other checks


@pytest.mark.parametrize("engine", [None], indirect=True)
async def test_an_engine_without_a_version_refuses_the_start(engine) -> None:
    with pytest.raises(ConfigError, match="give --kv-events-vllm-version") as caught:
        await start_stack(_config(engine))
    assert "GET /version gave no release" in caught.value.message
    assert '"Not Found"' in caught.value.message  # what the engine answered


@pytest.mark.parametrize("engine", ["0.99.0"], indirect=True)
async def test_the_option_wins_over_the_engines_version(engine) -> None:
    # Named by hand, the release is the operator's word: /version is not read, and the start
    # goes on to the next check (which this engine, answering nothing else, fails).
    with pytest.raises(TokenkeysError) as caught:
        await start_stack(_config(engine, "0.32"))
    assert "/version" not in engine.hits and engine.hits["/metrics"] == 1
    assert "layout" not in caught.value.message


@pytest.mark.parametrize("engine", ["0.40.0"], indirect=True)
def test_serve_says_why_it_refuses(engine) -> None:
    events = "tcp://127.0.0.1:9"
    result = run_cli(
        "serve", "--grpc-port", "0", "--http-port", "0",
        "--engine", f"vllm+{engine.url}", "--engine-kv-events", events,
        check=False,
    )  # fmt: skip
    assert result.returncode == 2, result.stderr
    assert (
        f"tokenkeys serve: error: cannot tell the KV-event layout of vLLM at {engine.url}: "
        "vLLM 0.40.0 has no KV-event layout known here; supported: vLLM 0.11 to 0.33"
    ) in result.stderr


@pytest.mark.parametrize("engine", ["0.32.0"], indirect=True)
async def test_an_unnamed_model_takes_the_names_vllm_serves_it_under(engine) -> None:
    adopting = EngineConfig(engine=VllmEngineConfig(engine.url, EVENTS, adopt_name=True))
    prepared = await prepare(adopting)
    assert prepared.served_names == ("tiny", "t")  # vLLM's order; the adapter is no name
    assert prepared.kv_events_vllm_version == "0.32"
    # The runtime serves the one model under them: the first is the name answers carry.
    models = default_models()
    EngineRuntime(models, prepared)._serve_as(prepared.served_names)
    assert models.names == ["tiny"] and models.get("t").name == "tiny"
    assert models.get(None).name == "tiny"


@pytest.mark.parametrize("engine", ["0.32.0"], indirect=True)
async def test_a_given_name_is_not_replaced_but_checked(engine) -> None:
    # Given: /v1/models is not read before the engines are built (the start checks compare it
    # with vLLM's and refuse a contradiction: tests/realengine/test_vllm_sidecar.py).
    prepared = await prepare(_config(engine))
    assert prepared.served_names == () and "/v1/models" not in engine.hits


@pytest.mark.parametrize("engine", [("0.32.0", [MODELS[2]])], indirect=True)
async def test_a_vllm_listing_no_model_asks_for_the_name(engine) -> None:
    adopting = EngineConfig(engine=VllmEngineConfig(engine.url, EVENTS, adopt_name=True))
    with pytest.raises(ConfigError, match="lists no model on /v1/models") as caught:
        await prepare(adopting)
    assert caught.value.field == "model"


def test_names_taken_from_the_engine_fit_one_model_only() -> None:
    models = load_models([ModelSource(name, EMBEDDED) for name in ("a", "b")], *LOAD)
    runtime = EngineRuntime(models, EngineConfig(engine=VllmEngineConfig(URL, EVENTS)))
    with pytest.raises(ConfigError, match="loads 2 models") as caught:
        runtime._serve_as(("tiny",))
    assert caught.value.field == "model" and models.names == ["a", "b"]


def test_a_rename_keeps_the_place_and_refuses_a_name_served_twice() -> None:
    models = load_models([ModelSource(name, EMBEDDED) for name in ("a", "b")], *LOAD)
    renamed = models.rename("b", ("c", "c2"))
    assert (renamed.name, renamed.aliases) == ("c", ("c2",)) and models.names == ["a", "c"]
    with pytest.raises(NotFound):
        models.get("b")
    with pytest.raises(ConfigError, match="served twice"):
        models.rename("c", ("a",))
    assert models.names == ["a", "c"] and models.get("c2").name == "c"  # as it was


#: ``/kv_event_sources`` of a vLLM 0.32 started with ``--kv-events-config '{"endpoint":
#: "tcp://*:5557", "replay_endpoint": "tcp://*:5558", "topic": "kv", ...}'`` (rank 0).
SOURCES = {
    "0": {
        "enable_kv_cache_events": True,
        "publisher": "zmq",
        "endpoint": "tcp://*:5557",
        "replay_endpoint": "tcp://*:5558",
        "buffer_steps": 10000,
        "hwm": 100000,
        "max_queue_size": 100000,
        "topic": "kv",
    }
}


@pytest.mark.parametrize("engine", [("0.32.0", None, SOURCES)], indirect=True)
async def test_no_publisher_given_takes_the_one_vllm_reports(engine) -> None:
    prepared = (await prepare(EngineConfig(engine=VllmEngineConfig(engine.url)))).engine
    assert isinstance(prepared, VllmEngineConfig)
    assert (prepared.kv_events, prepared.kv_replay, prepared.kv_topic) == (
        "tcp://127.0.0.1:5557",
        "tcp://127.0.0.1:5558",
        "kv",
    )
    # Given, the publisher is the operator's route to it (not compared); a topic vLLM does
    # not publish on is a contradiction: nothing would arrive.
    given = VllmEngineConfig(engine.url, EVENTS, kv_topic="kv")
    assert (await prepare(EngineConfig(engine=given))).engine == given
    wrong = VllmEngineConfig(engine.url, EVENTS, kv_topic="other")
    with pytest.raises(ConfigError, match="topic 'kv'") as caught:
        await prepare(EngineConfig(engine=wrong))
    assert caught.value.field == "engine-kv-topic" and "'other'" in caught.value.message


@pytest.mark.parametrize("engine", [("0.32.0", None, None)], indirect=True)
async def test_a_vllm_not_saying_where_it_publishes_asks_for_the_option(engine) -> None:
    with pytest.raises(ConfigError, match="give --engine-kv-events") as caught:
        await prepare(EngineConfig(engine=VllmEngineConfig(engine.url)))
    assert caught.value.field == "engine-kv-events" and engine.hits["/kv_event_sources"] == 1
    given = VllmEngineConfig(engine.url, EVENTS, kv_topic="kv")  # nothing to check it against
    assert (await prepare(EngineConfig(engine=given))).engine == given
