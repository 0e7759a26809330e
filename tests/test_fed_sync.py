"""Federated mode's state sync: the request/response framing, the checks on every answer (each failure a
reason code counted by peer, never an exception), the choice among sources, the serving side's bounds,
and one exchange over real libp2p streams."""

from __future__ import annotations

import hashlib
import logging
import math
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Any

import msgpack
import pytest
import torch
import trio
import trio.testing

from dgrpo.federated.client import GlobalStats
from dgrpo.federated.params import digest
from dgrpo.net.gossip import GossipConfig, GossipNode
from dgrpo.net.state_sync import (
    Choice,
    GlobalState,
    Snapshot,
    SyncClient,
    SyncServer,
    choose,
    fetch_global_state,
    make_snapshot,
    named_aggregator,
    weights_bytes,
)
from dgrpo.net.streams import Stream, StreamError
from dgrpo.protocol.identity import Identity
from dgrpo.protocol.sync import (
    HEAD,
    MAX_HEADER_BYTES,
    WEIGHTS,
    SyncHeader,
    SyncRejected,
    check_header,
    decode_header,
    encode_request,
    parse_request,
    sync_protocol,
)
from tests.stream_pipes import Counts, Pipe

RUN = "sync-run"
ALICE = Identity.from_seed(bytes([1]) * 32)
BOB = Identity.from_seed(bytes([2]) * 32)
CAROL = Identity.from_seed(bytes([3]) * 32)
JOINER = Identity.from_seed(bytes([9]) * 32)
SIZE = 1000
STATS = GlobalStats(0.5, 0.25)


def flat(seed: int = 0, size: int = SIZE) -> torch.Tensor:
    return torch.randn(size, generator=torch.Generator().manual_seed(seed))


def snapshot(ident: Identity = ALICE, round_idx: int = 3, seed: int = 0, **changes: Any) -> Snapshot:
    args: dict[str, Any] = {"run_id": RUN, "flat": flat(seed), "stats": STATS, "aggregator": None, "history": {}}
    return make_snapshot(ident, round_idx=round_idx, **{**args, **changes})


Handler = Callable[[Stream], Awaitable[None]]


def network(nursery: trio.Nursery, handlers: dict[str, Handler], me: str = JOINER.peer_id) -> Callable[..., Any]:
    """An opener that connects to ``handlers[peer]`` in memory (a peer without one is unreachable)."""

    async def open_stream(peer: str) -> Stream:
        if peer not in handlers:
            raise StreamError(f"no route to {peer}")
        ours, theirs = trio.testing.memory_stream_pair()
        nursery.start_soon(handlers[peer], Stream(Pipe(theirs), me))
        return Stream(Pipe(ours), peer)

    return open_stream


def answering(data: bytes, close: bool = True) -> Handler:
    """A server that answers any request with ``data`` (then closes, or hangs)."""

    async def handle(stream: Stream) -> None:
        await stream.read_exactly(5)
        await stream.write(data)
        if close:
            await stream.close()
        else:
            await trio.sleep_forever()

    return handle


def run(test: Callable[[trio.Nursery], Awaitable[None]]) -> None:
    async def main() -> None:
        with trio.fail_after(20):
            async with trio.open_nursery() as nursery:
                await test(nursery)
                nursery.cancel_scope.cancel()

    trio.run(main)


def client(nursery: trio.Nursery, handlers: dict[str, Handler], counts: Counts, **kw: Any) -> SyncClient:
    return SyncClient(network(nursery, handlers), RUN, kw.pop("size", SIZE), counts, **kw)


def reframe(head: bytes, **changes: Any) -> bytes:
    """A header with some fields changed after signing (its signature no longer matches)."""
    fields = msgpack.unpackb(head[4:], raw=False)
    packed = msgpack.packb({**fields, **changes}, use_bin_type=True)
    return len(packed).to_bytes(4, "big") + packed


# ----------------------------------------------------------------- framing
def test_request_bytes_and_protocol_id() -> None:
    assert encode_request(HEAD) == b"DGS1\x01" and encode_request(WEIGHTS) == b"DGS1\x02"
    assert parse_request(b"DGS1\x02") == WEIGHTS
    for bad in (b"", b"DGS1", b"DGS1\x03", b"DGS2\x01", b"DGS1\x01\x00", b"\x00" * 5):
        assert parse_request(bad) is None
    assert sync_protocol(RUN) == "/dgrpo/sync-run/fed-sync/1"


