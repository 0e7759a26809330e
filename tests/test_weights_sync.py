"""The weights sync of the completion exchange (docs/protocol.md, "Weights sync"): the root and piece hashes,
the majority rule worked by hand, the request/response framing, and the client against honest, broken and
hostile holders (each failure a reason code counted by peer, never an exception), in memory and over real
libp2p streams."""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Any

import msgpack
import pytest
import trio
import trio.testing

from dgrpo.net.gossip import GossipConfig, GossipNode
from dgrpo.net.streams import Stream, StreamError
from dgrpo.net.train_sync import RateLimit, Served, StateClient, StateServer
from dgrpo.protocol.identity import Identity
from dgrpo.protocol.train_sync import (
    HEAD,
    MIN_PIECE_BYTES,
    PIECES,
    ROOT_TAG,
    Announcement,
    StateRejected,
    check_header,
    decode_header,
    encode_head_request,
    encode_header,
    encode_pieces_request,
    majority_root,
    parse_pieces_tail,
    parse_request_kind,
    piece_hashes,
    state_protocol,
    state_root,
)
from tests.stream_pipes import Counts, Pipe

RUN = "sync-run"
PIECE = MIN_PIECE_BYTES  # small pieces: a state of a few pieces in tests
STATE = bytes(range(256)) * (PIECE * 3 // 256) + b"tail"  # three whole pieces and 4 bytes
A, B, C, D = "peer-a", "peer-b", "peer-c", "peer-d"
R1, R2, R3 = (bytes([i]) * 32 for i in (1, 2, 3))


def served(state: bytes = STATE, round_idx: int = 7) -> Served:
    return Served.of(RUN, round_idx, state, PIECE)


ROOT = served().header.root


# ----------------------------------------------------------------- hashing and the majority rule
def test_root_covers_the_tag_size_piece_size_and_piece_hashes() -> None:
    pieces = piece_hashes(STATE, PIECE)
    assert len(pieces) == 4 and pieces[3] == hashlib.sha256(b"tail").digest()
    by_hand = hashlib.sha256(
        ROOT_TAG + len(STATE).to_bytes(8, "big") + PIECE.to_bytes(4, "big") + b"".join(pieces)
    ).digest()
    assert state_root(len(STATE), PIECE, pieces) == by_hand == ROOT
    assert state_root(len(STATE), 2 * PIECE, piece_hashes(STATE, 2 * PIECE)) != ROOT  # the cut is covered too


@pytest.mark.parametrize(
    ("announced", "at_least", "own", "expected"),
    [
        # two of three peers hold R1 at round 5: taken; the third's R2 is not
        ({A: (5, R1), B: (5, R1), C: (5, R2)}, 5, None, (5, R1, (A, B))),
        # one of two is no majority, whichever root it is (a joiner trusts neither)
        ({A: (5, R1), B: (5, R2)}, 5, None, None),
        # a peer that announced nothing votes against every root
        ({A: (5, R1), B: None}, 5, None, None),
        ({A: (5, R1), B: (5, R1), C: None}, 5, None, (5, R1, (A, B))),
        # too old a round is no candidate
        ({A: (4, R1), B: (4, R1)}, 5, None, None),
        # the highest round where a majority holds one state
        ({A: (6, R1), B: (6, R1), C: (5, R3)}, 5, None, (6, R1, (A, B))),
        # this node votes too: with its own R2 against two peers' R1, R1 has 2 of 3
        ({A: (5, R1), B: (5, R1)}, 5, (5, R2), (5, R1, (A, B))),
        # ... and one peer's R1 against its own R2 is 1 of 2: it keeps its own
        ({A: (5, R1)}, 5, (5, R2), None),
        # its own root with one of two peers is the majority (holders: the peer only)
        ({A: (5, R2), B: (5, R1)}, 5, (5, R2), (5, R2, (A,))),
        # a hostile minority naming a far-off round moves nobody
        ({A: (5, R1), B: (5, R1), C: (90, R3)}, 5, None, (5, R1, (A, B))),
    ],
)
def test_majority_root_by_hand(
    announced: dict[str, tuple[int, bytes] | None],
    at_least: int,
    own: tuple[int, bytes] | None,
    expected: tuple[int, bytes, tuple[str, ...]] | None,
) -> None:
    votes = {p: None if a is None else Announcement(*a) for p, a in announced.items()}
    got = majority_root(votes, at_least, None if own is None else Announcement(*own))
    assert (None if got is None else (got.round, got.root, got.holders)) == expected


# ----------------------------------------------------------------- framing
def test_requests_and_protocol_id() -> None:
    assert state_protocol("r1") == "/dgrpo/r1/state/1"
    assert encode_head_request() == b"DGW1\x01" and parse_request_kind(b"DGW1\x01") == HEAD
    req = encode_pieces_request(R1, 2, 3)
    assert req == b"DGW1\x02" + R1 + b"\x00\x00\x00\x02\x00\x00\x00\x03"
    assert parse_request_kind(req[:5]) == PIECES
    tail = parse_pieces_tail(req[5:])
    assert tail is not None and (tail.root, tail.first, tail.count) == (R1, 2, 3)
    assert parse_request_kind(b"DGW1\x03") is None and parse_request_kind(b"XXXX\x01") is None
    assert parse_pieces_tail(req[5:-1]) is None
    assert parse_pieces_tail(R1 + bytes(8)) is None  # a zero count


def test_header_checks() -> None:
    head = encode_header(RUN, 7, STATE, PIECE)
    header = decode_header(head[4:])
    assert (header.round, header.size, header.piece_bytes, len(header.pieces)) == (7, len(STATE), PIECE, 4)
    check_header(header, RUN, ROOT, len(STATE))
    for run, root, limit, reason in (
        ("other", ROOT, len(STATE), "state_wrong_run"),
        (RUN, R1, len(STATE), "state_disagrees"),
        (RUN, ROOT, len(STATE) - 1, "state_oversize"),
    ):
        with pytest.raises(StateRejected) as caught:
            check_header(header, run, root, limit)
        assert caught.value.reason == reason
    fields = msgpack.unpackb(head[4:], raw=False)
    for changes in ({"pieces": fields["pieces"][:3]}, {"piece_bytes": 1}, {"extra": 1}, {"v": 2}):
        with pytest.raises(StateRejected, match="state_malformed"):
            decode_header(msgpack.packb({**fields, **changes}, use_bin_type=True))
    with pytest.raises(StateRejected, match="state_malformed"):
        decode_header(b"\xc1")


# ----------------------------------------------------------------- client and server, in memory
Handler = Callable[[Stream], Awaitable[None]]


def network(nursery: trio.Nursery, handlers: dict[str, Handler]) -> Callable[[str], Awaitable[Stream]]:
    async def open_stream(peer: str) -> Stream:
        if peer not in handlers:
            raise StreamError(f"no route to {peer}")
        ours, theirs = trio.testing.memory_stream_pair()
        nursery.start_soon(handlers[peer], Stream(Pipe(theirs), "joiner"))
        return Stream(Pipe(ours), peer)

    return open_stream


def run(test: Callable[[trio.Nursery], Awaitable[None]]) -> None:
    async def main() -> None:
        with trio.fail_after(20):
            async with trio.open_nursery() as nursery:
                await test(nursery)
                nursery.cancel_scope.cancel()

    trio.run(main)


def server(state: bytes = STATE, counts: Counts | None = None, **kw: Any) -> StateServer:
    s = StateServer(counts or Counts(), **kw)
    s.served = served(state)
    return s


def breaking_after(pieces: int, inner: StateServer) -> Handler:
    """A holder that hangs up after sending ``pieces`` pieces of a pieces request (a broken connection)."""

    async def handle(stream: Stream) -> None:
        request = await stream.read_exactly(5)
        if request[4] == HEAD:
            assert inner.served is not None
            await stream.write(inner.served.head)
            await stream.close()
            return
        await stream.read_exactly(40)
        await stream.write(b"\x00" + STATE[: pieces * PIECE])
        await stream.reset()

    return handle


def test_fetch_and_resume_after_a_broken_connection() -> None:
    counts = Counts()

    async def test(nursery: trio.Nursery) -> None:
        handlers = {A: breaking_after(2, server()), B: server().handle}
        client = StateClient(network(nursery, handlers), RUN, 1 << 20, counts)
        got = await client.fetch(ROOT, [A, B])
        assert got == (STATE, B)
        assert client.resumed == 1  # B sent only the pieces A had not

    run(test)
    assert counts.seen == [("state_unavailable", A)]


def header_claiming(root_pieces: bytes, sent: bytes) -> Handler:
    """A hostile holder: its header lists the pieces of ``root_pieces``, it sends ``sent``."""
    honest = served(root_pieces)

    async def handle(stream: Stream) -> None:
        request = await stream.read_exactly(5)
        if request[4] == HEAD:
            await stream.write(honest.head)
        else:
            await stream.read_exactly(40)
            await stream.write(b"\x00" + sent)
        await stream.close()

    return handle


@pytest.mark.parametrize(
    ("hostile", "reason"),
    [
        # weights other than the announced ones: the header's pieces do not hash to the root
        (lambda: header_claiming(STATE[::-1], STATE[::-1]), "state_disagrees"),
        # the right header, other bytes: the first bad piece is refused
        (lambda: header_claiming(STATE, STATE[:PIECE] + bytes(len(STATE) - PIECE)), "state_bad_piece"),
        # an honest holder of another state (it completed another round): the same refusal
        (lambda: server(STATE[::-1]).handle, "state_disagrees"),
    ],
)
def test_a_state_that_does_not_match_the_announced_root_is_refused(hostile: Callable[[], Handler], reason: str) -> None:
    counts = Counts()

    async def test(nursery: trio.Nursery) -> None:
        client = StateClient(network(nursery, {C: hostile(), B: server().handle}), RUN, 1 << 20, counts)
        assert await client.fetch(ROOT, [C]) is None  # refused, and nothing else to ask
        got = await client.fetch(ROOT, [C, B])  # an honest holder of the root completes it
        assert got == (STATE, B)

    run(test)
    assert counts.seen[0] == (reason, C) and {r for r, _ in counts.seen} == {reason}


def test_not_held_busy_bad_requests_and_unreachable() -> None:
    counts = Counts()
    served_counts = Counts()

    async def test(nursery: trio.Nursery) -> None:
        old = server()
        client = StateClient(network(nursery, {A: old.handle}), RUN, 1 << 20, counts)
        header = served().header
        old.served = served(STATE[::-1])  # it completed another round since the header
        pieces: list[bytes] = []
        with pytest.raises(StateRejected, match="state_not_held"):
            await client._pieces(A, header, ROOT, pieces)
        assert await client.fetch(ROOT, [D]) is None  # no route
        busy = server(counts=served_counts, streams=0)
        bad = server(counts=served_counts)
        ours, theirs = trio.testing.memory_stream_pair()
        await busy.handle(Stream(Pipe(theirs), "x"))
        for request in (b"DGW1\x07", b"DGW1\x02" + R1 + bytes(8)):
            ours, theirs = trio.testing.memory_stream_pair()
            await ours.send_all(request)
            await bad.handle(Stream(Pipe(theirs), "y"))
            assert await ours.receive_some(10) == b""  # answered with nothing

    run(test)
    assert counts.seen == [("state_unavailable", D)] * 2  # each holder is tried twice
    assert served_counts.seen == [("state_busy", "x"), ("state_bad_request", "y"), ("state_bad_request", "y")]


def test_rate_limit_spreads_bytes_over_time() -> None:
    async def main() -> None:
        limit = RateLimit(1000.0)
        t0 = trio.current_time()
        for _ in range(4):
            await limit.take(500)
        assert trio.current_time() - t0 == pytest.approx(1.5)  # the first is free, then 0.5 s each

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))


