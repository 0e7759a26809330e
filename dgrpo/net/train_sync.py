"""Weights sync over libp2p streams: serving a node's trainable state, and fetching the state a majority of
its peers announce (``docs/protocol.md``, "Weights sync"; the bytes are :mod:`dgrpo.protocol.train_sync`).

Serving: every node answers from the state of its last completed round (made once per round, between rounds),
at most ``streams`` streams at a time, all of them together at most ``rate`` bytes a second, each bounded by
a timeout. A malformed request is answered with nothing and counted.

Fetching: the client asks the holders of the chosen root for the header (checked against the root at once),
then for the pieces it lacks; each piece is checked against its hash as it arrives. A stream that breaks
(a peer that hangs up, a timeout) is counted and the transfer resumes from the first missing piece, from the
next holder. Every failed check is a rejection with a reason code, counted by peer through ``reject``;
nothing raises for a hostile or broken peer.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence
from contextlib import suppress
from dataclasses import dataclass

import trio

from dgrpo.net.streams import Stream, StreamError
from dgrpo.protocol.train_sync import (
    HEAD,
    HEAD_REQUEST_BYTES,
    HELD,
    LENGTH_BYTES,
    NOT_HELD,
    PIECE_BYTES,
    PIECES,
    PIECES_REQUEST_BYTES,
    StateHeader,
    StateRejected,
    check_header,
    check_piece,
    decode_header,
    encode_head_request,
    encode_header,
    encode_pieces_request,
    header_length,
    parse_pieces_tail,
    parse_request_kind,
)

log = logging.getLogger("dgrpo.net")

SERVE_STREAMS = 4  # concurrent weights-sync streams a node serves
SERVE_RATE = 64 * 1024 * 1024  # bytes a second a node serves, all streams together
REQUEST_TIMEOUT_SECONDS = 10.0
HEAD_TIMEOUT_SECONDS = 10.0
PIECE_TIMEOUT_SECONDS = 30.0  # one piece (1 MiB), from the request or the previous piece
PIECES_PER_REQUEST = 64

Reject = Callable[[str, str], None]
"""``reject(reason, peer)``: count a rejection."""
Opener = Callable[[str], Awaitable[Stream]]
"""Opens a weights-sync stream to a peer id; raises :class:`StreamError`."""


@dataclass(frozen=True)
class Served:
    """The state a node serves: its bytes, and the framed header that describes them."""

    round: int
    head: bytes
    header: StateHeader
    state: bytes

    @classmethod
    def of(cls, run_id: str, round_idx: int, state: bytes, piece_bytes: int = PIECE_BYTES) -> Served:
        """Hash and frame ``state`` (run it in a worker thread: it hashes megabytes)."""
        head = encode_header(run_id, round_idx, state, piece_bytes)
        return cls(round_idx, head, decode_header(head[LENGTH_BYTES:]), state)


class RateLimit:
    """At most ``rate`` bytes a second through :meth:`take`, across every task that calls it."""

    def __init__(self, rate: float) -> None:
        self.rate = rate
        self._free_at = 0.0

    async def take(self, nbytes: int) -> None:
        now = trio.current_time()
        start = max(now, self._free_at)
        self._free_at = start + nbytes / self.rate
        if start > now:
            await trio.sleep(start - now)


class StateServer:
    """Answers weights-sync streams from :attr:`served` (None: nothing to serve; the stream is reset)."""

    def __init__(
        self,
        reject: Reject,
        streams: int = SERVE_STREAMS,
        rate: float = SERVE_RATE,
        request_timeout: float = REQUEST_TIMEOUT_SECONDS,
        piece_timeout: float = PIECE_TIMEOUT_SECONDS,
    ) -> None:
        self.reject = reject
        self.streams = streams
        self.limit = RateLimit(rate)
        self.request_timeout = request_timeout
        self.piece_timeout = piece_timeout
        self.served: Served | None = None
        self.active = 0
        self.pieces_sent = 0

    async def handle(self, stream: Stream) -> None:
        """Serve one stream; never raises for what the peer sends."""
        if self.active >= self.streams:
            self.reject("state_busy", stream.peer)
            await stream.reset()
            return
        self.active += 1
        try:
            await self._serve(stream)
        finally:
            self.active -= 1

    async def _serve(self, stream: Stream) -> None:
        kind, tail = None, None
        with trio.move_on_after(self.request_timeout), suppress(StreamError):
            kind = parse_request_kind(await stream.read_exactly(HEAD_REQUEST_BYTES))
            if kind == PIECES:
                tail = parse_pieces_tail(await stream.read_exactly(PIECES_REQUEST_BYTES - HEAD_REQUEST_BYTES))
        served = self.served  # the one we answer from, even if a round ends meanwhile
        if kind is None or (kind == PIECES and tail is None):
            self.reject("state_bad_request", stream.peer)
            await stream.reset()
            return
        if served is None:
            await stream.reset()  # nothing to serve yet
            return
        try:
            if kind == HEAD:
                with trio.fail_after(self.request_timeout):
                    await stream.write(served.head)
            else:
                assert tail is not None
                await self._pieces(stream, served, tail.root, tail.first, tail.count)
        except (StreamError, trio.TooSlowError) as error:
            log.debug("weights sync to %s broke off: %r", stream.peer, error)
            await stream.reset()
            return
        await stream.close()

    async def _pieces(self, stream: Stream, served: Served, root: bytes, first: int, count: int) -> None:
        header = served.header
        if root != header.root or first + count > len(header.pieces):
            with trio.fail_after(self.request_timeout):
                await stream.write(bytes([NOT_HELD]))
            return
        with trio.fail_after(self.request_timeout):
            await stream.write(bytes([HELD]))
        for index in range(first, first + count):
            start = index * header.piece_bytes
            piece = served.state[start : start + header.piece_size(index)]
            await self.limit.take(len(piece))
            with trio.fail_after(self.piece_timeout):
                await stream.write(piece)
            self.pieces_sent += 1


class StateClient:
    """Fetches one state (a root) from its holders, checking every part; failures counted through ``reject``."""

    def __init__(
        self,
        open_stream: Opener,
        run_id: str,
        max_bytes: int,
        reject: Reject,
        head_timeout: float = HEAD_TIMEOUT_SECONDS,
        piece_timeout: float = PIECE_TIMEOUT_SECONDS,
    ) -> None:
        self.open_stream = open_stream
        self.run_id = run_id
        self.max_bytes = max_bytes
        self.reject = reject
        self.head_timeout = head_timeout
        self.piece_timeout = piece_timeout
        self.resumed = 0  # transfers that went on from where a broken one stopped

    async def fetch(
        self, root: bytes, holders: Sequence[str], round_idx: int | None = None, rounds: int = 2
    ) -> tuple[bytes, str] | None:
        """The state whose root is ``root`` (of round ``round_idx``, where given) and the peer that sent its last
        piece, or None when no holder completed it (each holder tried ``rounds`` times; the pieces already
        checked are kept between tries)."""
        header: StateHeader | None = None
        pieces: list[bytes] = []
        bad: set[str] = set()
        for peer in [p for _ in range(rounds) for p in holders]:
            if peer in bad:
                continue
            try:
                if header is None:
                    header = await self._head(peer, root, round_idx)
                had = len(pieces)
                await self._pieces(peer, header, root, pieces)
                if had:
                    self.resumed += 1
            except StateRejected as rejected:
                self._rejected(peer, rejected)
                if rejected.reason in ("state_bad_piece", "state_disagrees", "state_malformed", "state_wrong_run"):
                    bad.add(peer)  # it sent what it must not: ask it no more
                continue
            return b"".join(pieces), peer
        return None

    async def _head(self, peer: str, root: bytes, round_idx: int | None) -> StateHeader:
        stream = None
        try:
            with trio.fail_after(self.head_timeout):
                stream = await self.open_stream(peer)
                await stream.write(encode_head_request())
                length = header_length(await stream.read_exactly(LENGTH_BYTES))
                header = decode_header(await stream.read_exactly(length))
            if round_idx is not None and header.round != round_idx:
                # An honest holder that completed another round since it announced: no fault of its own.
                raise StateRejected("state_not_held", f"it holds round {header.round} now, not {round_idx}")
            check_header(header, self.run_id, root, self.max_bytes)
            return header
        except trio.TooSlowError:
            raise StateRejected("state_timeout", "the header") from None
        except StreamError as error:
            raise StateRejected("state_unavailable", str(error)) from None
        finally:
            if stream is not None:
                await stream.reset()  # read to its end or not: we want nothing more from it

    async def _pieces(self, peer: str, header: StateHeader, root: bytes, pieces: list[bytes]) -> None:
        """Append the pieces after ``len(pieces)`` to ``pieces``, each checked, ``PIECES_PER_REQUEST`` a stream."""
        while len(pieces) < len(header.pieces):
            first = len(pieces)
            count = min(PIECES_PER_REQUEST, len(header.pieces) - first)
            stream = None
            try:
                with trio.fail_after(self.head_timeout):
                    stream = await self.open_stream(peer)
                    await stream.write(encode_pieces_request(root, first, count))
                    status = await stream.read_exactly(1)
                if status != bytes([HELD]):
                    raise StateRejected("state_not_held", f"pieces {first}..{first + count - 1}")
                for index in range(first, first + count):
                    with trio.fail_after(self.piece_timeout):
                        data = await stream.read_exactly(header.piece_size(index))
                    check_piece(header, index, data)
                    pieces.append(data)
            except trio.TooSlowError:
                raise StateRejected("state_timeout", f"piece {len(pieces)}") from None
            except StreamError as error:
                raise StateRejected("state_unavailable", f"after {len(pieces)} pieces: {error}") from None
            finally:
                if stream is not None:
                    await stream.reset()

    def _rejected(self, peer: str, rejected: StateRejected) -> None:
        log.warning("weights sync from %s rejected: %s", peer[-8:], rejected)
        self.reject(rejected.reason, peer)
