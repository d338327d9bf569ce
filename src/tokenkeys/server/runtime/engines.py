"""Assembling and running the engines of a server: one per served model, all or nothing.

Per model: spec (``runtime.local.deployment_spec`` unless given) -> key function ->
:class:`EventStream` (with a :class:`ZmqEventPublisher` on a routable endpoint plus a replay
endpoint, topic ``kv@<host:port>@<model>`` by default) -> the simulated engine, attached as
the model's ``engine``; with ``--engine vllm+http://HOST:PORT`` the same stream fed by the real
vLLM's relayed events and a :class:`VllmSidecarEngine`; or, with ``--engine HOST:PORT``, a
:class:`RemoteEngine`.

Lifecycle: :meth:`EngineRuntime.start` after the gRPC server is listening (the topic and the
advertised gRPC source name its port); :meth:`EngineRuntime.begin_shutdown` ends every KV-event
subscription with a terminal message and refuses new requests; :meth:`EngineRuntime.close`
after the gRPC server stopped closes the sockets.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

import grpc
from prometheus_client import CollectorRegistry

from tokenkeys.engine.remote import RemoteEngine
from tokenkeys.engine.simulated.local import LocalEngine, deployment_spec
from tokenkeys.engine.vllm.checks import wire_version_of
from tokenkeys.engine.vllm.client import VllmHttpClient
from tokenkeys.engine.vllm.key_check import KeyCheck, keys_checked
from tokenkeys.engine.vllm.sidecar import VllmSidecarEngine
from tokenkeys.errors import FailedPrecondition, NotFound, Unavailable
from tokenkeys.events.model import AllBlocksCleared, EventBatch, EventSourceInfo, SpecRef
from tokenkeys.events.protobuf_codec import ProtobufEventCodec, int_encoding_of
from tokenkeys.events.stream import EventStream
from tokenkeys.events.vllm_codec import VllmMsgpackCodec, layout_for
from tokenkeys.events.zmq_endpoint import routable_endpoint
from tokenkeys.events.zmq_publisher import ZmqEventPublisher, restart_safe_first_seq
from tokenkeys.keys import CacheKeySpec
from tokenkeys.keys.proto import spec_ref
from tokenkeys.server.runtime.config import EngineConfig
from tokenkeys.serving.models import ModelRegistry, ServedModel

log = logging.getLogger(__name__)


#: An engine whose KV events this process streams itself: simulated, or a fronted vLLM.
HostedEngine = LocalEngine | VllmSidecarEngine


@dataclass
class ModelEngine:
    """The running engine parts of one served model (``local`` or ``remote`` is set).

    ``local`` is a hosted engine: its events are this server's stream (simulated, or relayed
    from the vLLM it fronts).
    """

    model: str
    local: HostedEngine | None = None
    remote: RemoteEngine | None = None
    publisher: ZmqEventPublisher | None = None
    protobuf: ProtobufEventCodec | None = None

    @property
    def stream(self) -> EventStream | None:
        """The model's event stream (simulated engines only)."""
        return self.local.stream if self.local is not None else None

    def zmq_source(self) -> EventSourceInfo | None:
        """The advertised ZMQ source, with resolved routable addresses."""
        return self.local.stream.source_info() if self.local is not None else None