# ----------------------------------------------------------------- over libp2p
FAST = {"listen": "/ip4/127.0.0.1/tcp/0", "heartbeat_interval": 0.2}
ALICE = Identity.from_seed(bytes([1]) * 32)
JOINER = Identity.from_seed(bytes([9]) * 32)


@asynccontextmanager
async def two_hosts() -> AsyncIterator[tuple[GossipNode, GossipNode]]:
    async with AsyncExitStack() as stack:
        a = await stack.enter_async_context(GossipNode.open(GossipConfig(**FAST), ALICE.to_libp2p_keypair()))
        cfg = GossipConfig(**FAST, bootstrap=tuple(a.listen_addrs()))
        b = await stack.enter_async_context(GossipNode.open(cfg, JOINER.to_libp2p_keypair()))
        await b.wait_for_peers(1, timeout=10)
        yield a, b


def test_weights_sync_over_libp2p_streams() -> None:
    state = bytes(range(256)) * (5 << 20 >> 8)  # 5 MiB in 1 MiB pieces
    counts = Counts()
    holder = Served.of(RUN, 20, state)

    async def main() -> None:
        with trio.fail_after(60):
            async with two_hosts() as (a, b):
                s = StateServer(counts)
                s.served = holder
                a.serve_streams(state_protocol(RUN), s.handle)

                async def open_stream(peer: str) -> Stream:
                    return await b.open_stream(peer, state_protocol(RUN), a.listen_addrs())

                got = await StateClient(open_stream, RUN, 1 << 30, counts).fetch(holder.header.root, [ALICE.peer_id])
                assert got == (state, ALICE.peer_id)
                assert s.pieces_sent == 5

    trio.run(main)
    assert counts.seen == []


