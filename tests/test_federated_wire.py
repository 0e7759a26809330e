"""Federated mode's wire: update and global chunks, their validation, reassembly and hostile chunks."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import msgpack
import pytest
import torch
import trio

from dgrpo.federated.client import GlobalStats
from dgrpo.federated.encoding import encode
from dgrpo.federated.sparse import SparseUpdate, top_k
from dgrpo.federated.stats import ClientStats
from dgrpo.net.updates import UpdateExchange, sparse_of
from dgrpo.protocol.chunks import Reassembler, global_chunks, split_payload, update_chunks
from dgrpo.protocol.envelope import Envelope, ProtocolError, Signer, decode
from dgrpo.protocol.identity import Identity
from dgrpo.protocol.limits import Limits
from dgrpo.protocol.nonce import NonceCounter
from dgrpo.protocol.topics import global_topic, topic_kind, update_topic
from dgrpo.protocol.update_bodies import GlobalBody, UpdateBody
from dgrpo.protocol.validator import MessageValidator

RUN = "fed-run"
T0 = 1_700_000_000.0
ALICE = Identity.from_seed(bytes([1]) * 32)
BOB = Identity.from_seed(bytes([2]) * 32)
CAROL = Identity.from_seed(bytes([3]) * 32)
SIZE = 50_000
STATS = ClientStats(0.25, 0.125, 16, 4)
BASE = hashlib.sha256(b"the global weights of the previous round").digest()


def signer(tmp_path: Path, ident: Identity, **limits: Any) -> Signer:
    return Signer(
        ident, RUN, NonceCounter(tmp_path / f"{ident.peer_id}.nonce"), clock=lambda: T0, limits=Limits(**limits)
    )


def validator(**limits: Any) -> MessageValidator:
    return MessageValidator(RUN, Limits(**limits), clock=lambda: T0)


def an_update(k: int = 5_000, seed: int = 0) -> SparseUpdate:
    gen = torch.Generator().manual_seed(seed)
    return top_k(torch.randn(SIZE, generator=gen), k)


def update_messages(s: Signer, payload: bytes, round_idx: int = 1, chunk_bytes: int = 4096) -> list[bytes]:
    bodies = update_chunks(payload, STATS.mean, STATS.std, STATS.samples, STATS.groups, chunk_bytes, base=BASE)
    return [s.sign_chunk(b, round_idx) for b in bodies]


class Receiver:
    """A node's receiving side: the protocol's validator, then the exchange (reassembly, decoding)."""

    def __init__(self, tmp_path: Path, aggregator: str | None = None, **limits: Any) -> None:
        self.validator = validator(**limits)
        reassembler = Reassembler(Limits(**limits))
        reassembler.advance(1)
        self.exchange = UpdateExchange(
            CAROL.peer_id, signer(tmp_path, CAROL), reassembler, SIZE, RUN, 4096, aggregator=aggregator
        )

    def receive(self, data: bytes, kind: str = "update") -> str | None:
        """None when accepted by the validator (then handed to the exchange), else the validator's reason."""
        verdict = self.validator.validate(data, expected_kind=kind)
        if not verdict.ok:
            return verdict.reason
        assert verdict.envelope is not None
        self.exchange.handle(verdict.envelope)
        return None

    def rejected(self) -> dict[str, int]:
        return self.exchange.reassembler.statistics().rejected_by_reason


def test_topics() -> None:
    assert update_topic(RUN) == "/dgrpo/fed-run/updates/1" and global_topic(RUN) == "/dgrpo/fed-run/global/1"
    assert (topic_kind(update_topic(RUN), RUN), topic_kind(global_topic(RUN), RUN)) == ("update", "global")


