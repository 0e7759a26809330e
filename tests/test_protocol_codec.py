"""The wire protocol: envelope codec, signatures, validation verdicts, nonces, replay state, identities."""

from __future__ import annotations

import random
import stat
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from dgrpo.errors import ConfigError, DgrpoError
from dgrpo.protocol.envelope import (
    Envelope,
    HeartbeatBody,
    ProtocolError,
    canonical_bytes,
    decode,
    encode,
    to_rollout,
    verify_signature,
)
from dgrpo.protocol.identity import Identity, IdentityError, base58btc, peer_id_from_public_bytes
from dgrpo.protocol.nonce import NonceCounter, NonceStateError
from dgrpo.protocol.replay import ReplayGuard, ReplayStateError
from dgrpo.protocol.topics import control_topic, rollout_topic, topic_kind
from dgrpo.protocol.validator import MessageValidator
from tests.protocol_helpers import (
    ALICE,
    BOB,
    RUN,
    T0,
    FakeClock,
    make_rollout,
    make_signer,
    pack,
    pack_wide,
    resign,
    unpack,
    validator,
)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


# ----------------------------------------------------------------------------- codec
def test_round_trip(tmp_path: Path, clock: FakeClock) -> None:
    signer = make_signer(tmp_path, clock)
    rollout = make_rollout()
    data = signer.sign_rollout(rollout)
    env = decode(data)
    assert (env.kind, env.run, env.round, env.author, env.ts) == ("rollout", RUN, 3, ALICE.public_bytes, int(T0 * 1000))
    assert verify_signature(env)
    assert encode(env) == data
    assert to_rollout(env) == rollout
    hb = HeartbeatBody(round=4, rounds_done=3, status="running", listen_addrs=("/ip4/127.0.0.1/tcp/4001",))
    hb_env = decode(signer.sign_heartbeat(hb, 4))
    assert hb_env.body == hb and hb_env.nonce > env.nonce and verify_signature(hb_env)
    verdict = validator(clock).validate(data, source_peer=ALICE.peer_id, expected_kind="rollout")
    assert verdict.ok and verdict.envelope == env and verdict.peer == ALICE.peer_id


def test_signer_refuses_foreign_author_and_oversize(tmp_path: Path, clock: FakeClock) -> None:
    with pytest.raises(ProtocolError, match="wrong_author"):
        make_signer(tmp_path, clock).sign_rollout(make_rollout(BOB))
    with pytest.raises(ProtocolError, match="oversize"):
        make_signer(tmp_path, clock, max_message_bytes=1024).sign_rollout(make_rollout(prompt="x" * 2000))


def _set(path: str, value: Any) -> Any:
    def mutate(wire: dict[str, Any]) -> None:
        *parents, last = path.split(".")
        target = wire
        for p in parents:
            target = target[p]
        if value is _DELETE:
            del target[last]
        else:
            target[last] = value(target[last]) if callable(value) else value

    return mutate


_DELETE = object()
SCHEMA_VIOLATIONS = {
    "int where float": _set("body.sampling.temperature", 1),
    "str where bytes": _set("author", lambda a: a.decode("latin-1")),
    "bytes where str": _set("run", RUN.encode()),
    "bool where int": _set("round", True),
    "bool version": _set("v", True),
    "negative round": _set("round", -1),
    "negative nonce": _set("nonce", -1),
    "31-byte author": _set("author", lambda a: a[:31]),
    "63-byte sig": _set("sig", lambda s: s[:63]),
    "kind/body mismatch": _set("kind", "heartbeat"),
    "unknown kind": _set("kind", "gradient"),
    "extra field": _set("extra", 1),
    "extra body field": _set("body.extra", 1),
    "missing field": _set("ts", _DELETE),
    "missing body field": _set("body.split", _DELETE),
    "missing sampling field": _set("body.sampling.seed", _DELETE),
    "int completion": _set("body.completions", [1]),
    "part >= parts": _set("body.part", 1),
    "bad split": _set("body.split", "diagonal"),
    "bad run id": _set("run", "a/b"),
    "nil body": _set("body", None),
}