def test_header_round_trip_and_fields() -> None:
    snap = snapshot(aggregator=ALICE.peer_id, history={"b": 0.25, "a": 0.5})
    length = int.from_bytes(snap.head[:4], "big")
    assert len(snap.head) == 4 + length
    header = decode_header(snap.head[4:])
    assert header.round == 3 and header.size == 4 * SIZE and header.run == RUN
    assert header.sha256.hex() == digest(flat()) == hashlib.sha256(snap.weights).hexdigest()
    assert (header.mean, header.std) == (0.5, 0.25) and header.aggregator == ALICE.peer_id
    assert header.clients == ("a", "b") and header.history == {"a": 0.5, "b": 0.25}
    check_header(header, ALICE.peer_id, RUN, 4 * SIZE, aggregator=ALICE.peer_id)
    empty = decode_header(snapshot(stats=None).head[4:])
    assert empty.mean is None and empty.std is None and empty.aggregator is None


@pytest.mark.parametrize(
    "changes",
    [
        {"mean": 1},  # an int where a float 64 belongs
        {"mean": None},  # std without mean
        {"mean": math.nan},
        {"size": 4001},  # not whole float32s
        {"sha256": b"\x00" * 31},
        {"clients": ["b", "a"], "means": [0.1, 0.2]},  # not ascending
        {"clients": ["a"]},  # no mean for it
        {"v": 2},
        {"extra": 1},
    ],
)
def test_header_schema(changes: dict[str, Any]) -> None:
    with pytest.raises(SyncRejected) as err:
        decode_header(reframe(snapshot().head, **changes)[4:])
    assert err.value.reason == "sync_malformed"


# ----------------------------------------------------------------- fetching: every check
def test_head_and_weights_round_trip() -> None:
    counts = Counts()

    async def test(nursery: trio.Nursery) -> None:
        server = SyncServer(counts)
        server.snapshot = snapshot(aggregator=ALICE.peer_id, history={BOB.peer_id: 0.3})
        c = client(nursery, {ALICE.peer_id: server.handle}, counts)
        header = await c.head(ALICE.peer_id, aggregator=ALICE.peer_id)
        assert header is not None and header.round == 3
        want = choose({ALICE.peer_id: header})
        state = await c.weights(ALICE.peer_id, want, aggregator=ALICE.peer_id)
        assert isinstance(state, GlobalState)
        assert torch.equal(state.weights, flat()) and state.digest == digest(flat())
        assert state.round == 3 and state.stats == STATS and state.aggregator == ALICE.peer_id
        assert state.history == {BOB.peer_id: 0.3} and state.source == ALICE.peer_id
        assert server.served == 1 and server.active == 0

    run(test)
    assert counts.seen == []


def _hostile_answers() -> dict[str, tuple[bytes, dict[str, Any]]]:
    """reason -> (what ALICE's server answers a weights request with, client options)."""
    good = snapshot()
    tampered = bytearray(good.weights)
    tampered[0] ^= 0xFF
    nan = snapshot(flat=torch.full((SIZE,), math.nan))
    length_over = (MAX_HEADER_BYTES + 1).to_bytes(4, "big") + b"\x00" * 16
    return {
        "sync_oversize": (length_over, {}),
        "sync_malformed": (b"\x00\x00\x00\x03\xc1\xc1\xc1" + good.weights, {}),
        "sync_bad_signature": (reframe(good.head, round=4) + good.weights, {}),
        "sync_wrong_signer": (snapshot(BOB).head + good.weights, {}),
        "sync_wrong_run": (snapshot(run_id="other-run").head + good.weights, {}),
        "sync_size_mismatch": (snapshot(flat=flat(size=SIZE + 1)).head + good.weights, {}),
        "sync_wrong_aggregator": (snapshot(aggregator=BOB.peer_id).head + good.weights, {"agg": ALICE.peer_id}),
        "sync_disagrees": (snapshot(seed=1).head + flat(1).numpy().tobytes(), {}),
        "sync_bad_hash": (good.head + bytes(tampered), {}),
        "sync_bad_weights": (nan.head + nan.weights, {"want": hashlib.sha256(nan.weights).digest()}),
        "sync_unavailable": (good.head + good.weights[:100], {}),  # closed before the declared length
        "sync_timeout": (good.head + good.weights[:100], {"hang": True}),
    }


