"""Describing one worker from its OpenEngine ``Control`` answers: what a router needs to admit it.

:func:`describe_worker` calls GetServerInfo, then GetModelInfo and GetKvEventSources for every
served model, and returns plain frozen values (:class:`WorkerDescription`); nothing here
decides admission (``pool``) or keeps state (``registry``). :func:`read_load` turns GetLoad
into the load the scorer breaks ties with.

Every gRPC failure is translated into the error tree where it is caught: an unreachable worker
is :class:`~tokenkeys.errors.Unavailable`, naming the address (``details["timed_out"]`` when
it was reachable but did not answer before the deadline).
"""

from __future__ import annotations

import re
from collections.abc import Awaitable
from dataclasses import dataclass
from typing import TypeVar

import grpc

from tokenkeys._gen.openengine.v1 import (
    cache_keys_pb2,
    kv_pb2,
    model_pb2,
    openengine_pb2_grpc,
    server_pb2,
)
from tokenkeys.errors import ConfigError, TokenkeysError, Unavailable, from_grpc
from tokenkeys.events.model import SpecRef

T = TypeVar("T")

#: ``ServerInfo.extra`` key naming the vLLM release whose event layout ZMQ payloads follow
#: (``tokenkeys serve`` sets it; see docs/api.md "Engine, discovery and KV events").
WIRE_VERSION_KEY = "kv_events_vllm_version"
#: The layout assumed when a worker does not say (vLLM 0.33: map-encoded events).
DEFAULT_WIRE_VERSION = "0.33"

_ADDRESS = re.compile(r"(\[[0-9a-fA-F:.]+\]|[A-Za-z0-9_.-]+):(\d{1,5})")


def check_address(address: str) -> str:
    """Return ``address`` if it is ``HOST:PORT`` (IPv6 in brackets), else raise ConfigError."""
    match = _ADDRESS.fullmatch(address) if isinstance(address, str) else None
    if match is None or not 0 < int(match[2]) < 65536:
        raise ConfigError(
            f"worker address {address!r} is not HOST:PORT (e.g. 10.0.0.7:50051, "
            "[::1]:50051); give the engine's gRPC address",
            field="worker",
        )
    return address


@dataclass(frozen=True)
class KeySpecRef:
    """The cache-key spec a worker advertises: profile, spec fingerprint, client-computable."""

    profile_id: str
    spec_fingerprint: str
    client_computable: bool

    @property
    def spec(self) -> SpecRef:
        """The reference KV-event batches carry (``tokenkeys.events.model.SpecRef``)."""
        return SpecRef(self.profile_id, self.spec_fingerprint)

    @classmethod
    def of(cls, message: cache_keys_pb2.CacheKeySpecRef) -> KeySpecRef:
        return cls(message.profile_id, message.spec_fingerprint, message.client_computable)


@dataclass(frozen=True)
class EventSource:
    """One advertised KV-event source of a model (``KvEventSource``).

    ``endpoint``: ``tcp://host:port`` for ZMQ, ``host:port`` for gRPC. ``spec`` is the spec its
    hashes follow (None when the source names none: such hashes are never indexed).
    """

    transport: str
    endpoint: str
    topic: str
    spec: KeySpecRef | None
    replay_endpoint: str | None = None
    wire_version: str = DEFAULT_WIRE_VERSION

    @classmethod
    def of(cls, message: kv_pb2.KvEventSource, wire_version: str) -> EventSource:
        addr = message.endpoint_addr
        host = f"[{addr.host}]" if ":" in addr.host else addr.host
        hostport = f"{host}:{addr.port}"
        return cls(
            transport=message.transport,
            endpoint=f"tcp://{hostport}" if message.transport == "zmq" else hostport,
            topic=message.topic,
            spec=KeySpecRef.of(message.key_spec) if message.HasField("key_spec") else None,
            replay_endpoint=message.replay_endpoint or None,
            wire_version=wire_version,
        )


@dataclass(frozen=True)
class ModelDescription:
    """One served model of a worker, as ``GetModelInfo`` and ``GetKvEventSources`` tell it."""

    name: str
    fingerprint: str
    key_spec: KeySpecRef | None
    artifacts_available: bool
    remote_key_computation: bool
    #: Where OpenEngineTokenizer answers for this model ("host:port").
    tokenizer_endpoint: str
    max_context_length: int | None
    sources: tuple[EventSource, ...]
    #: False once the worker found its engine's block hashes differ from its keys (a sidecar's
    #: live key check, ``TokenizerAdvertisement.keys_unverified``).
    keys_verified: bool = True


@dataclass(frozen=True)
class WorkerDescription:
    """What discovery learned about the worker at ``address``."""

    address: str
    instance_id: str
    engine_name: str
    engine_version: str
    models: tuple[ModelDescription, ...]
    #: Its OpenAI HTTP frontend (``ServerInfo.http_frontend``; "" when it advertises none).
    http_frontend: str = ""

    def model(self, name: str) -> ModelDescription | None:
        """The served model called ``name``, if any."""
        return next((m for m in self.models if m.name == name), None)


