"""Hosting engines whose KV events this process streams: the simulated engine, the vLLM sidecar.

Per model: spec (the runtime's ``spec_of``) -> :class:`EventStream` (with a
:class:`ZmqEventPublisher` on a routable endpoint plus a replay endpoint, topic
``kv@<host:port>@<model>`` by default) -> the kind's engine, built from the model's name,
tokenizer, spec and stream, then started. ``Control`` is answered here, from these engines.

``SubscribeKvEvents`` streams one model's batches as protobuf ``KvEventBatch``es whose
``sequence_number`` is the ZMQ sequence number of the same batch; a run's numbers start at
:func:`~tokenkeys.events.zmq_publisher.restart_safe_first_seq` and its first batch is
``AllBlocksCleared`` (docs/integrations.md, "Restarts"). ``start_sequence_number``
replays what is still buffered from there on, then follows live. ``include_snapshot`` starts
with the stream's snapshot (``events.snapshot``: ``AllBlocksCleared`` then one ``BlockStored``
per cached block) numbered one below the stream's next sequence number, then follows from that
number: no gap, nothing twice (FAILED_PRECONDITION when the snapshot may lack blocks, as a
relay's that joined vLLM late; ``GetKvSnapshot`` says what it lacks). The stream ends with one
``EngineError``: OVERLOADED (retryable) when the subscriber fell too far behind, DRAINING
(retryable) when the server stops.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from dataclasses import dataclass

from tokenkeys._gen.openengine.v1 import kv_pb2, lifecycle_pb2, model_pb2, server_pb2
from tokenkeys.engine.fronted import FrontedEngine
from tokenkeys.engine.hosting import EngineInputs, StreamedEngine
from tokenkeys.engine.proto_errors import draining, engine_error
from tokenkeys.errors import InvalidArgument, LimitExceeded
from tokenkeys.events.model import AllBlocksCleared, EventBatch, EventSourceInfo, SpecRef
from tokenkeys.events.protobuf_codec import ProtobufEventCodec, int_encoding_of
from tokenkeys.events.stream import EventStream
from tokenkeys.events.vllm_codec import VllmMsgpackCodec, layout_for
from tokenkeys.events.zmq_publisher import ZmqEventPublisher, restart_safe_first_seq
from tokenkeys.keys.proto import spec_ref
from tokenkeys.server.runtime import discovery_messages as messages
from tokenkeys.server.runtime.state import RuntimeState
from tokenkeys.serving.models import ServedModel, with_spec


@dataclass
class StreamedParts:
    """The running parts of one model: its engine, its ZMQ publisher and protobuf codec."""

    engine: StreamedEngine
    protobuf: ProtobufEventCodec
    publisher: ZmqEventPublisher | None = None

    @property
    def stream(self) -> EventStream:
        """The model's event stream."""
        return self.engine.stream

    def zmq_source(self) -> EventSourceInfo | None:
        """The advertised ZMQ source, with resolved routable addresses."""
        return self.engine.stream.source_info()


def _check_ranks(ranks: list[int]) -> bool:
    """Whether the requested data-parallel ranks include this engine's only rank, 0."""
    return not ranks or 0 in ranks


