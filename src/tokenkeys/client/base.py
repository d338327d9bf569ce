"""What every gRPC client of tokenkeys shares: target, deadline, security, answer size, errors.

A client's failures surface as the tokenkeys exception tree (:func:`tokenkeys.errors.from_grpc`),
never as ``grpc.RpcError``; every channel accepts answers up to
:data:`~tokenkeys.limits.MAX_ANSWER_BYTES`. Blocking clients (the CLI, tools) and asyncio
clients (a router) differ only in the channel they open.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

import grpc

from tokenkeys.access.channel import PLAIN, ChannelSecurity
from tokenkeys.errors import from_grpc
from tokenkeys.limits import MAX_ANSWER_BYTES

T = TypeVar("T")


class GrpcClient:
    """The parts of a client of one server; subclasses open a blocking or an asyncio channel.

    ``timeout`` is each call's deadline in seconds; ``security`` adds TLS and a bearer token
    (:class:`~tokenkeys.access.ChannelSecurity`); ``options`` are extra channel arguments.
    """

    def __init__(
        self,
        target: str,
        *,
        timeout: float = 30.0,
        security: ChannelSecurity = PLAIN,
        options: Sequence[tuple[str, Any]] = (),
    ) -> None:
        self.target = target
        self.timeout = timeout
        self.security = security
        self.options = [("grpc.max_receive_message_length", MAX_ANSWER_BYTES), *options]

    def blocking_channel(self) -> grpc.Channel:
        """A blocking channel to the target."""
        return self.security.channel(self.target, self.options)

    def aio_channel(self) -> grpc.aio.Channel:
        """An asyncio channel to the target (open it inside the loop that will use it)."""
        return self.security.aio_channel(self.target, self.options)

    def call(self, method: Callable[..., T], request: Any) -> T:
        """One blocking call under the deadline; a failure as the tokenkeys error."""
        try:
            return method(request, timeout=self.timeout)
        except grpc.RpcError as error:
            raise from_grpc(error) from error

    async def call_async(self, method: Callable[..., Awaitable[T]], request: Any) -> T:
        """One asyncio call under the deadline; a failure as the tokenkeys error."""
        try:
            return await method(request, timeout=self.timeout)
        except grpc.RpcError as error:
            raise from_grpc(error) from error
