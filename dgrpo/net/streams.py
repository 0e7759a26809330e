"""One libp2p stream to one authenticated peer, for request/response protocols beside gossipsub (federated
mode's state sync, :mod:`dgrpo.net.state_sync`).

py-libp2p 0.8.1's ``read(n)`` returns *up to* ``n`` bytes (whatever the muxer holds), and raises ``StreamEOF``
once the other side closed and the buffer is empty, ``StreamReset`` after a reset. :meth:`Stream.read_exactly`
loops until it has the declared length; every libp2p failure becomes :class:`StreamError` so callers handle one
exception type. ``close`` half-closes (yamux sends FIN; our read side stays open), ``reset`` aborts both ways.
Timeouts are the caller's (``trio.fail_after`` around the exchange): a stream never bounds itself.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

from libp2p.custom_types import TProtocol

from dgrpo.errors import DgrpoError

log = logging.getLogger(__name__)


class StreamError(DgrpoError):
    """A stream could not be opened, or it ended (closed, reset, connection lost) before the bytes expected."""


class Stream:
    """A byte stream to ``peer`` (a peer id libp2p's secure channel authenticated)."""

    def __init__(self, raw: Any, peer: str) -> None:
        self._raw = raw
        self.peer = peer

    async def read_exactly(self, n: int) -> bytes:
        """Exactly ``n`` bytes; :class:`StreamError` if the stream ends first."""
        parts: list[bytes] = []
        got = 0
        while got < n:
            try:
                part = await self._raw.read(n - got)
            except Exception as error:  # StreamEOF, StreamReset, StreamError, a dropped connection
                raise StreamError(f"stream from {self.peer} ended after {got} of {n} bytes: {error!r}") from error
            if not part:
                raise StreamError(f"stream from {self.peer} ended after {got} of {n} bytes")
            parts.append(part)
            got += len(part)
        return b"".join(parts)

    async def write(self, data: bytes) -> None:
        try:
            await self._raw.write(data)
        except Exception as error:
            raise StreamError(f"writing to {self.peer} failed: {error!r}") from error

    async def close(self) -> None:
        """Half-close: the other side reads to the end of what we wrote, then sees EOF. Never raises."""
        try:
            await self._raw.close()
        except Exception:  # already reset or gone: nothing left to close
            log.debug("closing a stream to %s failed", self.peer, exc_info=True)

    async def reset(self) -> None:
        """Abort the stream both ways (the other side's reads fail). Never raises."""
        try:
            await self._raw.reset()
        except Exception:
            log.debug("resetting a stream to %s failed", self.peer, exc_info=True)


StreamHandler = Callable[[Stream], Awaitable[None]]
"""Serves one inbound stream; it owns the stream (closes or resets it)."""


def serve(host: Any, protocol: str, handler: StreamHandler) -> None:
    """Answer streams of ``protocol`` with ``handler`` (one task per stream, run by the host). An exception in the
    handler is logged and the stream reset: it must not reach libp2p's connection tasks."""

    async def on_stream(raw: Any) -> None:
        stream = Stream(raw, raw.muxed_conn.peer_id.to_base58())
        try:
            await handler(stream)
        except Exception:
            log.warning("serving %s to %s failed", protocol, stream.peer, exc_info=True)
            await stream.reset()

    host.set_stream_handler(TProtocol(protocol), on_stream)