@pytest.mark.parametrize("mutate", SCHEMA_VIOLATIONS.values(), ids=SCHEMA_VIOLATIONS.keys())
def test_schema_violations_are_rejected(tmp_path: Path, clock: FakeClock, mutate: Any) -> None:
    wire = unpack(make_signer(tmp_path, clock).sign_rollout(make_rollout()))
    mutate(wire)
    data = pack(wire)
    with pytest.raises(ProtocolError) as info:
        decode(data)
    assert info.value.reason == "schema"
    assert validator(clock).validate(data).reason == "schema"


def test_heartbeat_schema(tmp_path: Path, clock: FakeClock) -> None:
    signer = make_signer(tmp_path, clock)
    ok = HeartbeatBody(round=1, rounds_done=0, status="stopping", listen_addrs=())
    wire = unpack(signer.sign_heartbeat(ok, 1))
    for body in (
        {**wire["body"], "listen_addrs": ["/ip4/1.2.3.4/tcp/1"] * 9},
        {**wire["body"], "round": 2},  # differs from the envelope's round
        {**wire["body"], "status": "paused"},
    ):
        assert validator(clock).validate(pack({**wire, "body": body})).reason == "schema"
    with pytest.raises(ProtocolError, match="schema"):
        decode(signer.sign_heartbeat(ok, 2))


def test_version_run_kind(tmp_path: Path, clock: FakeClock) -> None:
    data = make_signer(tmp_path, clock).sign_rollout(make_rollout())
    assert validator(clock).validate(pack({**unpack(data), "v": 2})).reason == "unsupported_version"
    assert MessageValidator("other-run", clock=clock).validate(data).reason == "wrong_run"
    assert validator(clock).validate(data, expected_kind="heartbeat").reason == "wrong_kind"
    assert (rollout_topic(RUN), control_topic(RUN)) == ("/dgrpo/test-run/rollouts/1", "/dgrpo/test-run/control/1")
    assert (topic_kind(rollout_topic(RUN), RUN), topic_kind(control_topic(RUN), RUN)) == ("rollout", "heartbeat")
    for bad in ("", "a/b", "x" * 65, "run\n", "ü"):
        with pytest.raises(ConfigError, match="invalid run id"):
            rollout_topic(bad)


@pytest.mark.parametrize(
    ("rollout_fields", "limits", "reason"),
    [
        ({"prompt": "x" * 2000}, {"max_message_bytes": 1024}, "oversize"),
        ({"completions": ("a",) * 5}, {"max_completions": 4}, "too_many_completions"),
        ({"completions": ("a", "b" * 11)}, {"max_completion_chars": 10}, "completion_too_long"),
        ({"prompt": "é" * 11}, {"max_prompt_chars": 10}, "prompt_too_long"),  # characters, not bytes
        ({"model_id": "m" * 11}, {"max_string_chars": 10}, "string_too_long"),
    ],
)
def test_limits(tmp_path: Path, clock: FakeClock, rollout_fields: Any, limits: Any, reason: str) -> None:
    data = make_signer(tmp_path, clock).sign_rollout(make_rollout(**rollout_fields))
    assert validator(clock, **limits).validate(data).reason == reason
    assert validator(clock).validate(data).ok  # the default limits accept it


# ----------------------------------------------------------------------------- signatures and authors
def test_forged_signatures(tmp_path: Path, clock: FakeClock) -> None:
    data = make_signer(tmp_path, clock).sign_rollout(make_rollout(completions=("honest answer",)))
    i = data.index(b"honest answer")
    flipped_body = data[:i] + bytes([data[i] ^ 0x01]) + data[i + 1 :]  # still ASCII, so still valid msgpack
    flipped_sig = data[:-1] + bytes([data[-1] ^ 0x80])
    swapped_key = pack({**unpack(data), "author": BOB.public_bytes})
    for forged in (flipped_body, flipped_sig, swapped_key):
        assert validator(clock).validate(forged).reason == "bad_signature"


def test_wrong_author(tmp_path: Path, clock: FakeClock) -> None:
    data = make_signer(tmp_path, clock).sign_rollout(make_rollout())
    assert validator(clock).validate(data, source_peer=BOB.peer_id).reason == "wrong_author"
    # B re-publishes A's content under its own key: valid signature by B, but gossipsub says A sent it
    by_bob = resign({**unpack(data), "author": BOB.public_bytes}, BOB)
    assert validator(clock).validate(by_bob).ok
    assert validator(clock).validate(by_bob, source_peer=ALICE.peer_id).reason == "wrong_author"