class EngineRuntime:
    """Every engine of one server process; see the module doc for the lifecycle."""

    def __init__(
        self,
        models: ModelRegistry,
        config: EngineConfig,
        *,
        spec_of: Callable[[ServedModel], CacheKeySpec] = deployment_spec,
    ) -> None:
        self.models = models
        self.config = config
        self.spec_of = spec_of
        self.engines: dict[str, ModelEngine] = {}
        #: The routable ``host:port`` of this server's gRPC endpoint, known after start.
        self.grpc_address: str | None = None
        self.ready = False
        self.draining = False
        self._channel: grpc.aio.Channel | None = None
        #: Metrics of the engines (exported on the HTTP ``/metrics``): the live key check.
        self.metrics = CollectorRegistry(auto_describe=True)
        self.keys_checked = keys_checked(self.metrics)

    @property
    def instance_id(self) -> str:
        """This process's instance id."""
        return self.config.instance_id

    @property
    def remote(self) -> bool:
        """Whether generation is forwarded to a remote engine."""
        return self.config.remote_engine is not None

    async def start(self, bind_host: str, grpc_port: int) -> None:
        """Build and start every model's engine; on any failure nothing stays open."""
        self.grpc_address = routable_endpoint(
            f"tcp://{bind_host}:{grpc_port}", self.config.advertise_host
        ).removeprefix("tcp://")
        try:
            await self._adopt_vllm_wire_version()
            if self.config.remote_engine is not None:
                self._channel = grpc.aio.insecure_channel(self.config.remote_engine)
            for index, model in enumerate(self.models):
                self.engines[model.name] = await self._start_model(index, model, bind_host)
        except BaseException:
            await self.close()
            raise
        for model in self.models:
            parts = self.engines[model.name]
            self.models.replace(dataclasses.replace(model, engine=parts.local or parts.remote))
        self.ready = True

    async def _adopt_vllm_wire_version(self) -> None:
        """In front of a vLLM, unless ``--kv-events-vllm-version`` names one, the event layout
        is that of the release vLLM reports (or the start is refused): the relay decodes vLLM's
        events with it and this server publishes them in it again."""
        vllm = self.config.vllm
        if vllm is None or self.config.kv_events_vllm_version is not None:
            return
        client = VllmHttpClient(vllm.url)
        try:
            version = await wire_version_of(client)
        finally:
            await client.close()
        log.info("KV events in vLLM %s's layout, the release vLLM at %s reports", version, vllm.url)
        self.config = dataclasses.replace(self.config, kv_events_vllm_version=version)

    async def _start_model(self, index: int, model: ServedModel, bind_host: str) -> ModelEngine:
        if self._channel is not None:
            target = self.config.remote_engine or ""
            return ModelEngine(model.name, remote=RemoteEngine(target, model.name, self._channel))
        config = self.config
        spec = self.spec_of(model)
        # Never back across restarts, so no consumer drops this run's batches as stale.
        first_seq = restart_safe_first_seq()
        publisher = None
        if config.kv_events:
            pub_port, replay_port = config.ports(index)
            host = f"[{bind_host}]" if ":" in bind_host else bind_host
            publisher = ZmqEventPublisher(
                f"tcp://{host}:{pub_port}",
                replay_endpoint=None if replay_port is None else f"tcp://{host}:{replay_port}",
                topic=config.topic(self.grpc_address or "", model.name),
                buffer_steps=config.kv_events_buffer_steps,
                hwm=config.kv_events_hwm,
                advertise_host=config.advertise_host,
                replay_topic=layout_for(config.wire_version).replay_topic,
                first_seq=first_seq,
            )
        parts = ModelEngine(model.name, publisher=publisher)
        try:
            if publisher is not None:
                await publisher.start()
            stream = EventStream(
                SpecRef(spec.profile_id, spec.fingerprint),
                publisher=publisher,
                codec=VllmMsgpackCodec(config.wire_version),
                buffer_steps=config.kv_events_buffer_steps,
                subscriber_backlog=config.kv_events_subscriber_backlog,
                first_seq=first_seq,
            )
            # A run's first batch clears what any consumer kept of an earlier run of this
            # engine (its prefix cache is empty now, or, behind a restarted sidecar, replayed).
            stream.emit(EventBatch(time.time(), (AllBlocksCleared(),)))
            if config.vllm is not None:
                sidecar = VllmSidecarEngine(
                    model,
                    spec,
                    stream,
                    config.vllm,
                    KeyCheck(spec, model.name, self.keys_checked),
                    max_model_len=config.max_model_len,
                    wire_version=config.wire_version,
                )
                parts.local = sidecar
                await sidecar.start()
            else:
                parts.local = LocalEngine(model, spec, stream, config)
            parts.protobuf = ProtobufEventCodec(
                int_encoding_of(spec.event_encoding), spec_ref(spec)
            )
        except BaseException:
            if isinstance(parts.local, VllmSidecarEngine):
                await parts.local.close()
            if publisher is not None:
                await publisher.close()
            raise
        return parts

    def describe(self) -> list[str]:
        """One line per model for the server log: engine, spec and event endpoints."""
        lines = [f"instance id {self.instance_id}"]
        for name, parts in self.engines.items():
            if parts.remote is not None:
                lines.append(f"engine {name}: remote OpenEngine engine at {parts.remote.target}")
                continue
            local = parts.local
            assert local is not None
            kind = (
                f"vLLM at {local.config.url}"
                if isinstance(local, VllmSidecarEngine)
                else "simulated"
            )
            line = (
                f"engine {name}: {kind}, {local.num_blocks} KV blocks of {local.block_size} "
                f"tokens, keys {local.spec.profile_id} (spec {local.spec.fingerprint})"
            )
            info = parts.zmq_source()
            if info is not None:
                line += (
                    f"; KV events on {info.endpoint} (replay {info.replay_endpoint or 'off'}, "
                    f"topic {info.topic!r})"
                )
            lines.append(line)
        return lines

    def engine_of(self, model: str) -> HostedEngine | RemoteEngine:
        """The engine of ``model`` (what the served model's ``engine`` is)."""
        parts = self.parts(model)
        engine = parts.local or parts.remote
        assert engine is not None
        return engine

    def parts(self, model: str) -> ModelEngine:
        """The engine parts of a served model (names are resolved by the model registry)."""
        if not self.ready or self.draining:
            raise Unavailable(
                "the engine is " + ("stopping" if self.draining else "starting") + "; retry",
                field="model",
            )
        try:
            return self.engines[model]
        except KeyError:
            raise NotFound(f"model {model!r} has no engine here", field="model") from None

    def local(self, model: str) -> ModelEngine:
        """The parts of a simulated engine; FAILED_PRECONDITION in remote mode."""
        parts = self.parts(model)
        if parts.local is None:
            raise FailedPrecondition(
                f"model {model!r} is generated by the remote engine {self.config.remote_engine}",
                field="model",
            )
        return parts

    async def ensure_up(self) -> None:
        """Raise Unavailable when a fronted vLLM is down: discovery then finds this server down,
        and a router admits it again only once its engine answers."""
        for parts in self.engines.values():
            if isinstance(parts.local, VllmSidecarEngine):
                await parts.local.ensure_up()

    def begin_shutdown(self) -> None:
        """Refuse new requests and end every KV-event subscription (terminal message)."""
        self.draining = True
        for parts in self.engines.values():
            if parts.local is not None:
                parts.local.stream.close()

    async def close(self) -> None:
        """Close publishers and the remote channel (idempotent)."""
        self.begin_shutdown()
        self.ready = False
        for parts in self.engines.values():
            if isinstance(parts.local, VllmSidecarEngine):
                await parts.local.close()
            if parts.publisher is not None:
                await parts.publisher.close()
        if self._channel is not None:
            await self._channel.close()
            self._channel = None