# ----------------------------------------------------------------- the protocol document
def test_the_protocol_document_states_the_weights_sync() -> None:
    """docs/protocol.md's "Weights sync": its tables list the header's fields and the reason codes in order, and
    its constants and root test vector are the code's."""
    from dgrpo.net.train_sync import PIECES_PER_REQUEST, SERVE_STREAMS
    from dgrpo.protocol.train_sync import MAX_HEADER_BYTES, PIECE_BYTES, STATE_REASONS, StateHeader
    from tests.test_protocol_doc import DOC, code_block_after, table_after

    doc = DOC.read_text(encoding="utf-8")
    rows = table_after(doc, "#### State header", ["field", "type", "notes"])
    assert [r[0] for r in rows] == list(StateHeader.model_fields)
    rows = table_after(doc, "#### State checks", ["reason", "side", "check"])
    assert tuple(r[0] for r in rows) == STATE_REASONS
    assert f"`{state_protocol('RUN').replace('RUN', '<run>')}`" in doc
    assert " ".join(f"{b:02x}" for b in ROOT_TAG) in doc
    assert " ".join(f"{b:02x}" for b in encode_head_request()[:4]) in doc
    assert f"at most {MAX_HEADER_BYTES} bytes" in doc and PIECE_BYTES == 1 << 20
    assert f"at most {PIECES_PER_REQUEST}" in doc and f"at most {SERVE_STREAMS} streams" in doc
    state = b"dgrpo" * 30000
    vector = code_block_after(doc, "<!-- test-vector: state-root -->")
    assert vector == state_root(len(state), 65536, piece_hashes(state, 65536)).hex()
