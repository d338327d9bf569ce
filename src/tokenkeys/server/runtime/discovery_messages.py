"""The discovery answers of ``Control``: ServerInfo, ModelInfo (with the tokenizer advertisement),
LoadInfo, HealthResponse and the KV-event sources, built from the running engines.

The hostings build their answers here from the :class:`RuntimeState` they hold (the streamed
one all of them, the forwarded one its tokenizer advertisement and its own Health while the
runtime starts or stops).

Field meanings follow OpenEngine v1 (ai-dynamo/openengine docs/api.md @4def7c5): presence-aware
scalars are set only when known; ``endpoint_addr`` is always a routable host, never a wildcard.
"""

from __future__ import annotations

import re
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

import tokenkeys
from tokenkeys._gen.openengine.v1 import (
    cache_keys_pb2,
    kv_pb2,
    lifecycle_pb2,
    model_pb2,
    server_pb2,
)
from tokenkeys.errors import ConfigError
from tokenkeys.events.model import EventSourceInfo
from tokenkeys.events.zmq_endpoint import routable_endpoint
from tokenkeys.keys.proto import spec_ref
from tokenkeys.server.grpc.tokenizer_info import supported_operations
from tokenkeys.server.runtime.state import RuntimeState
from tokenkeys.serving.models import ServedModel

if TYPE_CHECKING:
    from tokenkeys.engine.config import EngineConfig
    from tokenkeys.engine.hosting import StreamedEngine
    from tokenkeys.engine.protocol import Engine

ENGINE_NAME = "tokenkeys-sim"
#: The OpenEngine revision implemented and the immutable source it is taken from.
SCHEMA_REVISION = 1
SCHEMA_RELEASE = "ai-dynamo/openengine@4def7c50b05e0674a0c3b26917399155535966e4"
ARTIFACT_FORMAT = "huggingface"

_TCP = re.compile(r"tcp://\[?(?P<host>[^\]]*?)\]?:(?P<port>\d+)")


def endpoint_of(address: str, protocol: str) -> kv_pb2.KvEndpoint:
    """``tcp://host:port`` (or ``host:port``) as a KvEndpoint; wildcards are a bug here."""
    match = _TCP.fullmatch(address if "://" in address else f"tcp://{address}")
    if match is None or match["host"] in ("", "*", "0.0.0.0", "::"):
        raise ConfigError(f"cannot advertise {address!r}: not a routable tcp host:port")
    return kv_pb2.KvEndpoint(host=match["host"], port=int(match["port"]), protocol=protocol)


def http_frontend_url(host: str, port: int, advertise_host: str | None, tls: object) -> str:
    """``ServerInfo.http_frontend``: the routable ``http(s)://host:port`` of the HTTP face
    (a wildcard bind host advertised as ``advertise_host`` or this machine's address)."""
    hostport = routable_endpoint(f"tcp://{host}:{port}", advertise_host).removeprefix("tcp://")
    return f"{'https' if tls is not None else 'http'}://{hostport}"


def server_info(runtime: RuntimeState, engines: Sequence[StreamedEngine]) -> server_pb2.ServerInfo:
    """GetServerInfo of a server whose ``engines`` (one per model) stream their events here."""
    info = server_pb2.ServerInfo(
        engine_name=ENGINE_NAME,
        engine_version=tokenkeys.__version__,
        engine_role=server_pb2.ENGINE_ROLE_AGGREGATED,
        instance_id=runtime.instance_id,
        supported_models=runtime.models.names,
        parallelism=server_pb2.ParallelismInfo(
            tensor_parallel_size=1,
            pipeline_parallel_size=1,
            data_parallel_size=1,
            data_parallel_rank=0,
            data_parallel_start_rank=0,
            decode_context_parallel_size=1,
        ),
        schema_revision=SCHEMA_REVISION,
        minimum_client_revision=SCHEMA_REVISION,
        schema_release=SCHEMA_RELEASE,
    )
    block_sizes = {e.block_size for e in engines}
    if len(block_sizes) == 1:
        info.capacity.kv_block_size = block_sizes.pop()
    info.capacity.total_kv_blocks = sum(e.num_blocks for e in engines)
    info.extra.update(
        {
            "kv_events_wire_format": "vllm-msgpack",
            "kv_events_vllm_version": runtime.config.wire_version,
        }
    )
    return info


def tokenizer_advertisement(
    model: ServedModel, engine: StreamedEngine | None = None
) -> model_pb2.TokenizerAdvertisement:
    """ModelInfo.tokenizer: what a router needs to tokenize and compute keys on its own.

    ``engine``, when its events are streamed here, gives the key spec they follow.
    """
    ad = model_pb2.TokenizerAdvertisement(
        fingerprint=model.tokenizer.fingerprint,
        operations=supported_operations(model),
        artifact_format=ARTIFACT_FORMAT,
        artifacts_available=model.artifacts is not None,
        remote_key_computation=model.cache_keys is not None,
    )
    if engine is not None:
        ad.key_spec.CopyFrom(spec_ref(engine.spec))
        ad.keys_unverified = not engine.keys_verified
    return ad