def test_update_round_trip_in_chunks(tmp_path: Path) -> None:
    update = an_update()
    payload = encode(update)
    messages = update_messages(signer(tmp_path, ALICE), payload)
    assert len(messages) == -(-len(payload) // 4096) > 1
    rx = Receiver(tmp_path)
    for data in reversed(messages):  # any order
        assert rx.receive(data) is None
    got = rx.exchange.received(1)[ALICE.peer_id]
    assert got.stats == STATS and got.client == ALICE.peer_id and got.round == 1
    assert torch.equal(got.update.indices, update.indices) and torch.equal(got.update.values, update.values)
    assert rx.rejected() == {}


def test_default_chunks_stay_under_the_message_limit(tmp_path: Path) -> None:
    dense = encode(top_k(torch.randn(400_000), 400_000))  # 1.6 MB: over the 1 MiB message limit as one piece
    s = signer(tmp_path, ALICE)
    messages = [s.sign_chunk(b, 1) for b in update_chunks(dense, 0.5, 0.1, 8, 2, base=BASE)]
    assert len(messages) == 13 and all(len(m) < Limits().max_message_bytes for m in messages)
    with pytest.raises(ProtocolError) as err:  # one piece is refused at the sender
        s.sign_chunk(update_chunks(dense, 0.5, 0.1, 8, 2, chunk_bytes=len(dense), base=BASE)[0], 1)
    assert err.value.reason == "oversize"


def test_global_round_trip_and_wrong_aggregator(tmp_path: Path) -> None:
    delta = torch.zeros(SIZE)
    delta[::7] = 0.5
    payload = encode(sparse_of(delta))
    weights = {ALICE.peer_id: 0.75, BOB.peer_id: 0.25}
    bodies = global_chunks(payload, 0.4, 0.2, sorted(weights), [weights[c] for c in sorted(weights)], 4096, base=BASE)
    rx = Receiver(tmp_path, aggregator=ALICE.peer_id)
    forged = [signer(tmp_path, BOB).sign_chunk(b, 1) for b in bodies]
    assert all(rx.receive(m, "global") is None for m in forged)
    assert 1 not in rx.exchange.globals and rx.rejected() == {"wrong_aggregator": len(bodies)}
    for m in [signer(tmp_path, ALICE).sign_chunk(b, 1) for b in bodies]:
        assert rx.receive(m, "global") is None
    got = rx.exchange.globals[1]
    assert torch.equal(got.delta, delta) and got.weights == weights and got.stats == GlobalStats(0.4, 0.2)
    stats = rx.exchange.reassembler.statistics()
    assert stats.rejected_by_author == {BOB.peer_id: len(bodies)} and stats.completed == 1


def test_validator_limits_on_chunks(tmp_path: Path) -> None:
    payload = encode(an_update())
    rx = Receiver(tmp_path, max_update_chunks=4)
    messages = update_messages(signer(tmp_path, ALICE, max_update_chunks=4), payload)
    assert len(messages) > 4 and {rx.receive(m) for m in messages} == {"too_many_chunks"}
    rx = Receiver(tmp_path, max_update_bytes=4096)
    assert {rx.receive(m) for m in messages} == {"update_too_large"}
    # a message over max_message_bytes is dropped before decoding
    big = update_messages(signer(tmp_path, ALICE), encode(top_k(torch.randn(SIZE), SIZE)), chunk_bytes=200_000)
    rx = Receiver(tmp_path, max_message_bytes=65_536)
    assert rx.receive(big[0]) == "oversize"
    stats = rx.validator.statistics()
    assert stats.rejected_by_reason == {"oversize": 1}


def _resign(s: Signer, body: UpdateBody, **changes: Any) -> bytes:
    return s.sign_chunk(body.model_copy(update=changes), 1)


def test_hostile_chunks_get_reason_codes(tmp_path: Path) -> None:
    s = signer(tmp_path, ALICE)
    payload = encode(an_update())
    bodies = update_chunks(payload, STATS.mean, STATS.std, STATS.samples, STATS.groups, 4096, base=BASE)
    rx = Receiver(tmp_path)
    assert rx.receive(s.sign_chunk(bodies[0], 1)) is None
    assert rx.receive(s.sign_chunk(bodies[0], 1)) is None  # a fresh nonce: passes the replay check, not reassembly
    assert rx.receive(_resign(s, bodies[1], std=0.9)) is None  # statistics differ from the first chunk
    assert rx.receive(_resign(s, bodies[1], sha256=bytes(32))) is None
    assert rx.receive(_resign(s, bodies[1], base=bytes(32))) is None  # trained from other weights than chunk 0
    assert rx.rejected() == {"duplicate_chunk": 1, "chunk_mismatch": 3}

    # wrong hash: every chunk consistent, the whole does not match
    bad = update_chunks(payload, 0.1, 0.1, 1, 1, 4096, base=BASE)
    mallory = signer(tmp_path, BOB)
    for b in bad:
        body = b.model_copy(update={"sha256": hashlib.sha256(b"other").digest()})
        assert rx.receive(mallory.sign_chunk(body, 1)) is None
    assert rx.rejected()["bad_hash"] == 1 and BOB.peer_id not in rx.exchange.received(1)

    # decodes to nothing, or to a model of another size
    for garbage in (b"\x00" * 5000, encode(top_k(torch.randn(SIZE + 1), 10))):
        mallory = signer(tmp_path, Identity.generate())
        for m in update_messages(mallory, garbage):
            assert rx.receive(m) is None
    assert rx.rejected()["bad_update"] == 2
    by_author = rx.exchange.reassembler.statistics().rejected_by_author
    assert by_author[ALICE.peer_id] == 4 and by_author[BOB.peer_id] == 1
    # the rest of Alice's update completes it, and the exchange keeps the base it names
    for b in bodies[1:]:
        rx.receive(s.sign_chunk(b, 1))
    assert ALICE.peer_id in rx.exchange.received(1) and rx.exchange.bases[1] == {ALICE.peer_id: BASE}


def test_reassembly_rounds_sizes_and_buffer() -> None:
    payload = bytes(range(256)) * 40
    bodies = update_chunks(payload, 0.5, 0.1, 4, 1, chunk_bytes=1024, base=BASE)
    r = Reassembler(Limits(rounds_ahead=1), max_buffered_bytes=3000)
    r.advance(5)
    assert r.add("update", "a", 4, bodies[0]) is None and r.add("update", "a", 7, bodies[0]) is None
    # more bytes than announced
    liar = bodies[0].model_copy(update={"size": 1500})
    assert r.add("update", "b", 5, liar) is None
    assert r.add("update", "b", 5, liar.model_copy(update={"chunk": 1})) is None
    # the buffer bound: 3 x 1024 bytes do not fit in 3000
    assert r.add("update", "c", 5, bodies[0]) is None and r.add("update", "c", 5, bodies[1]) is None
    assert r.add("update", "c", 5, bodies[2]) is None
    assert r.statistics().rejected_by_reason == {
        "closed_round": 1, "future_round": 1, "size_mismatch": 1, "buffer_full": 1,
    }  # fmt: skip
    # closing the round frees the buffer; a complete update comes out once, a second copy is a duplicate
    r.advance(6)
    out = [r.add("update", "c", 6, bodies[0])]
    small = update_chunks(b"x" * 1500, 0.5, 0.1, 4, 1, chunk_bytes=1024, base=BASE)
    done = [r.add("update", "d", 6, b) for b in small]
    assert out == [None] and done[0] is None and done[1] is not None and done[1].payload == b"x" * 1500
    assert r.add("update", "d", 6, small[0]) is None
    assert r.statistics().rejected_by_reason["duplicate_update"] == 1 and r.statistics().completed == 1


@pytest.mark.parametrize(
    "change",
    [
        {"chunk": 3, "chunks": 3},  # chunk >= chunks
        {"mean": float("nan")},
        {"std": 1},  # an int where a float 64 is required
        {"sha256": b"\x00" * 31},
        {"base": b"\x00" * 33},
        {"data": b""},
        {"data": b"x" * 20, "size": 10},  # a chunk longer than the whole
        {"extra": 1},
    ],
)
def test_update_body_schema(tmp_path: Path, change: dict[str, Any]) -> None:
    body = update_chunks(b"x" * 100, 0.5, 0.1, 4, 1, base=BASE)[0]
    data = signer(tmp_path, ALICE).sign_chunk(body, 1)
    wire = msgpack.unpackb(data, raw=False)
    wire["body"] |= change
    verdict = validator().validate(msgpack.packb(wire, use_bin_type=True), expected_kind="update")
    assert not verdict.ok and verdict.reason == "schema"


def test_global_body_needs_one_weight_per_client() -> None:
    with pytest.raises(ValueError):
        GlobalBody(
            chunk=0, chunks=1, size=1, sha256=bytes(32), base=BASE, mean=0.0, std=0.0, clients=("a", "b"),
            weights=(1.0,), data=b"x",
        )  # fmt: skip
    wire: dict[str, Any] = {
        "chunk": 0, "chunks": 1, "size": 1, "sha256": bytes(32), "base": BASE, "mean": 0.0, "std": 0.0,
        "clients": ["a"], "weights": [1], "data": b"x",
    }  # fmt: skip
    with pytest.raises(ValueError):
        GlobalBody.model_validate(wire)


def test_chunk_on_the_wrong_topic(tmp_path: Path) -> None:
    data = update_messages(signer(tmp_path, ALICE), encode(an_update()))[0]
    assert validator().validate(data, expected_kind="global").reason == "wrong_kind"
    assert isinstance(decode(data).body, UpdateBody) and isinstance(decode(data), Envelope)


def test_publish_paces_chunks_through_the_transport(tmp_path: Path) -> None:
    sent: list[tuple[str, bytes]] = []

    async def publish(topic: str, data: bytes) -> None:
        sent.append((topic, data))

    ex = UpdateExchange(ALICE.peer_id, signer(tmp_path, ALICE), Reassembler(), SIZE, RUN, 4096, publish=publish)
    payload = encode(an_update())

    async def main() -> None:
        await ex.publish_update(2, STATS, payload, BASE)
        await ex.publish_global(2, GlobalStats(0.5, 0.1), {BOB.peer_id: 1.0}, payload, BASE)

    trio.run(main)
    chunks = -(-len(payload) // 4096)
    assert [t for t, _ in sent] == [update_topic(RUN)] * chunks + [global_topic(RUN)] * chunks
    assert ex.messages_sent == 2 * chunks and ex.bytes_sent == sum(len(d) for _, d in sent)
    assert all(decode(d).round == 2 for _, d in sent)
    assert split_payload(b"abc", 2) == [b"ab", b"c"]


def test_sparse_of_keeps_exactly_the_nonzero_entries() -> None:
    delta = torch.zeros(1000)
    delta[[3, 500, 999]] = torch.tensor([1.5, -2.0, 1e-30])
    update = sparse_of(delta)
    assert update.indices.tolist() == [3, 500, 999] and torch.equal(update.dense(), delta)