@pytest.mark.parametrize("reason", list(_hostile_answers()))
def test_every_bad_answer_is_a_counted_rejection(reason: str) -> None:
    data, options = _hostile_answers()[reason]
    counts = Counts()
    want = Choice(3, options.get("want", hashlib.sha256(snapshot().weights).digest()), (ALICE.peer_id,))

    async def test(nursery: trio.Nursery) -> None:
        handler = answering(data, close=not options.get("hang"))
        c = client(nursery, {ALICE.peer_id: handler}, counts, weights_timeout=0.5)
        assert await c.weights(ALICE.peer_id, want, aggregator=options.get("agg")) is None

    run(test)
    assert counts.seen == [(reason, ALICE.peer_id)]


def test_unreachable_peer_and_missing_protocol() -> None:
    counts = Counts()

    async def test(nursery: trio.Nursery) -> None:
        c = client(nursery, {}, counts)
        assert await c.head(BOB.peer_id) is None

    run(test)
    assert counts.seen == [("sync_unavailable", BOB.peer_id)]


def test_a_repeated_rejection_is_counted_each_time_and_logged_once(caplog: pytest.LogCaptureFixture) -> None:
    counts = Counts()

    async def test(nursery: trio.Nursery) -> None:
        c = client(nursery, {}, counts)
        for _ in range(3):  # a joiner polls an unreachable source every POLL_SECONDS
            assert await c.head(BOB.peer_id) is None

    with caplog.at_level(logging.DEBUG, logger="dgrpo.net"):
        run(test)
    assert counts.seen == [("sync_unavailable", BOB.peer_id)] * 3
    levels = [r.levelno for r in caplog.records if "state sync from" in r.getMessage()]
    assert levels == [logging.WARNING, logging.DEBUG, logging.DEBUG]


# ----------------------------------------------------------------- serving
def test_server_answers_bad_requests_with_nothing() -> None:
    counts = Counts()

    async def ask(server: SyncServer, request: bytes, then_close: bool = True) -> bytes:
        ours, theirs = trio.testing.memory_stream_pair()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(server.handle, Stream(Pipe(theirs), BOB.peer_id))
            mine = Stream(Pipe(ours), ALICE.peer_id)
            try:  # a server that is busy resets the stream at once: then even the write fails
                await mine.write(request)
                if then_close:
                    await mine.close()
                return await mine.read_exactly(1)
            except StreamError:
                return b""

    async def test(nursery: trio.Nursery) -> None:
        server = SyncServer(counts, request_timeout=0.2)
        server.snapshot = snapshot()
        assert await ask(server, b"XXXX\x01") == b""  # not a request
        assert await ask(server, b"DGS1") == b""  # too short, then EOF
        assert await ask(server, b"", then_close=False) == b""  # nothing within the timeout
        assert await ask(server, b"DGS1\x01") != b""  # a good one is answered
        server.active = server.streams  # every slot taken
        assert await ask(server, b"DGS1\x01") == b""

    run(test)
    assert counts.seen == [("sync_bad_request", BOB.peer_id)] * 3 + [("sync_busy", BOB.peer_id)]


# ----------------------------------------------------------------- choosing and polling
def _header(ident: Identity, round_idx: int, seed: int, aggregator: str | None = None) -> SyncHeader:
    return decode_header(snapshot(ident, round_idx, seed, aggregator=aggregator).head[4:])


def test_choose_the_most_held_digest_at_the_highest_round() -> None:
    heads = {
        ALICE.peer_id: _header(ALICE, 4, 0),
        BOB.peer_id: _header(BOB, 4, 1),
        CAROL.peer_id: _header(CAROL, 4, 1),
        JOINER.peer_id: _header(JOINER, 3, 2),
    }
    choice = choose(heads)
    assert choice.round == 4 and choice.sha256.hex() == digest(flat(1))
    assert choice.holders == tuple(sorted((BOB.peer_id, CAROL.peer_id)))
    assert choose({**heads, ALICE.peer_id: _header(ALICE, 5, 2)}).holders == (ALICE.peer_id,)  # a higher round wins
    named = {p: _header(ALICE, 1, 0, aggregator=a) for p, a in (("x", "agg1"), ("y", "agg2"), ("z", "agg2"))}
    assert named_aggregator(named) == "agg2" and named_aggregator({}) is None


