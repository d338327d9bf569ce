"""Real HTTP servers for the HTTP frontend tests: uvicorn on a loopback port, on its own thread.

The server runs in this process, so a test can inject drift into a route (monkeypatch) and see
a guard catch it; clients are ordinary httpx clients, as a router's would be.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx

from tokenkeys.engine.simulated.engine import SimulatedEngine
from tokenkeys.engine.simulated.latency import LatencyModel
from tokenkeys.frontend import HttpConfig
from tokenkeys.keys import block_keys, make_spec
from tokenkeys.limits import Limits
from tokenkeys.preprocess.chat import ChatOptions
from tokenkeys.server.assembly import EngineServer, ServeConfig
from tokenkeys.server.runtime.loading import ModelSource, load_models
from tokenkeys.serving.models import ModelRegistry
from tokenkeys.tokenizer import TokenizerOptions, default_tokenizer_path

from support import LoopServerThread

BLOCK_SIZE = 16


def attach_engines(
    models: ModelRegistry,
    *,
    num_blocks: int = 4096,
    max_model_len: int | None = None,
    output_vocab: range | None = None,
) -> ModelRegistry:
    """Give every model a simulated engine keyed by vLLM 0.31+ sha256_cbor, 16-token blocks.

    The bare simulated engine (an :class:`~tokenkeys.engine.protocol.Engine` without adapters
    or event publishing) as each model's ``engine``; ``output_vocab`` narrows the ids it draws
    (its default otherwise), e.g. to make the end-of-turn id likely.
    """
    spec = make_spec("vllm/sha256_cbor@0.31", BLOCK_SIZE)
    for model in models:
        engine = SimulatedEngine(
            key_fn=lambda tokens, ctx: block_keys(tokens, spec, ctx),
            block_size=BLOCK_SIZE,
            num_blocks=num_blocks,
            latency=LatencyModel(sleep=False),
            max_model_len=max_model_len,
            **({} if output_vocab is None else {"output_vocab": output_vocab}),
        )
        models.replace(dataclasses.replace(model, engine=engine))
    return models


def registry(
    *sources: Path | ModelSource,
    options: TokenizerOptions | None = None,
    chat: ChatOptions | None = None,
    limits: Limits | None = None,
    engines: bool = True,
) -> ModelRegistry:
    """Load tokenizer folders (none: the embedded default) into a registry, engines attached.

    A path is served under its folder name; a :class:`ModelSource` under its own name.
    """
    models = load_models(
        [s if isinstance(s, ModelSource) else ModelSource(s.name, s) for s in sources],
        options or TokenizerOptions(),
        limits or Limits(),
        chat,
    )
    return attach_engines(models) if engines else models


class HttpServerThread(LoopServerThread):
    """The HTTP frontend of ``models`` alone (no gRPC, engines as attached) on 127.0.0.1."""

    def __init__(
        self, models: ModelRegistry, config: HttpConfig | None = None, *, tls: Any = None
    ) -> None:
        super().__init__()
        self.models = models
        self.config = config or HttpConfig()
        self.tls = tls

    async def _start(self) -> tuple[Any, int]:
        serve = ServeConfig(
            grpc_port=None, http_port=0, engine=None, http=self.config, tls=self.tls
        )
        server = await EngineServer(self.models, serve).start()
        return server, server.http_port

    async def _stop(self) -> None:
        await self.server.stop()

    @property
    def app(self) -> Any:
        """The running FastAPI app."""
        return self.server.app

    @property
    def url(self) -> str:
        return f"{'https' if self.tls else 'http'}://127.0.0.1:{self.port}"


def bos_variant(folder: Path) -> Path:
    """A copy of the embedded tokenizer whose post-processor adds a BOS (``<|endoftext|>``).

    The embedded SmolLM2 tokenizer adds no special tokens, so ``add_special_tokens`` would
    change nothing; this variant makes the completion default observable with it alone.
    """
    import json

    from tokenkeys.tokenizer import default_tokenizer_path

    src = default_tokenizer_path()
    spec = json.loads((src / "tokenizer.json").read_text(encoding="utf-8"))
    spec["post_processor"] = {
        "type": "TemplateProcessing",
        "single": [
            {"SpecialToken": {"id": "<|endoftext|>", "type_id": 0}},
            {"Sequence": {"id": "A", "type_id": 0}},
        ],
        "pair": [
            {"SpecialToken": {"id": "<|endoftext|>", "type_id": 0}},
            {"Sequence": {"id": "A", "type_id": 0}},
            {"Sequence": {"id": "B", "type_id": 1}},
        ],
        "special_tokens": {
            "<|endoftext|>": {"id": "<|endoftext|>", "ids": [0], "tokens": ["<|endoftext|>"]}
        },
    }
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "tokenizer.json").write_text(json.dumps(spec), encoding="utf-8")
    config = (src / "tokenizer_config.json").read_text(encoding="utf-8")
    (folder / "tokenizer_config.json").write_text(config, encoding="utf-8")
    return folder


@contextlib.contextmanager
def served_as(name: str, max_model_len: int = 4096) -> Iterator[tuple[httpx.Client, ModelRegistry]]:
    """The embedded tokenizer served as ``name`` on a simulated engine with a context of
    ``max_model_len``, on a loopback port: a client of it, and the models it serves."""
    models = registry(ModelSource(name, default_tokenizer_path()), engines=False)
    attach_engines(models, max_model_len=max_model_len)
    with HttpServerThread(models) as thread, httpx.Client(base_url=thread.url, timeout=60) as c:
        yield c, models