class StreamedHosting:
    """The engines of a process that streams their events; see the module doc."""

    def __init__(self, runtime: RuntimeState) -> None:
        self.runtime = runtime
        self.models: dict[str, StreamedParts] = {}
        self._publishers: list[ZmqEventPublisher] = []
        self._engines: list[StreamedEngine] = []

    async def start(self, bind_host: str) -> None:
        """Build and start every model's engine, in order."""
        for index, model in enumerate(self.runtime.models):
            self.models[model.name] = await self._start_model(index, model, bind_host)

    def _publisher(
        self, index: int, model: str, bind_host: str, first_seq: int
    ) -> ZmqEventPublisher | None:
        config = self.runtime.config
        if not config.kv_events:
            return None
        pub_port, replay_port = config.ports(index)
        host = f"[{bind_host}]" if ":" in bind_host else bind_host
        return ZmqEventPublisher(
            f"tcp://{host}:{pub_port}",
            replay_endpoint=None if replay_port is None else f"tcp://{host}:{replay_port}",
            topic=config.topic(self.runtime.grpc_address or "", model),
            buffer_steps=config.kv_events_buffer_steps,
            hwm=config.kv_events_hwm,
            advertise_host=config.advertise_host,
            replay_topic=layout_for(config.wire_version).replay_topic,
            first_seq=first_seq,
        )

    async def _start_model(self, index: int, model: ServedModel, bind_host: str) -> StreamedParts:
        runtime, config = self.runtime, self.runtime.config
        spec = runtime.spec_of(model)
        learned = await runtime.kind.spec(EngineInputs(model.name, model.tokenizer, spec, config))
        if learned != spec:
            spec = learned
            runtime.models.replace(with_spec(model, spec))
        # Never back across restarts, so no consumer drops this run's batches as stale.
        first_seq = restart_safe_first_seq()
        publisher = self._publisher(index, model.name, bind_host, first_seq)
        if publisher is not None:
            self._publishers.append(publisher)
            await publisher.start()
        stream = EventStream(
            SpecRef(spec.profile_id, spec.fingerprint),
            publisher=publisher,
            codec=VllmMsgpackCodec(config.wire_version),
            buffer_steps=config.kv_events_buffer_steps,
            subscriber_backlog=config.kv_events_subscriber_backlog,
            first_seq=first_seq,
            snapshot_on_join=config.kv_events_join_snapshot,
        )
        # A run's first batch clears what any consumer kept of an earlier run of this engine
        # (its prefix cache is empty now; behind a restarted sidecar, vLLM's is replayed).
        stream.emit(EventBatch(time.time(), (AllBlocksCleared(),)))
        inputs = EngineInputs(
            model.name,
            model.tokenizer,
            spec,
            config,
            stream,
            runtime.kind_metrics,
            model.preprocessor,
        )
        # A kind hosted "streamed" builds a StreamedEngine (engine.registry.EngineKind).
        engine: StreamedEngine = runtime.kind.build(inputs)  # type: ignore[assignment]
        self._engines.append(engine)
        await engine.start()
        protobuf = ProtobufEventCodec(int_encoding_of(spec.event_encoding), spec_ref(spec))
        return StreamedParts(engine, protobuf, publisher)

    def parts(self, model: str) -> StreamedParts:
        """The parts of a served model (KeyError when it has none)."""
        return self.models[model]

    def describe(self) -> list[str]:
        """One line per model: engine kind, blocks, spec and event endpoints."""
        lines = []
        for name, parts in self.models.items():
            engine = parts.engine
            line = (
                f"engine {name}: {engine.describe()}, {engine.num_blocks} KV blocks of "
                f"{engine.block_size} tokens, keys {engine.spec.profile_id} "
                f"(spec {engine.spec.fingerprint})"
            )
            info = parts.zmq_source()
            if info is not None:
                line += (
                    f"; KV events on {info.endpoint} (replay {info.replay_endpoint or 'off'}, "
                    f"topic {info.topic!r})"
                )
            lines.append(line)
        return lines

    def end_streams(self) -> None:
        """End every KV-event subscription (terminal message)."""
        for parts in self.models.values():
            parts.stream.close()

    async def close(self) -> None:
        """Close the engines, then the publishers (idempotent)."""
        engines, self._engines = self._engines, []
        for engine in engines:
            await engine.close()
        publishers, self._publishers = self._publishers, []
        for publisher in publishers:
            await publisher.close()

    def _ready(self, model: str) -> StreamedParts:
        return self.runtime.serving(self.parts, model)

    def _engines_in_order(self) -> list[StreamedEngine]:
        return [self._ready(name).engine for name in self.runtime.models.names]

    async def server_info(self, request: server_pb2.GetServerInfoRequest) -> server_pb2.ServerInfo:
        """This process's identity and the engines' capacity (an engine down: Unavailable)."""
        engines = self._engines_in_order()
        for engine in engines:
            await engine.ensure_up()
        return messages.server_info(self.runtime, engines)

    async def model_info(
        self, model: ServedModel, request: model_pb2.GetModelInfoRequest
    ) -> model_pb2.ModelInfo:
        """The model's limits and capabilities, and its tokenizer advertisement."""
        engine = self._ready(model.name).engine
        return messages.model_info(model, self.runtime.config, engine)

    async def load(self, request: server_pb2.GetLoadRequest) -> server_pb2.LoadInfo:
        """Running and waiting requests and KV blocks in use, over every model."""
        return await messages.load_info(self.runtime.instance_id, self._engines_in_order())

    async def health(self, request: lifecycle_pb2.HealthRequest) -> lifecycle_pb2.HealthResponse:
        """STARTING until assembled, READY, NOT_READY while a fronted vLLM does not answer (its
        reason in the message), DRAINING while stopping."""
        runtime = self.runtime
        if runtime.ready and not runtime.draining:
            unready = await self._unready()
        else:
            unready = runtime.lifecycle.starting  # what the engines wait for, while starting
        return messages.health(runtime, request.include_inference_probe, unready)

    async def _unready(self) -> str | None:
        """Why an engine that is a server of its own (a fronted vLLM) cannot serve now, or None."""
        for engine in self._engines_in_order():
            if isinstance(engine, FrontedEngine):
                reason = await engine.unready()
                if reason is not None:
                    return reason
        return None

    async def event_sources(
        self, names: list[str], request: kv_pb2.GetKvEventSourcesRequest
    ) -> kv_pb2.GetKvEventSourcesResponse:
        """The ZMQ and gRPC sources of each model (none for ranks other than 0)."""
        response = kv_pb2.GetKvEventSourcesResponse()
        if _check_ranks(list(request.data_parallel_ranks)):
            for name in names:
                parts = self._ready(name)
                response.sources.extend(
                    messages.event_sources(
                        self.runtime,
                        parts.engine.model_name,
                        parts.protobuf.key_spec,
                        parts.zmq_source(),
                    )
                )
        return response

    async def subscribe(
        self, model: ServedModel, request: kv_pb2.SubscribeKvEventsRequest
    ) -> AsyncIterator[kv_pb2.SubscribeKvEventsResponse]:
        """The model's batches from ``start_sequence_number``, then live; see the module doc."""
        if not _check_ranks(list(request.data_parallel_ranks)):
            raise InvalidArgument(
                f"data_parallel_ranks {list(request.data_parallel_ranks)} are not served here; "
                "this engine has rank 0 only",
                field="data_parallel_ranks",
            )
        parts = self._ready(model.name)
        codec = parts.protobuf
        stream = parts.stream
        if request.include_snapshot:
            if request.start_sequence_number:
                raise InvalidArgument(
                    "include_snapshot and start_sequence_number "
                    f"{request.start_sequence_number} exclude each other: the snapshot "
                    "decides where the stream starts; send one of them",
                    field="start_sequence_number",
                )
            batches = stream.subscribe_from_snapshot()
        else:
            batches = stream.subscribe(request.start_sequence_number)
        try:
            async for seq, batch in batches:
                yield kv_pb2.SubscribeKvEventsResponse(batch=codec.encode(seq, batch))
        except LimitExceeded as error:
            yield kv_pb2.SubscribeKvEventsResponse(error=engine_error(error))
            return
        yield kv_pb2.SubscribeKvEventsResponse(
            error=draining(
                "the server is stopping; resubscribe (to another instance) with "
                "start_sequence_number set to the next sequence number you need"
            )
        )