# ----------------------------------------------------------------------------- replay
def test_replay_also_after_restart(tmp_path: Path, clock: FakeClock) -> None:
    signer = make_signer(tmp_path, clock)
    first, second = signer.sign_rollout(make_rollout()), signer.sign_rollout(make_rollout(part=0))
    v = validator(clock)
    assert v.validate(first).ok
    assert v.validate(first).reason == "replay"
    v.save_replay_state(tmp_path / "replay.json")
    restarted = validator(clock, ReplayGuard.load(tmp_path / "replay.json"))
    assert restarted.validate(first).reason == "replay"
    assert restarted.validate(second).ok


def test_reencoded_message_is_a_replay(tmp_path: Path, clock: FakeClock) -> None:
    data = make_signer(tmp_path, clock).sign_rollout(make_rollout())
    reencoded = pack_wide(unpack(data))
    assert reencoded != data and len(reencoded) > len(data)
    assert decode(reencoded) == decode(data)
    assert canonical_bytes(decode(reencoded)) == canonical_bytes(decode(data))
    assert verify_signature(decode(reencoded))
    v = validator(clock)
    assert v.validate(data).ok
    assert v.validate(reencoded).reason == "replay"
    assert validator(clock).validate(reencoded).ok  # on its own it is a valid message


def test_replay_window(tmp_path: Path, clock: FakeClock) -> None:
    signer = make_signer(tmp_path, clock)
    messages = [signer.sign_rollout(make_rollout()) for _ in range(6)]
    v = validator(clock, replay_window=3)
    assert v.validate(messages[3]).ok and v.validate(messages[1]).ok  # out of order within the window
    assert v.validate(messages[5]).ok
    assert v.validate(messages[2]).reason == "stale_nonce"  # 5 - 2 >= window
    assert v.validate(messages[4]).ok and v.validate(messages[4]).reason == "replay"


def test_replay_guard_unit(tmp_path: Path) -> None:
    g = ReplayGuard(4, max_authors=2)
    for n in (10, 8, 13):
        assert g.check("a", n) is None
        g.record("a", n)
    assert [g.check("a", n) for n in (13, 12, 10, 9, 8)] == ["replay", None, "replay", "stale_nonce", "stale_nonce"]
    g.record("b", 1)
    g.record("c", 10)  # evicts "a", the least recently seen
    assert g.highest("a") is None and len(g) == 2
    bigger = ReplayGuard.from_dict(g.to_dict(), window=8)
    # positions the old window did not cover count as seen; the ones it covered keep their state
    assert [bigger.check("c", n) for n in (10, 8, 5, 2)] == ["replay", None, "replay", "stale_nonce"]
    merged = ReplayGuard(4)
    merged.record("c", 12)
    merged.merge(ReplayGuard.from_dict({"version": 1, "window": 4, "authors": [["c", 10, "1"], ["d", 3, "1"]]}))
    assert [merged.check("c", n) for n in (12, 11, 10, 9, 8)] == ["replay", None, "replay", None, "stale_nonce"]
    assert merged.check("d", 3) == "replay"
    g.save(tmp_path / "r.json")
    assert ReplayGuard.load(tmp_path / "r.json").to_dict() == g.to_dict()
    (tmp_path / "bad.json").write_text('{"version": 1, "window": "x", "authors": []}')
    with pytest.raises(ReplayStateError):
        ReplayGuard.load(tmp_path / "bad.json")
    assert len(ReplayGuard.load_or_create(tmp_path / "missing.json")) == 0


# ----------------------------------------------------------------------------- time
def test_stale_and_future_timestamps(tmp_path: Path, clock: FakeClock) -> None:
    data = make_signer(tmp_path, clock).sign_rollout(make_rollout())
    for offset, reason in ((121.0, "stale"), (-121.0, "future"), (119.0, None)):
        later = FakeClock(T0 + offset)
        verdict = validator(later, clock_skew_seconds=120.0).validate(data)
        assert verdict.reason == reason


