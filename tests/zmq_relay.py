"""A lossy hop between a ZMQ publisher and its subscribers, for the event-gap tests.

Real sockets on loopback: the relay subscribes to the publisher's PUB stream and republishes
every frame on its own PUB, except the sequence numbers in ``drop`` (lost packets, which the
subscriber must then replay from the publisher's replay socket).
"""

from __future__ import annotations

import asyncio
import contextlib

import zmq
import zmq.asyncio


class LossyRelay:
    """Forwards a PUB stream to a new PUB (``endpoint``), dropping chosen sequence numbers."""

    def __init__(self, upstream: str) -> None:
        ctx = zmq.asyncio.Context(shadow=zmq.Context.instance())
        self.drop: set[int] = set()
        self.sub = ctx.socket(zmq.SUB)
        self.sub.setsockopt(zmq.LINGER, 0)
        self.sub.setsockopt(zmq.SUBSCRIBE, b"")
        self.sub.connect(upstream)
        self.pub = ctx.socket(zmq.PUB)
        self.pub.setsockopt(zmq.LINGER, 0)
        self.pub.bind("tcp://127.0.0.1:0")
        self.endpoint = self.pub.getsockopt(zmq.LAST_ENDPOINT).decode()
        self.task = asyncio.get_running_loop().create_task(self._run())

    async def _run(self) -> None:
        while True:
            frames = await self.sub.recv_multipart()
            if int.from_bytes(frames[1], "big") not in self.drop:
                await self.pub.send_multipart(frames)

    async def close(self) -> None:
        """Stop forwarding and close both sockets."""
        self.task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self.task
        self.sub.close(linger=0)
        self.pub.close(linger=0)
