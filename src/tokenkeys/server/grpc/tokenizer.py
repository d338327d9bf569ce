"""gRPC servicer of ``openengine.v1.OpenEngineTokenizer``: a thin translation onto the core.

Requests are validated and converted here, then handed to the model's Preprocessor (the same
instance generation uses); nothing in this module encodes or decodes on its own.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import grpc

from tokenkeys._gen.openengine.v1 import cache_keys_pb2, tokenizer_pb2, tokenizer_pb2_grpc
from tokenkeys.errors import Unsupported
from tokenkeys.preprocess.offload import offload
from tokenkeys.server.grpc import status as grpc_status
from tokenkeys.serving.models import ModelRegistry, ServedModel
from tokenkeys.tokenizer.proto import (
    nul_from_proto,
    tokenizer_info,
    truncation_from_proto,
)

pb = tokenizer_pb2

# Above this many characters a Tokenize call runs on a worker thread so one large request does
# not stall the event loop; below it the thread hop would cost more than the encode.
_INLINE_CHARS = 32_768


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
        model.check_fingerprint(
            request.expected_fingerprint if request.HasField("expected_fingerprint") else None,
            "expected_fingerprint",
        )
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
        model.check_fingerprint(
            request.expected_fingerprint if request.HasField("expected_fingerprint") else None,
            "expected_fingerprint",
        )
        sequences = [list(s.ids) for s in request.sequences]
        skip = request.skip_special_tokens if request.HasField("skip_special_tokens") else None
        texts = model.preprocessor.detokenize(sequences, skip_special_tokens=skip)
        return pb.DetokenizeResponse(fingerprint=model.tokenizer.fingerprint, texts=texts)

    @grpc_status.streaming
    async def GetTokenizerArtifacts(
        self, request: pb.GetTokenizerArtifactsRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.TokenizerArtifactChunk]:
        model = self._models.get(request.model)
        streamer = _extension(model, "artifacts", "GetTokenizerArtifacts")
        model.check_fingerprint(
            request.expected_fingerprint if request.HasField("expected_fingerprint") else None,
            "expected_fingerprint",
        )
        async for chunk in streamer.stream(request, context):
            yield chunk

    @grpc_status.unary
    async def GetCacheKeySpec(
        self, request: cache_keys_pb2.GetCacheKeySpecRequest, context: grpc.aio.ServicerContext
    ) -> cache_keys_pb2.CacheKeySpec:
        model = self._models.get(request.model)
        include = request.include_vectors if request.HasField("include_vectors") else True
        return _extension(model, "cache_keys", "GetCacheKeySpec").spec_message(include)

    @grpc_status.unary
    async def ComputeCacheKeys(
        self, request: cache_keys_pb2.ComputeCacheKeysRequest, context: grpc.aio.ServicerContext
    ) -> cache_keys_pb2.ComputeCacheKeysResponse:
        model = self._models.get(request.model)
        return await _extension(model, "cache_keys", "ComputeCacheKeys").compute(request)


def _extension(model: ServedModel, key: str, rpc: str):  # noqa: ANN202 - duck-typed per RPC
    """The part of a served model that implements ``rpc``; UNIMPLEMENTED when not configured."""
    ext = model.extensions.get(key)
    if ext is None:
        raise Unsupported(
            f"{rpc} is not available for model {model.name!r} on this server" + _HINTS.get(key, ""),
            field="model",
        )
    return ext


_HINTS = {
    "cache_keys": " (no cache-key spec is configured; see tokenkeys serve --cache-key-profile)",
}