# ----------------------------------------------------------------------------- hostile bytes
def test_malformed_input_never_raises(tmp_path: Path, clock: FakeClock) -> None:
    data = make_signer(tmp_path, clock).sign_rollout(make_rollout())
    v = validator(clock)
    cases: list[Any] = [
        b"",
        pack(42),
        pack([1, 2]),
        b"\xdd\xff\xff\xff\xff",  # declares a 4-billion-element array
        b"\xdf\xff\xff\xff\xff",  # and a map
        b"\x91" * 100_000,  # deeply nested arrays
        data + b"\x00",  # trailing bytes
        b"\x81\xa1v\xa2\xff\xfe",  # invalid UTF-8
        b"\x82\xa1v\x01\xa1v\x01",  # duplicate key
        b"\x81\xc4\x01v\x01",  # bin map key
        b"\xc7\x01\x05x",  # ext type
        None,
        "a string",
    ]
    cases += [data[:n] for n in range(len(data))]  # every truncation
    rng = random.Random(0)
    cases += [rng.randbytes(rng.randint(1, 400)) for _ in range(300)]
    for case in cases:
        verdict = v.validate(case)
        assert not verdict.ok and verdict.reason in {"malformed", "schema", "unsupported_version"}, verdict.reason
    short: list[Any] = [data[:-1], pack(42), b"\xdd\xff\xff\xff\xff", None]
    assert all(v.validate(c).reason == "malformed" for c in short)
    assert v.validate(data).ok
    for _ in range(300):  # single-byte corruptions of a valid message are never accepted
        i = rng.randrange(len(data))
        corrupted = data[:i] + bytes([data[i] ^ (1 << rng.randrange(8))]) + data[i + 1 :]
        assert not v.validate(corrupted).ok
    assert v.statistics().accepted == 1


# ----------------------------------------------------------------------------- counters and blacklisting
def test_counters_by_reason_and_peer(tmp_path: Path, clock: FakeClock) -> None:
    data = make_signer(tmp_path, clock).sign_rollout(make_rollout())
    v = validator(clock)
    v.validate(b"junk")
    v.validate(b"junk", source_peer=BOB.peer_id)
    v.validate(data, source_peer=BOB.peer_id)  # wrong_author, attributed to the source
    v.validate(data[:-1] + bytes([data[-1] ^ 1]))  # bad_signature, attributed to the claimed author
    v.validate(data)
    v.validate(data)  # replay
    stats = v.statistics()
    assert stats.accepted == 1 and stats.rejected == 5
    assert dict(stats.rejected_by_reason) == {"malformed": 2, "wrong_author": 1, "bad_signature": 1, "replay": 1}
    assert dict(stats.rejected_by_peer) == {"unknown": 1, BOB.peer_id: 2, ALICE.peer_id: 2}
    assert dict(stats.penalties_by_peer) == {BOB.peer_id: 2}  # unauthenticated and benign rejections do not count
    with pytest.raises(TypeError):
        stats.rejected_by_reason["x"] = 1  # type: ignore[index]


def test_blacklist_after_n_rejections(tmp_path: Path, clock: FakeClock) -> None:
    v = validator(clock, blacklist_after=3)
    data = make_signer(tmp_path, clock).sign_rollout(make_rollout())
    for _ in range(5):
        v.validate(data, source_peer=ALICE.peer_id)  # accepted once, then replays: benign
        v.validate(data[:-1] + bytes([data[-1] ^ 1]))  # bad signature, source unknown: not authenticated
    assert not v.should_blacklist(ALICE.peer_id) and not v.should_blacklist("unknown")
    for n in range(1, 4):
        v.validate(b"junk", source_peer=BOB.peer_id)
        assert v.should_blacklist(BOB.peer_id) == (n >= 3)
    assert v.statistics().blacklist_candidates == (BOB.peer_id,)