def test_fetch_waits_for_the_target_round_and_skips_a_bad_holder() -> None:
    counts = Counts()
    liar, honest, other = sorted((ALICE, BOB, CAROL), key=lambda i: i.peer_id)  # holders are tried in id order

    async def test(nursery: trio.Nursery) -> None:
        servers = {ident.peer_id: SyncServer(counts) for ident in (liar, honest, other)}
        for ident in (liar, honest, other):
            servers[ident.peer_id].snapshot = snapshot(ident, 2, seed=0)  # all still in round 3
        handlers: dict[str, Handler] = {peer: s.handle for peer, s in servers.items()}
        lie = snapshot(liar, 3, seed=1)
        tampered = bytearray(lie.weights)
        tampered[-1] ^= 1

        async def lying(stream: Stream) -> None:  # the right header, then weights that do not match it
            what = parse_request(await stream.read_exactly(5))
            await stream.write(lie.head + (bytes(tampered) if what == WEIGHTS else b""))
            await stream.close()

        async def finish_round() -> None:
            await trio.sleep(0.3)
            handlers[liar.peer_id] = lying
            for ident in (honest, other):
                servers[ident.peer_id].snapshot = snapshot(ident, 3, seed=1)

        nursery.start_soon(finish_round)
        c = client(nursery, handlers, counts)
        peers = [liar.peer_id, honest.peer_id, other.peer_id]
        state = await fetch_global_state(c, lambda: peers, target=3, wait=10, poll=0.05)
        assert state is not None and state.round == 3 and torch.equal(state.weights, flat(1))
        assert state.source == honest.peer_id

    run(test)
    assert counts.seen == [("sync_bad_hash", liar.peer_id)]


def test_fetch_gives_up_without_a_valid_source() -> None:
    counts = Counts()

    async def test(nursery: trio.Nursery) -> None:
        c = client(nursery, {ALICE.peer_id: answering(snapshot(BOB).head)}, counts)
        assert await fetch_global_state(c, lambda: [ALICE.peer_id, CAROL.peer_id], 3, wait=0.2, poll=0.05) is None

    run(test)
    assert {r for r, _ in counts.seen} == {"sync_wrong_signer", "sync_unavailable"}


# ----------------------------------------------------------------- over real libp2p
FAST = {"bootstrap_backoff_initial": 0.05, "bootstrap_backoff_max": 0.2, "shutdown_flush_timeout": 1.0}


@asynccontextmanager
async def two_hosts() -> AsyncIterator[tuple[GossipNode, GossipNode]]:
    async with AsyncExitStack() as stack:
        a = await stack.enter_async_context(GossipNode.open(GossipConfig(**FAST), ALICE.to_libp2p_keypair()))
        cfg = GossipConfig(**FAST, bootstrap=tuple(a.listen_addrs()))
        b = await stack.enter_async_context(GossipNode.open(cfg, JOINER.to_libp2p_keypair()))
        await b.wait_for_peers(1, timeout=10)
        yield a, b


def test_sync_over_libp2p_streams() -> None:
    size = 1 << 20  # a 4 MiB snapshot, as the embedded model's
    counts = Counts()

    async def main() -> None:
        with trio.fail_after(30):
            async with two_hosts() as (a, b):
                server = SyncServer(counts)
                server.snapshot = snapshot(flat=flat(5, size), aggregator=ALICE.peer_id)
                a.serve_streams(sync_protocol(RUN), server.handle)

                async def open_stream(peer: str) -> Stream:
                    return await b.open_stream(peer, sync_protocol(RUN), a.listen_addrs())

                c = SyncClient(open_stream, RUN, size, counts)
                state = await fetch_global_state(c, lambda: [ALICE.peer_id], 3, wait=5, aggregator=ALICE.peer_id)
                assert state is not None and torch.equal(state.weights, flat(5, size))
                assert weights_bytes(state.weights) == server.snapshot.weights
                # Another protocol id (another run) is not served: the stream does not open.
                other = SyncClient(lambda p: b.open_stream(p, sync_protocol("other")), "other", size, counts)
                assert await other.head(ALICE.peer_id) is None

    trio.run(main)
    assert counts.seen == [("sync_unavailable", ALICE.peer_id)]
