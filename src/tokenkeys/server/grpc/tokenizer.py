"""gRPC servicer of ``openengine.v1.OpenEngineTokenizer``: a thin translation onto the core.

Requests are validated and converted here, then handed to the model's Preprocessor (the same
instance generation uses); nothing in this module encodes or decodes on its own.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import grpc

from tokenkeys._gen.openengine.v1 import cache_keys_pb2, tokenizer_pb2, tokenizer_pb2_grpc
from tokenkeys.artifacts.streamer import ArtifactStreamer
from tokenkeys.errors import Unsupported
from tokenkeys.keys.service import CacheKeyService
from tokenkeys.process.encode_lanes import offload
from tokenkeys.server.grpc import status as grpc_status
from tokenkeys.server.grpc.tokenizer_info import tokenizer_info
from tokenkeys.serving.models import ModelRegistry, ServedModel
from tokenkeys.tokenizer.proto import nul_from_proto, truncation_from_proto

pb = tokenizer_pb2

# Above this many characters (about 500 tokens) a Tokenize call encodes on a worker thread.
# gRPC and HTTP share the event loop, and a gRPC call needs several loop turns (its completion
# queue reaches the loop through a poller thread), so encodes run on the loop made gRPC wait
# behind every HTTP encode: p50 0.97 s against HTTP's 0.04 s under the bench_load mix. `tokenizers`
# releases the GIL while it encodes, so off the loop both protocols keep their latency and a
# second core encodes too (bench/bench_load.py). Below this size the hop costs more than it saves.
_INLINE_CHARS = 2048


class TokenizerService(tokenizer_pb2_grpc.OpenEngineTokenizerServicer):
    """Serves every model of a registry; an unknown model name is NOT_FOUND listing the names."""

    def __init__(self, models: ModelRegistry) -> None:
        self._models = models

    @grpc_status.unary
    async def GetTokenizerInfo(
        self, request: pb.GetTokenizerInfoRequest, context: grpc.aio.ServicerContext
    ) -> pb.TokenizerInfo:
        model = self._models.get(request.model)
        return tokenizer_info(model, self._models.names)

    @grpc_status.unary
    async def Tokenize(
        self, request: pb.TokenizeRequest, context: grpc.aio.ServicerContext
    ) -> pb.TokenizeResponse:
        model = self._models.get(request.model)
        _check_fingerprint(model, request)
        kwargs = {
            "add_special_tokens": (
                request.add_special_tokens if request.HasField("add_special_tokens") else None
            ),
            "truncation": (
                truncation_from_proto(request.truncation)
                if request.HasField("truncation")
                else None
            ),
            "nul": nul_from_proto(request.nul_handling)
            if request.HasField("nul_handling")
            else None,
            "offsets": request.return_offsets,
            "token_strs": request.return_token_strs,
        }
        texts = list(request.texts)
        size = sum(len(t) for t in texts)
        results = await offload(
            size, _INLINE_CHARS, model.preprocessor.tokenize_prompts, texts, **kwargs
        )
        response = pb.TokenizeResponse(fingerprint=model.tokenizer.fingerprint)
        total = 0
        for r in results:
            item = response.results.add(ids=r.ids, count=r.count)
            if r.token_strs is not None:
                item.token_strs.extend(r.token_strs)
            if r.offsets is not None:
                item.offsets.extend(pb.Offset(start=s, end=e) for s, e in r.offsets)
            total += r.count
        response.total_tokens = total
        return response

    @grpc_status.unary
    async def Detokenize(
        self, request: pb.DetokenizeRequest, context: grpc.aio.ServicerContext
    ) -> pb.DetokenizeResponse:
        model = self._models.get(request.model)
        _check_fingerprint(model, request)
        sequences = [list(s.ids) for s in request.sequences]
        skip = request.skip_special_tokens if request.HasField("skip_special_tokens") else None
        texts = model.preprocessor.detokenize(sequences, skip_special_tokens=skip)
        return pb.DetokenizeResponse(fingerprint=model.tokenizer.fingerprint, texts=texts)

    @grpc_status.streaming
    async def GetTokenizerArtifacts(
        self, request: pb.GetTokenizerArtifactsRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.TokenizerArtifactChunk]:
        model = self._models.get(request.model)
        streamer = _artifacts(model)
        _check_fingerprint(model, request)
        async for chunk in streamer.stream(request, context):
            yield chunk

    @grpc_status.unary
    async def GetCacheKeySpec(
        self, request: cache_keys_pb2.GetCacheKeySpecRequest, context: grpc.aio.ServicerContext
    ) -> cache_keys_pb2.CacheKeySpec:
        model = self._models.get(request.model)
        include = request.include_vectors if request.HasField("include_vectors") else True
        return _cache_keys(model, "GetCacheKeySpec").spec_message(include)

    @grpc_status.unary
    async def ComputeCacheKeys(
        self, request: cache_keys_pb2.ComputeCacheKeysRequest, context: grpc.aio.ServicerContext
    ) -> cache_keys_pb2.ComputeCacheKeysResponse:
        model = self._models.get(request.model)
        return await _cache_keys(model, "ComputeCacheKeys").compute(request)


def _artifacts(model: ServedModel) -> ArtifactStreamer:
    """The model's artifact streamer; UNIMPLEMENTED when this server streams none for it."""
    if model.artifacts is None:
        raise Unsupported(
            f"GetTokenizerArtifacts is not available for model {model.name!r} on this server",
            field="model",
        )
    return model.artifacts


def _cache_keys(model: ServedModel, rpc: str) -> CacheKeyService:
    """The model's cache keys; UNIMPLEMENTED when no cache-key spec is configured."""
    if model.cache_keys is None:
        raise Unsupported(
            f"{rpc} is not available for model {model.name!r} on this server (no cache-key spec "
            "is configured; see tokenkeys serve --cache-key-profile)",
            field="model",
        )
    return model.cache_keys


def _check_fingerprint(
    model: ServedModel,
    request: pb.TokenizeRequest | pb.DetokenizeRequest | pb.GetTokenizerArtifactsRequest,
) -> None:
    """Refuse a request whose ``expected_fingerprint`` names another revision of the tokenizer."""
    expected = request.expected_fingerprint if request.HasField("expected_fingerprint") else None
    model.check_fingerprint(expected, "expected_fingerprint")
