"""Equivocation: one author signs two contents under one nonce. The first is accepted, the second rejected as
``equivocation`` (not a benign replay) and the author flagged for blacklisting at once."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from dgrpo.net.memory import InMemoryNetwork, simulated_identity
from dgrpo.protocol.chunks import global_chunks, update_chunks
from dgrpo.protocol.envelope import HeartbeatBody, Signer, content_digest, decode
from dgrpo.protocol.identity import Identity
from dgrpo.protocol.replay import DIGEST_BYTES, ReplayGuard, ReplayStateError
from dgrpo.protocol.validator import BENIGN_REASONS, REASONS
from tests.protocol_helpers import (
    ALICE,
    BOB,
    RUN,
    FakeClock,
    make_rollout,
    memory_signer,
    pack,
    pack_wide,
    resign,
    unpack,
    validator,
)

NONCE = 1_000


class SameNonce:
    """A broken (or malicious) nonce source: always the same value."""

    def __init__(self, value: int = NONCE) -> None:
        self.value = value

    def next(self) -> int:
        return self.value


def equivocating_signer(clock: FakeClock, ident: Identity = ALICE) -> Signer:
    return memory_signer(clock, ident, nonces=SameNonce())


def two_rollouts(clock: FakeClock) -> tuple[bytes, bytes]:
    signer = equivocating_signer(clock)
    first = signer.sign_rollout(make_rollout(completions=("2", "3")))
    second = signer.sign_rollout(make_rollout(completions=("2", "4")))
    assert decode(first).nonce == decode(second).nonce == NONCE and first != second
    return first, second


def test_reason_order_and_policy() -> None:
    assert REASONS.index("equivocation") == REASONS.index("replay") + 1
    assert "equivocation" not in BENIGN_REASONS


@pytest.mark.parametrize("source", [ALICE.peer_id, None], ids=["gossipsub-source", "no-source"])
def test_same_nonce_other_content_is_equivocation(source: str | None) -> None:
    clock = FakeClock()
    first, second = two_rollouts(clock)
    v = validator(clock)  # blacklist_after stays at its default (20): one equivocation must be enough
    assert v.validate(first, source_peer=source).ok
    verdict = v.validate(second, source_peer=source)
    assert (verdict.ok, verdict.reason, verdict.peer) == (False, "equivocation", ALICE.peer_id)
    assert v.should_blacklist(ALICE.peer_id)
    stats = v.statistics()
    assert stats.accepted == 1 and stats.equivocators == (ALICE.peer_id,)
    assert stats.blacklist_candidates == (ALICE.peer_id,) and dict(stats.penalties_by_peer) == {ALICE.peer_id: 1}
    # The first one re-delivered is still a plain replay; the second one again is still equivocation.
    assert v.validate(first, source_peer=source).reason == "replay"
    assert v.validate(second, source_peer=source).reason == "equivocation"
    assert v.statistics().accepted == 1 and dict(v.statistics().rejected_by_reason) == {
        "equivocation": 2,
        "replay": 1,
    }


def test_second_arrival_order_does_not_matter() -> None:
    clock = FakeClock()
    first, second = two_rollouts(clock)
    v = validator(clock)
    assert v.validate(second).ok and v.validate(first).reason == "equivocation"
    assert v.statistics().equivocators == (ALICE.peer_id,)


def test_same_bytes_twice_is_a_replay_not_flagged() -> None:
    clock = FakeClock()
    first, _ = two_rollouts(clock)
    v = validator(clock, blacklist_after=1)
    assert v.validate(first, source_peer=ALICE.peer_id).ok
    for _ in range(5):
        assert v.validate(first, source_peer=ALICE.peer_id).reason == "replay"
    assert not v.should_blacklist(ALICE.peer_id)
    stats = v.statistics()
    assert stats.equivocators == () and stats.blacklist_candidates == () and dict(stats.penalties_by_peer) == {}


def test_reencoded_same_content_is_a_replay() -> None:
    clock = FakeClock()
    first, _ = two_rollouts(clock)
    reencoded = pack_wide(unpack(first))
    assert reencoded != first and content_digest(decode(reencoded)) == content_digest(decode(first))
    v = validator(clock)
    assert v.validate(first).ok
    assert v.validate(reencoded).reason == "replay"
    assert v.statistics().equivocators == () and not v.should_blacklist(ALICE.peer_id)


def test_equivocation_detected_across_a_restart(tmp_path: Path) -> None:
    clock = FakeClock()
    first, second = two_rollouts(clock)
    v = validator(clock)
    assert v.validate(first).ok
    v.save_replay_state(tmp_path / "replay.json")
    restarted = validator(clock, ReplayGuard.load(tmp_path / "replay.json"))
    assert restarted.validate(first).reason == "replay"
    assert restarted.validate(second).reason == "equivocation"
    assert restarted.should_blacklist(ALICE.peer_id)


def test_state_without_digests_loads_and_treats_them_as_unknown(tmp_path: Path) -> None:
    clock = FakeClock()
    first, second = two_rollouts(clock)
    v = validator(clock)
    assert v.validate(first).ok
    state: dict[str, Any] = v.replay.to_dict()
    assert len(state["digests"]) == 1
    del state["digests"]  # as written before digests existed
    (tmp_path / "old.json").write_text(json.dumps(state))
    restarted = validator(clock, ReplayGuard.load(tmp_path / "old.json"))
    assert restarted.validate(second).reason == "replay"  # unknown content: a replay, nothing proved
    assert restarted.validate(first).reason == "replay"
    assert restarted.statistics().equivocators == () and not restarted.should_blacklist(ALICE.peer_id)


def test_a_forged_second_message_does_not_flag_the_author() -> None:
    clock = FakeClock()
    first, second = two_rollouts(clock)
    wire = unpack(second)
    flipped = pack({**wire, "sig": bytes([wire["sig"][0] ^ 1]) + wire["sig"][1:]})
    by_bob = resign(wire, BOB)  # BOB signs other content in ALICE's name (author unchanged)
    assert unpack(by_bob)["author"] == ALICE.public_bytes
    v = validator(clock)
    assert v.validate(first).ok
    for forged in (flipped, by_bob):
        assert v.validate(forged).reason == "bad_signature"  # no source: unauthenticated, counted only
        assert v.validate(forged, source_peer=BOB.peer_id).reason == "bad_signature"  # BOB published it
    assert not v.should_blacklist(ALICE.peer_id)
    stats = v.statistics()
    assert stats.equivocators == () and ALICE.peer_id not in stats.penalties_by_peer
    assert dict(stats.penalties_by_peer) == {BOB.peer_id: 2}  # penalised: the forger, as gossipsub's source
    # The genuine second message is still caught afterwards: the forgeries recorded nothing.
    assert v.validate(second).reason == "equivocation"


def test_heartbeats_equivocate_too() -> None:
    clock = FakeClock()
    signer = equivocating_signer(clock)
    running = signer.sign_heartbeat(HeartbeatBody(round=4, rounds_done=3, status="running", listen_addrs=()), 4)
    stopping = signer.sign_heartbeat(HeartbeatBody(round=4, rounds_done=3, status="stopping", listen_addrs=()), 4)
    v = validator(clock)
    assert v.validate(running, expected_kind="heartbeat").ok
    assert v.validate(stopping, expected_kind="heartbeat").reason == "equivocation"


@pytest.mark.parametrize("kind", ["update", "global"])
def test_federated_chunks_go_through_the_same_check(kind: str) -> None:
    clock = FakeClock()
    signer = equivocating_signer(clock)
    base = bytes(32)

    def chunk(payload: bytes) -> bytes:
        if kind == "update":
            body: Any = update_chunks(payload, 0.5, 0.1, 8, 2, base=base)[0]
        else:
            body = global_chunks(payload, 0.5, 0.1, (BOB.peer_id,), (1.0,), base=base)[0]
        return signer.sign_chunk(body, round=3)

    honest, other = chunk(b"\x01" * 64), chunk(b"\x02" * 64)
    v = validator(clock)
    assert v.validate(honest, expected_kind=kind).ok
    assert v.validate(honest, expected_kind=kind).reason == "replay"
    assert v.validate(other, expected_kind=kind).reason == "equivocation"
    assert v.should_blacklist(ALICE.peer_id)


def test_memory_transport_reports_equivocators() -> None:
    network = InMemoryNetwork(RUN)
    receiver = network.join("a")
    network.join("b")
    signer = Signer(simulated_identity(RUN, "b"), RUN, SameNonce(), name="b")  # the real clock, as the receiver's
    for completions in (("2", "3"), ("2", "4")):
        receiver.receive(signer.sign_rollout(make_rollout(author="b", completions=completions)))
    stats = receiver.statistics()
    assert stats.accepted == 1 and stats.equivocating_peers == ("b",)


# ----------------------------------------------------------------------------- the guard's digest state
def test_guard_digests_bounded_persisted_and_merged(tmp_path: Path) -> None:
    d = [bytes([i]) * DIGEST_BYTES for i in range(4)]
    g = ReplayGuard(8, max_digests=2)
    for nonce, digest in zip((1, 2, 3), d, strict=False):
        assert g.check("a", nonce, digest) is None
        g.record("a", nonce, digest)
    assert g.digest("a", 1) is None and g.digest("a", 3) == d[2]  # the oldest digest was forgotten
    assert g.check("a", 3, d[2]) == "replay" and g.check("a", 3, d[3]) == "equivocation"
    assert g.check("a", 1, d[3]) == "replay"  # digest forgotten: nothing proved
    assert g.check("a", 3) == "replay"  # no digest given: the window alone decides
    g.save(tmp_path / "r.json")
    loaded = ReplayGuard.load(tmp_path / "r.json")
    assert loaded.to_dict() == g.to_dict() and loaded.check("a", 3, d[3]) == "equivocation"
    assert ReplayGuard.load(tmp_path / "r.json", max_digests=1).digest("a", 2) is None  # trimmed oldest first
    merged = ReplayGuard(8)
    merged.record("a", 3, d[0])  # a conflicting digest of our own wins over the saved copy's
    merged.merge(loaded)
    assert merged.digest("a", 2) == d[1] and merged.digest("a", 3) == d[0]
    for bad in ([["a", 1, "zz"]], [["a", -1, d[0].hex()]], [["a", 1, "00"]], "x"):
        with pytest.raises(ReplayStateError):
            ReplayGuard.from_dict({"version": 1, "window": 8, "authors": [], "digests": bad})
    # A known digest is evidence even outside the window: the author really signed it.
    g2 = ReplayGuard(2)
    g2.record("a", 1, d[0])
    g2.record("a", 10, d[1])
    assert g2.check("a", 1, d[0]) == "stale_nonce" and g2.check("a", 1, d[1]) == "equivocation"


def test_the_guard_can_be_saved_while_nonces_are_recorded() -> None:
    """A daemon writes its checkpoint (``to_dict``) in a worker thread while the validator records nonces: before
    the guard had its own lock, that raised ``OrderedDict mutated during iteration`` and killed a daemon."""
    import threading

    guard = ReplayGuard(window=256, max_digests=4096)
    for n in range(4096):
        guard.record(f"peer-{n % 50}", n, n.to_bytes(16, "big"))
    errors: list[BaseException] = []
    stop = threading.Event()

    def save_repeatedly() -> None:
        try:
            while not stop.is_set():
                guard.to_dict()
        except BaseException as exc:  # the failure this test is about
            errors.append(exc)

    saver = threading.Thread(target=save_repeatedly)
    saver.start()
    try:
        for n in range(4096, 4096 + 60_000):
            guard.record(f"peer-{n % 50}", n, n.to_bytes(16, "big"))
    finally:
        stop.set()
        saver.join()
    assert errors == []
    assert len(guard.to_dict()["digests"]) == 4096
