"""Federated mode's state sync over libp2p streams: a late joiner fetches the global weights from its peers
(``docs/protocol.md``, "Federated mode", "State sync"; the bytes are :mod:`dgrpo.protocol.sync`).

Serving: every node answers from the snapshot of its last completed round (its weights as bytes and the
signed header, made once per round in a worker thread from a copy taken between rounds), at most
``streams`` streams at a time, each bounded by a timeout. A malformed request is answered with nothing.

Fetching: the joiner asks its sources for their header (a cheap poll) until one holds the round it needs or
the wait runs out, picks the (round, SHA-256) held by the most sources at the highest round, fetches the
weights from one holder after another and checks each answer (signature, signer, run, size, aggregator,
agreement, hash, finite values). Every failed check is a rejection with a reason code, counted by peer
through ``reject`` (the daemon's reassembler counters: ``/status`` ``round_rejections``, ``/metrics``
``dgrpo_admission_rejected_total``); nothing raises for a hostile or broken peer.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping
from contextlib import suppress
from dataclasses import dataclass

import numpy as np
import torch
import trio

from dgrpo.federated.client import GlobalStats
from dgrpo.net.streams import Stream, StreamError
from dgrpo.protocol.identity import Identity
from dgrpo.protocol.sync import (
    FLOAT_BYTES,
    HEAD,
    LENGTH_BYTES,
    REQUEST_BYTES,
    WEIGHTS,
    SyncHeader,
    SyncRejected,
    check_header,
    check_weights,
    decode_header,
    encode_request,
    header_length,
    parse_request,
    sign_header,
)

log = logging.getLogger("dgrpo.net")

SERVE_STREAMS = 4  # concurrent sync streams a node serves; each holds a copy of the weights in flight
REQUEST_TIMEOUT_SECONDS = 10.0  # for the 5 request bytes
HEAD_TIMEOUT_SECONDS = 10.0  # a whole header exchange, from opening the stream
WEIGHTS_TIMEOUT_SECONDS = 120.0  # a whole weights exchange (4 MB take ~50 ms on loopback)
POLL_SECONDS = 0.5  # between polls of the sources' headers while they finish the round we need
MAX_SOURCES = 3  # peers asked in the decentralised topology

Reject = Callable[[str, str], None]
"""``reject(reason, peer)``: count a rejection (the daemon's reassembler counters)."""
Opener = Callable[[str], Awaitable[Stream]]
"""Opens a sync stream to a peer id; raises :class:`StreamError`."""


@dataclass(frozen=True)
class GlobalState:
    """What a joiner takes over: the global weights after ``round`` and what goes with them."""

    round: int
    weights: torch.Tensor  # float32, flat, in parameter-name order
    digest: str  # SHA-256 hex of the weights' bytes (the /status global_sha256)
    stats: GlobalStats | None
    aggregator: str | None  # star topology
    history: dict[str, float]  # the aggregator's reward history (relative-gain weighting)
    source: str  # the peer that served it


@dataclass(frozen=True)
class Snapshot:
    """What a server answers with: the framed signed header and the weights' bytes, of round ``round``."""

    round: int
    head: bytes
    weights: bytes


@dataclass(frozen=True)
class Choice:
    """The state to fetch: the (round, SHA-256) the most sources hold at the highest round, and who holds it."""

    round: int
    sha256: bytes
    holders: tuple[str, ...]


def weights_bytes(flat: torch.Tensor) -> bytes:
    """The weights as little-endian float32 bytes (the order :func:`dgrpo.federated.params.digest` hashes)."""
    array = flat.detach().reshape(-1).to(torch.float32).contiguous().numpy()
    return array.astype("<f4", copy=False).tobytes()


def weights_tensor(data: bytes) -> torch.Tensor:
    """The inverse of :func:`weights_bytes` (a writable copy)."""
    return torch.from_numpy(np.frombuffer(data, dtype="<f4").astype(np.float32))


def make_snapshot(
    identity: Identity,
    run_id: str,
    round_idx: int,
    flat: torch.Tensor,
    stats: GlobalStats | None,
    aggregator: str | None,
    history: Mapping[str, float],
) -> Snapshot:
    """Serialize and sign the state after ``round_idx`` (run it in a worker thread: it copies megabytes)."""
    weights = weights_bytes(flat)
    pair = None if stats is None else (stats.mean, stats.std)
    return Snapshot(round_idx, sign_header(identity, run_id, round_idx, weights, pair, aggregator, history), weights)


# ----------------------------------------------------------------- serving
class SyncServer:
    """Answers sync streams from :attr:`snapshot` (None: not ready, the stream is reset unanswered)."""

    def __init__(
        self,
        reject: Reject,
        streams: int = SERVE_STREAMS,
        request_timeout: float = REQUEST_TIMEOUT_SECONDS,
        serve_timeout: float = WEIGHTS_TIMEOUT_SECONDS,
    ) -> None:
        self.reject = reject
        self.streams = streams
        self.request_timeout = request_timeout
        self.serve_timeout = serve_timeout
        self.snapshot: Snapshot | None = None
        self.active = 0
        self.served = 0

    async def handle(self, stream: Stream) -> None:
        """Serve one stream; never raises for what the peer sends."""
        if self.active >= self.streams:
            self.reject("sync_busy", stream.peer)
            await stream.reset()
            return
        self.active += 1
        try:
            await self._serve(stream)
        finally:
            self.active -= 1

    async def _serve(self, stream: Stream) -> None:
        what = None
        # Too short, too slow or not a request: all the same to us.
        with trio.move_on_after(self.request_timeout), suppress(StreamError):
            what = parse_request(await stream.read_exactly(REQUEST_BYTES))
        snapshot = self.snapshot  # the one we answer from, even if a round ends meanwhile
        if what is None or snapshot is None:
            if what is None:
                self.reject("sync_bad_request", stream.peer)
            await stream.reset()  # answered with nothing
            return
        with trio.move_on_after(self.serve_timeout) as scope:
            try:
                await stream.write(snapshot.head + (snapshot.weights if what == WEIGHTS else b""))
            except StreamError as error:
                log.info("state sync to %s broke off: %s", stream.peer, error)
                scope.cancel()
        if scope.cancelled_caught:
            await stream.reset()
            return
        await stream.close()
        if what == WEIGHTS:
            self.served += 1


# ----------------------------------------------------------------- fetching
class SyncClient:
    """Asks one peer at a time; a failed check is counted through ``reject`` and answered None."""

    def __init__(
        self,
        open_stream: Opener,
        run_id: str,
        model_size: int,
        reject: Reject,
        head_timeout: float = HEAD_TIMEOUT_SECONDS,
        weights_timeout: float = WEIGHTS_TIMEOUT_SECONDS,
    ) -> None:
        self.open_stream = open_stream
        self.run_id = run_id
        self.model_bytes = model_size * FLOAT_BYTES
        self.reject = reject
        self.head_timeout = head_timeout
        self.weights_timeout = weights_timeout
        self._logged: set[tuple[str, str]] = set()  # (peer, reason) already logged as a warning

    async def head(self, peer: str, aggregator: str | None = None) -> SyncHeader | None:
        """``peer``'s checked header, or None (rejection counted)."""
        try:
            header, _ = await self._ask(peer, HEAD, aggregator, None)
        except SyncRejected as rejected:
            self._rejected(peer, rejected)
            return None
        return header

    async def heads(self, peers: list[str], aggregator: str | None = None) -> dict[str, SyncHeader]:
        answers = {peer: await self.head(peer, aggregator) for peer in peers}
        return {peer: header for peer, header in answers.items() if header is not None}

    async def weights(self, peer: str, want: Choice, aggregator: str | None = None) -> GlobalState | None:
        """The state ``want`` names, from ``peer``, checked; or None (rejection counted)."""
        try:
            header, data = await self._ask(peer, WEIGHTS, aggregator, want)
            weights = await trio.to_thread.run_sync(weights_tensor, data)
            if not bool(torch.isfinite(weights).all()):
                raise SyncRejected("sync_bad_weights", "a weight is not finite")
        except SyncRejected as rejected:
            self._rejected(peer, rejected)
            return None
        stats = None if header.mean is None or header.std is None else GlobalStats(header.mean, header.std)
        return GlobalState(header.round, weights, header.sha256.hex(), stats, header.aggregator, header.history, peer)

    async def _ask(self, peer: str, what: int, aggregator: str | None, want: Choice | None) -> tuple[SyncHeader, bytes]:
        stream: Stream | None = None
        complete = False
        try:
            with trio.fail_after(self.weights_timeout if what == WEIGHTS else self.head_timeout):
                stream = await self.open_stream(peer)
                await stream.write(encode_request(what))
                length = header_length(await stream.read_exactly(LENGTH_BYTES))
                header = decode_header(await stream.read_exactly(length))
                check_header(header, peer, self.run_id, self.model_bytes, aggregator)
                if want is not None and (header.round, header.sha256) != (want.round, want.sha256):
                    got, chosen = f"{header.round} {header.sha256.hex()[:12]}", f"{want.round} {want.sha256.hex()[:12]}"
                    raise SyncRejected("sync_disagrees", f"round {got}…, not the chosen {chosen}…")
                # The size was checked against our model: this reads at most the model's bytes.
                data = await stream.read_exactly(header.size) if what == WEIGHTS else b""
                complete = True
        except trio.TooSlowError:
            raise SyncRejected("sync_timeout") from None
        except StreamError as error:
            raise SyncRejected("sync_unavailable", str(error)) from None
        finally:
            if stream is not None and complete:
                await stream.close()
            elif stream is not None:  # a rejected answer is not read to its end: abort it
                await stream.reset()
        if what == WEIGHTS:
            check_weights(header, data)
        return header, data

    def _rejected(self, peer: str, rejected: SyncRejected) -> None:
        # Every rejection is counted; a source that stays unreachable is polled every POLL_SECONDS, so the
        # log says each (peer, reason) once as a warning and the repeats at debug level.
        first = (peer, rejected.reason) not in self._logged
        self._logged.add((peer, rejected.reason))
        log.log(logging.WARNING if first else logging.DEBUG, "state sync from %s rejected: %s", peer, rejected)
        self.reject(rejected.reason, peer)


def choose(heads: Mapping[str, SyncHeader]) -> Choice:
    """The highest round any source holds, and the weights most of its holders agree on (ties: the lowest
    digest, so every joiner picks alike)."""
    top = max(h.round for h in heads.values())
    at_top = {peer: h for peer, h in heads.items() if h.round == top}
    counts = Counter(h.sha256 for h in at_top.values())
    sha = min(counts, key=lambda d: (-counts[d], d))
    return Choice(top, sha, tuple(sorted(p for p, h in at_top.items() if h.sha256 == sha)))


def named_aggregator(heads: Mapping[str, SyncHeader]) -> str | None:
    """The aggregator most sources name (star topology, when this node was not told); ties: the lowest id."""
    counts = Counter(h.aggregator for h in heads.values() if h.aggregator is not None)
    return min(counts, key=lambda a: (-counts[a], a)) if counts else None


async def fetch_global_state(
    client: SyncClient,
    sources: Callable[[], list[str]],
    target: int,
    wait: float,
    aggregator: str | None = None,
    poll: float = POLL_SECONDS,
) -> GlobalState | None:
    """Poll ``sources()`` until one holds round ``target`` or later (or ``wait`` seconds passed: then the
    latest they hold), and fetch it. ``aggregator`` (star): every answer must name it. None if no source
    gave a valid state in time."""
    deadline = trio.current_time() + wait
    while True:
        heads = await client.heads(sources(), aggregator)
        late = trio.current_time() >= deadline
        if heads:
            choice = choose(heads)
            if choice.round >= target or late:
                for peer in choice.holders:
                    state = await client.weights(peer, choice, aggregator)
                    if state is not None:
                        return state
        if late:
            return None
        await trio.sleep(poll)
