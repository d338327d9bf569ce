"""A blocking client of ``OpenEngineTokenizer`` for tools and tests (the CLI's ``--remote``)."""

from __future__ import annotations

from collections.abc import Sequence

from tokenkeys._gen.openengine.v1 import generation_pb2, tokenizer_pb2_grpc
from tokenkeys._gen.openengine.v1 import tokenizer_pb2 as pb
from tokenkeys.access.channel import PLAIN, ChannelSecurity
from tokenkeys.client.base import GrpcClient


class TokenizerClient(GrpcClient):
    """Calls one server; gRPC errors surface as the tokenkeys exception tree.

    ``security`` adds TLS and a bearer token (see :class:`~tokenkeys.access.ChannelSecurity`).
    """

    def __init__(
        self, target: str, *, timeout: float = 30.0, security: ChannelSecurity = PLAIN
    ) -> None:
        super().__init__(target, timeout=timeout, security=security)
        self._channel = self.blocking_channel()
        self._stub = tokenizer_pb2_grpc.OpenEngineTokenizerStub(self._channel)

    def close(self) -> None:
        """Close the channel."""
        self._channel.close()

    def __enter__(self) -> TokenizerClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def info(self, model: str = "") -> pb.TokenizerInfo:
        """GetTokenizerInfo for a served model (the default one when empty)."""
        return self.call(self._stub.GetTokenizerInfo, pb.GetTokenizerInfoRequest(model=model))

    def tokenize(
        self,
        texts: Sequence[str],
        *,
        model: str = "",
        add_special_tokens: bool | None = None,
        return_token_strs: bool = False,
        return_offsets: bool = False,
        expected_fingerprint: str | None = None,
    ) -> pb.TokenizeResponse:
        """Tokenize several texts; unset options mean the server defaults."""
        request = pb.TokenizeRequest(
            model=model,
            texts=list(texts),
            return_token_strs=return_token_strs,
            return_offsets=return_offsets,
        )
        if add_special_tokens is not None:
            request.add_special_tokens = add_special_tokens
        if expected_fingerprint is not None:
            request.expected_fingerprint = expected_fingerprint
        return self.call(self._stub.Tokenize, request)

    def detokenize(
        self,
        sequences: Sequence[Sequence[int]],
        *,
        model: str = "",
        skip_special_tokens: bool | None = None,
    ) -> pb.DetokenizeResponse:
        """Detokenize several id sequences."""
        request = pb.DetokenizeRequest(
            model=model, sequences=[generation_pb2.TokenIds(ids=list(s)) for s in sequences]
        )
        if skip_special_tokens is not None:
            request.skip_special_tokens = skip_special_tokens
        return self.call(self._stub.Detokenize, request)