def model_info(
    model: ServedModel, config: EngineConfig, engine: StreamedEngine
) -> model_pb2.ModelInfo:
    """GetModelInfo: the model's limits and capabilities, and the tokenizer advertisement."""
    info = model_pb2.ModelInfo(
        model_id=model.name,
        served_model_name=model.name,
        served_model_aliases=list(model.aliases),
        supports_text_input=True,
        supports_token_ids_input=True,
        supports_lora=bool(engine.adapters),
        supports_multimodal=engine.takes_media,
        tokenizer=tokenizer_advertisement(model, engine),
    )
    limit = config.max_model_len or model.tokenizer.specials.model_max_length
    if limit is not None:
        info.max_context_length = limit
    gen = info.generation
    gen.prompt_logprobs.supported = False
    gen.output_logprobs.supported = False
    gen.guided_decoding.supported = False
    gen.max_num_sequences = 1
    gen.supports_priority = False
    gen.supports_stop_in_output = False
    gen.supports_cache_salt = True
    gen.supports_prefix_cache_bypass = False
    return info


async def load_info(instance_id: str, engines: Sequence[Engine]) -> server_pb2.LoadInfo:
    """GetLoad: running and waiting requests and KV blocks in use, over every model.

    ``used_kv_blocks`` counts the blocks running requests hold (``Engine.used_blocks``), never
    cached blocks that no request references: those are free to allocate, and a router that
    counted them as load would steer away from the workers whose caches serve it best.
    """
    loads = [await engine.load() for engine in engines]
    return server_pb2.LoadInfo(
        instance_id=instance_id,
        timestamp_unix_nanos=time.time_ns(),
        running_requests=sum(load.running for load in loads),
        queued_requests=sum(load.waiting for load in loads),
        used_kv_blocks=sum(load.used_kv_blocks for load in loads),
        total_kv_blocks=sum(load.total_kv_blocks for load in loads),
    )


def health(
    runtime: RuntimeState, probe: bool, unready: str | None = None
) -> lifecycle_pb2.HealthResponse:
    """Health of the local engines: STARTING until assembled, DRAINING while stopping,
    NOT_READY while a fronted vLLM cannot serve (``unready`` says why)."""
    if runtime.draining:
        state = lifecycle_pb2.HEALTH_STATE_DRAINING
    elif runtime.ready and unready is not None:
        state = lifecycle_pb2.HEALTH_STATE_NOT_READY
    elif runtime.ready:
        state = lifecycle_pb2.HEALTH_STATE_READY
    else:
        state = lifecycle_pb2.HEALTH_STATE_STARTING
    checks = [
        lifecycle_pb2.HealthCheck(name="grpc", state=lifecycle_pb2.HEALTH_STATE_READY),
        lifecycle_pb2.HealthCheck(name="scheduler", state=state, message=unready or ""),
    ]
    if probe:
        checks.append(
            lifecycle_pb2.HealthCheck(
                name="inference_probe",
                state=state,
                message="simulated engine: no model weights to probe",
            )
        )
    return lifecycle_pb2.HealthResponse(state=state, checks=checks)


def event_sources(
    runtime: RuntimeState,
    model: str,
    ref: cache_keys_pb2.CacheKeySpecRef,
    zmq_info: EventSourceInfo | None,
) -> list[kv_pb2.KvEventSource]:
    """The ZMQ source (vLLM wire), when ``zmq_info`` says there is one, and the gRPC source
    (SubscribeKvEvents) of ``model``, whose events follow the key spec ``ref``."""
    config = runtime.config
    out = []
    if zmq_info is not None:
        source = kv_pb2.KvEventSource(
            transport="zmq",
            endpoint_addr=endpoint_of(zmq_info.endpoint, "tcp"),
            topic=zmq_info.topic,
            replay_endpoint=zmq_info.replay_endpoint or "",
            data_parallel_rank=zmq_info.data_parallel_rank,
            encoding="msgpack",
            buffer_steps=config.kv_events_buffer_steps,
            hwm=config.kv_events_hwm,
            key_spec=ref,
        )
        out.append(source)
    out.append(
        kv_pb2.KvEventSource(
            transport="grpc",
            endpoint_addr=endpoint_of(runtime.grpc_address or "", "grpc"),
            # For the gRPC source the topic is the served model name, which
            # SubscribeKvEventsRequest.model selects.
            topic=model,
            data_parallel_rank=0,
            encoding="protobuf",
            buffer_steps=config.kv_events_buffer_steps,
            key_spec=ref,
        )
    )
    return out