@dataclass(frozen=True)
class WorkerLoad:
    """A GetLoad answer reduced to what routing uses."""

    instance_id: str
    running: int
    queued: int
    used_kv_blocks: int
    total_kv_blocks: int

    @property
    def load(self) -> float:
        """Requests running plus waiting (the scorer's tie-break: lower is better)."""
        return float(self.running + self.queued)

    @property
    def kv_usage(self) -> float:
        """Fraction of the KV blocks in use (0 when the worker does not say)."""
        return self.used_kv_blocks / self.total_kv_blocks if self.total_kv_blocks else 0.0


async def _call(address: str, what: str, call: Awaitable[T]) -> T:
    try:
        return await call
    except grpc.RpcError as error:
        translated = from_grpc(error)
        timed_out = error.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        if isinstance(translated, Unavailable) or timed_out:
            # ``timed_out``: the worker may only be slow (or this router's own loop late);
            # health polling tolerates a few such misses before it takes a worker out.
            raise Unavailable(
                f"worker {address} did not answer {what}: {translated.message}",
                field="worker",
                worker=address,
                timed_out=timed_out,
            ) from None
        raise type(translated)(
            f"worker {address} refused {what}: {translated.message}",
            field="worker",
            worker=address,
        ) from None


async def describe_worker(
    address: str, control: openengine_pb2_grpc.ControlStub, *, timeout: float = 5.0
) -> WorkerDescription:
    """Discover the worker at ``address`` through its Control stub (one call per question)."""
    info: server_pb2.ServerInfo = await _call(
        address,
        "GetServerInfo",
        control.GetServerInfo(server_pb2.GetServerInfoRequest(), timeout=timeout),
    )
    if not info.instance_id:
        raise TokenkeysError(
            f"worker {address} reports no instance_id in GetServerInfo; a router cannot tell "
            "its restarts apart without one",
            field="instance_id",
        )
    value = info.extra.fields.get(WIRE_VERSION_KEY)
    wire_version = (value.string_value if value is not None else "") or DEFAULT_WIRE_VERSION
    models = []
    for name in info.supported_models:
        model: model_pb2.ModelInfo = await _call(
            address,
            f"GetModelInfo({name})",
            control.GetModelInfo(model_pb2.GetModelInfoRequest(model=name), timeout=timeout),
        )
        sources: kv_pb2.GetKvEventSourcesResponse = await _call(
            address,
            f"GetKvEventSources({name})",
            control.GetKvEventSources(kv_pb2.GetKvEventSourcesRequest(model=name), timeout=timeout),
        )
        ad = model.tokenizer
        models.append(
            ModelDescription(
                name=model.served_model_name or model.model_id or name,
                fingerprint=ad.fingerprint,
                key_spec=KeySpecRef.of(ad.key_spec) if ad.HasField("key_spec") else None,
                artifacts_available=ad.artifacts_available,
                remote_key_computation=ad.remote_key_computation,
                tokenizer_endpoint=ad.tokenizer_endpoint or address,
                max_context_length=(
                    model.max_context_length if model.HasField("max_context_length") else None
                ),
                sources=tuple(EventSource.of(s, wire_version) for s in sources.sources),
                keys_verified=not ad.keys_unverified,
            )
        )
    return WorkerDescription(
        address=address,
        instance_id=info.instance_id,
        engine_name=info.engine_name,
        engine_version=info.engine_version,
        models=tuple(models),
        http_frontend=info.http_frontend,
    )


async def keys_verified(
    address: str, control: openengine_pb2_grpc.ControlStub, model: str, *, timeout: float = 5.0
) -> bool:
    """Whether ``model``'s keys at ``address`` are still verified (its GetModelInfo says so)."""
    info: model_pb2.ModelInfo = await _call(
        address,
        f"GetModelInfo({model})",
        control.GetModelInfo(model_pb2.GetModelInfoRequest(model=model), timeout=timeout),
    )
    return not info.tokenizer.keys_unverified


async def read_load(
    address: str, control: openengine_pb2_grpc.ControlStub, *, timeout: float = 2.0
) -> WorkerLoad:
    """GetLoad of the worker at ``address``; Unavailable when it does not answer in time."""
    load: server_pb2.LoadInfo = await _call(
        address, "GetLoad", control.GetLoad(server_pb2.GetLoadRequest(), timeout=timeout)
    )
    return WorkerLoad(
        instance_id=load.instance_id,
        running=load.running_requests,
        queued=load.queued_requests,
        used_kv_blocks=load.used_kv_blocks,
        total_kv_blocks=load.total_kv_blocks,
    )
