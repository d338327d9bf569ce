"""Generation forwarded to an OpenEngine engine: ``tokenkeys serve --engine HOST:PORT``.

The frontend tokenizes once, with the model's own Preprocessor, and sends token ids (and, for an
image prompt, each image's identifier and placeholder run: ``engine/proto.py`` ``media_of``) to
the engine's ``Inference.Generate``; :class:`RemoteEngine` then yields the same
:class:`~tokenkeys.engine.protocol.GenerateOutput` values as the simulated engine, so every caller
(gRPC Generate, the HTTP routes) is indifferent to where generation runs. Control calls that
describe the engine (server info, load, KV-event sources and streams) are forwarded through
:attr:`RemoteEngine.control`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence

import grpc

from tokenkeys._gen.openengine.v1 import model_pb2, openengine_pb2_grpc, server_pb2
from tokenkeys.engine.config import RemoteConfig
from tokenkeys.engine.hosting import EngineInputs
from tokenkeys.engine.proto import (
    finish_of,
    generate_request,
    timing_from_metadata,
    usage_of,
)
from tokenkeys.engine.proto_errors import error_of
from tokenkeys.engine.protocol import EngineLoad, GenerateOutput, GenerationParams
from tokenkeys.engine.registry import EngineKind
from tokenkeys.errors import FailedPrecondition, TokenkeysError, Unavailable, from_grpc
from tokenkeys.keys import Adapter, KeyContext


class RemoteEngine:
    """An OpenEngine engine at ``target`` (``host:port``) serving ``model`` under that name.

    Create it inside the event loop that will use it (gRPC asyncio channels belong to a loop).
    """

    def __init__(
        self, target: str, model: str, channel: grpc.aio.Channel, *, owns_channel: bool = False
    ) -> None:
        self.target = target
        self.model = model
        self.channel = channel
        self.owns_channel = owns_channel
        self.inference = openengine_pb2_grpc.InferenceStub(channel)
        self.control = openengine_pb2_grpc.ControlStub(channel)
        #: Whether the engine said it keys image items (asked at the first image request;
        #: only a yes is kept, so an engine upgraded in place is asked again).
        self._takes_media = False

    async def start(self) -> None:
        """Nothing to check first: the engine answers for itself (its Control is forwarded)."""

    async def ensure_up(self) -> None:
        """Up as far as this frontend knows; the engine's own Health is forwarded."""

    def describe(self) -> str:
        """The kind, for the server log."""
        return f"remote OpenEngine engine at {self.target}"

    @property
    def max_model_len(self) -> int | None:
        """Not known here: the engine checks its own limit (and refuses a prompt past it)."""
        return None

    @property
    def adapters(self) -> tuple[Adapter, ...]:
        """None by name here: the engine resolves the adapters it registered itself."""
        return ()

    async def load(self) -> EngineLoad:
        """The engine's ``GetLoad`` answer (its whole process, every model)."""
        try:
            info = await self.control.GetLoad(server_pb2.GetLoadRequest())
        except grpc.RpcError as error:
            raise self._unavailable(error) from None
        return EngineLoad(
            info.running_requests, info.queued_requests, info.used_kv_blocks, info.total_kv_blocks
        )

    async def close(self) -> None:
        """Close the channel when this engine opened it; a shared channel is its owner's."""
        if self.owns_channel:
            await self.channel.close()

    async def _check_media(self) -> None:
        """Refuse before sending image items to an engine that does not say it keys them
        (``ModelInfo.supports_multimodal``): one that ignored ``MediaItem.placeholder`` or the
        items would key the image blocks as text, silently."""
        if self._takes_media:
            return
        try:
            info = await self.control.GetModelInfo(model_pb2.GetModelInfoRequest(model=self.model))
        except grpc.RpcError as error:
            raise self._unavailable(error) from None
        if not info.supports_multimodal:
            raise FailedPrecondition(
                f"remote engine {self.target} does not take media items for {self.model!r} "
                "(its ModelInfo.supports_multimodal is false), so a request with images cannot "
                "be forwarded to it; send text only, or use an engine that keys image items",
                field="engine",
            )
        self._takes_media = True

    def _unavailable(self, error: grpc.RpcError) -> TokenkeysError:
        translated = from_grpc(error)
        if isinstance(translated, Unavailable):
            return Unavailable(
                f"remote engine {self.target} is unreachable: {translated.message}; start it or "
                "fix --engine",
                field="engine",
            )
        return translated

    async def generate(
        self,
        prompt_token_ids: Sequence[int],
        params: GenerationParams | None = None,
        context: KeyContext | None = None,
        *,
        request_id: str | None = None,
        lora_name: str | None = None,
        lora_id: int | None = None,
    ) -> AsyncIterator[GenerateOutput]:
        """Forward one request; outputs as :meth:`Engine.generate` yields them.

        ``lora_id`` is the engine's business (it registers adapters) and is not forwarded.
        Each token is yielded when the next message arrives, because OpenEngine ends a stream
        with a separate GenerationFinished while the engine interface marks the last token.
        """
        params = params or GenerationParams()
        if context is not None and context.mm_items:
            await self._check_media()
        request = generate_request(
            self.model, list(prompt_token_ids), params, context, request_id, lora_name
        )
        call = self.inference.Generate(request)
        rid = request.request_id
        held: GenerateOutput | None = None
        try:
            async for message in call:
                rid = message.request_id or rid
                kind = message.WhichOneof("event")
                if kind == "token":
                    if held is not None:
                        yield held
                    ids = tuple(t.token_id for t in message.token.tokens)
                    held = GenerateOutput(rid, ids)
                elif kind == "finished":
                    timing = timing_from_metadata(await call.trailing_metadata())
                    last = held.token_ids if held is not None else ()
                    yield GenerateOutput(
                        rid,
                        last,
                        True,
                        finish_of(message.finished),
                        usage_of(message),
                        timing,
                    )
                    return
                elif kind == "error":
                    raise error_of(message.error, f"remote engine {self.target}")
        except grpc.RpcError as error:
            raise self._unavailable(error) from None
        finally:
            call.cancel()
        raise Unavailable(
            f"remote engine {self.target} ended the Generate stream without GenerationFinished",
            field="engine",
        )


def build(inputs: EngineInputs) -> RemoteEngine:
    """The engine at ``inputs.config.engine.target``, generating ``inputs.name``, on its own
    channel (created here, inside the serving loop, and closed with the engine)."""
    config = inputs.config.engine
    assert isinstance(config, RemoteConfig)
    target = config.target
    return RemoteEngine(target, inputs.name, grpc.aio.insecure_channel(target), owns_channel=True)


KIND = EngineKind("remote", "forwarded", build)