def test_validator_is_thread_safe(tmp_path: Path, clock: FakeClock) -> None:
    signer = make_signer(tmp_path, clock)
    messages = [signer.sign_rollout(make_rollout()) for _ in range(40)]
    v = validator(clock)
    threads = [threading.Thread(target=lambda: [v.validate(m) for m in messages]) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    stats = v.statistics()
    assert (stats.accepted, stats.rejected_by_reason["replay"]) == (40, 200)


# ----------------------------------------------------------------------------- nonces
def test_nonce_counter_survives_crash(tmp_path: Path) -> None:
    path = tmp_path / "nonce.json"
    counter = NonceCounter(path, reserve=4)
    seen = [counter.next() for _ in range(6)]
    assert seen == sorted(set(seen)) and counter.peek() == seen[-1] + 1
    assert counter.reserved_upto >= seen[-1]  # persisted before it was handed out
    del counter  # a crash: nothing is flushed or closed
    assert NonceCounter(path).next() > max(seen)
    script = "import os,signal,sys\nfrom dgrpo.protocol.nonce import NonceCounter\nc = NonceCounter(sys.argv[1], 3)\n"
    script += "print(*[c.next() for _ in range(5)], flush=True)\nos.kill(os.getpid(), signal.SIGKILL)\n"
    proc = subprocess.run([sys.executable, "-c", script, str(path)], capture_output=True, text=True)
    assert proc.returncode == -9
    killed = [int(x) for x in proc.stdout.split()]
    assert min(killed) > max(seen) and NonceCounter(path).next() > max(killed)


def test_nonce_counter_ignores_a_clock_going_backwards(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "nonce.json"
    first = NonceCounter(path).next()
    assert first > 1_600_000_000 * 10**6  # starts at the clock, in microseconds
    monkeypatch.setattr("dgrpo.protocol.nonce._now_micros", lambda: 5)
    assert NonceCounter(path).next() > first
    path.write_text("{not json")
    with pytest.raises(NonceStateError, match="corrupt"):
        NonceCounter(path)


# ----------------------------------------------------------------------------- identity
def test_identity_save_load(tmp_path: Path) -> None:
    path = tmp_path / "id.pem"
    ident = Identity.generate()
    ident.save(path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert path.read_bytes().startswith(b"-----BEGIN PRIVATE KEY-----")
    assert Identity.load(path) == ident and Identity.load(path).peer_id == ident.peer_id
    with pytest.raises(IdentityError, match="exists"):
        Identity.generate().save(path)
    other = Identity.generate()
    other.save(path, overwrite=True)
    assert Identity.load(path) == other
    assert [p.name for p in tmp_path.iterdir()] == ["id.pem"]  # no temp files left behind
    with pytest.raises(IdentityError, match="does not exist"):
        Identity.load(tmp_path / "missing.pem")
    (tmp_path / "bad.pem").write_text("garbage")
    with pytest.raises(IdentityError, match="not an unencrypted PEM"):
        Identity.load(tmp_path / "bad.pem")
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    ec_pem = ec.generate_private_key(ec.SECP256R1()).private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    (tmp_path / "ec.pem").write_bytes(ec_pem)
    with pytest.raises(IdentityError, match="not an Ed25519 key"):
        Identity.load(tmp_path / "ec.pem")
    assert issubclass(IdentityError, DgrpoError) and issubclass(ProtocolError, DgrpoError)


@pytest.mark.parametrize("seed", [bytes(32), bytes(range(32)), bytes([255]) * 32])
def test_peer_id_matches_libp2p(seed: bytes) -> None:
    from libp2p.peer.id import ID

    ident = Identity.from_seed(seed)
    keypair = ident.to_libp2p_keypair()
    assert keypair.public_key.to_bytes() == ident.public_bytes
    assert (
        ident.peer_id == ID.from_pubkey(keypair.public_key).to_base58() == peer_id_from_public_bytes(ident.public_bytes)
    )
    assert ident.peer_id.startswith("12D3KooW")


def test_base58() -> None:
    assert base58btc(b"") == "" and base58btc(b"\x00\x00\x01") == "112"
    assert base58btc(b"hello world") == "StV1DL6CwTryKyV"


def test_envelope_is_frozen(tmp_path: Path, clock: FakeClock) -> None:
    env = decode(make_signer(tmp_path, clock).sign_rollout(make_rollout()))
    with pytest.raises(Exception, match="frozen"):
        env.round = 4  # type: ignore[misc]
    assert isinstance(env, Envelope)
