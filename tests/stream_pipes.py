"""In-memory byte streams with py-libp2p's stream methods, and a rejection counter: the harness of the
request/response tests (federated state sync, weights sync)."""

from __future__ import annotations

from typing import Any


class Pipe:
    """One end of an in-memory byte stream with py-libp2p's stream methods (``read`` returns up to ``n``)."""

    def __init__(self, end: Any) -> None:
        self.end = end

    async def read(self, n: int) -> bytes:
        data: bytes = await self.end.receive_some(n)
        return data

    async def write(self, data: bytes) -> None:
        await self.end.send_all(data)

    async def close(self) -> None:
        await self.end.send_eof()

    async def reset(self) -> None:
        await self.end.aclose()


class Counts:
    """A ``reject(reason, peer)`` callback that remembers what it was told, in order."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, str]] = []

    def __call__(self, reason: str, peer: str) -> None:
        self.seen.append((reason, peer))
