"""docs/protocol.md "NAT traversal and discovery" must describe the code: its settings and fixed values, the
protocols a node serves, the defaults quoted in its prose, and its test vectors (AutoNAT request, circuit
address, heartbeat announcing a circuit), each recomputed here from the code and from the document's own rules."""

from __future__ import annotations

import ast
import hashlib
import importlib
import inspect
import itertools
import re
from typing import Any

import msgpack
import pytest
import trio
from pydantic import BaseModel

from dgrpo.net.gossip_config import GossipConfig
from dgrpo.net.traversal_config import RelayLimitsConfig, TraversalConfig
from dgrpo.protocol.envelope import (
    DOMAIN_TAG,
    MAX_LISTEN_ADDRS,
    Envelope,
    HeartbeatBody,
    UnsignedEnvelope,
    canonical_bytes,
    encode,
    verify_signature,
)
from dgrpo.protocol.identity import Identity
from dgrpo.protocol.limits import Limits
from dgrpo.protocol.validator import MessageValidator
from tests.test_protocol_doc import DOC, code_block_after, table_after

SECTION = "## NAT traversal and discovery"
PEER = Identity.from_seed(bytes(range(32)))  # the node of "Author and peer id"


@pytest.fixture(scope="module")
def doc() -> str:
    return DOC.read_text(encoding="utf-8")


@pytest.fixture(scope="module")
def section(doc: str) -> str:
    start = doc.index(f"\n{SECTION}\n")
    end = doc.index("\n## ", start + 1)
    return doc[start:end]


def _words(text: str) -> str:
    """The text with every run of whitespace as one space (prose wraps anywhere)."""
    return " ".join(text.split())


def _kv_block(doc: str, name: str, value_words: bool = False) -> dict[str, str]:
    """A vector block of ``key value`` lines: the value is the last word, or every word after the first."""
    match = re.search(rf"<!-- test-vector: {name} -->\n```\n(.*?)```", doc, re.S)
    assert match, f"no test vector {name!r}"
    out: dict[str, str] = {}
    for line in match.group(1).splitlines():
        key, _, value = line.partition(" ") if value_words else line.rpartition(" ")
        assert key not in out, f"{name}: {key!r} twice"
        out[key] = value
    return out


def _literal(cell: str) -> Any:
    return ast.literal_eval(cell)


# ------------------------------------------------------------------------------ settings and fixed values
@pytest.mark.parametrize(
    ("heading", "model", "skip"),
    [("### Traversal settings", TraversalConfig, {"relay_limits"}), ("### Relay limits", RelayLimitsConfig, set())],
)
def test_settings_tables(doc: str, heading: str, model: type[BaseModel], skip: set[str]) -> None:
    rows = table_after(doc, heading, ["setting", "default", "notes"])
    assert [r[0] for r in rows] == [f for f in model.model_fields if f not in skip], heading
    defaults = model()
    for name, cell, _ in rows:
        value = getattr(defaults, name)
        assert _literal(cell) == value and type(_literal(cell)) is type(value), (name, cell, value)


def _fixed_value(name: str) -> Any:
    """``package.module.NAME``, or ``package.module.callable(parameter)`` for a parameter's default."""
    path, _, parameter = name.partition("(")
    parts = path.split(".")
    for i in range(len(parts) - 1, 0, -1):  # the longest importable prefix, then attributes
        try:
            value: Any = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        for attr in parts[i:]:
            value = getattr(value, attr)
        break
    if parameter:
        return inspect.signature(value).parameters[parameter.rstrip(")")].default
    return value


def test_fixed_values(doc: str) -> None:
    rows = table_after(doc, "### Fixed values", ["name", "value", "meaning"])
    assert len(rows) >= 10
    for name, cell, _ in rows:
        value = _fixed_value(name.strip("`"))
        assert _literal(cell) == value and type(_literal(cell)) is type(value), (name, cell, value)


def test_defaults_quoted_in_prose(section: str) -> None:
    """Every "`setting` (value" in the section is that setting's default (traversal, relay, gossip, limits)."""
    models: list[BaseModel] = [TraversalConfig(), RelayLimitsConfig(), GossipConfig(), Limits()]
    quoted = re.findall(r"`(\w+)` \(([\w.]+)[\s;)]", section)
    checked = set()
    for name, cell in quoted:
        owner = next((m for m in models if name in type(m).model_fields), None)
        if owner is None:
            continue
        value = getattr(owner, name)
        assert _literal(cell) == value, f"`{name}` ({cell} ...) but the default is {value!r}"
        checked.add(name)
    assert len(checked) >= 15, sorted(checked)


def test_fixed_values_quoted_in_prose(section: str) -> None:
    from libp2p.host.observed_addr_manager import ACTIVATION_THRESHOLD
    from libp2p.relay.circuit_v2 import dcutr

    from dgrpo.net.relay import RENEW_BEFORE_SECONDS
    from dgrpo.net.traversal import MAX_AUTONAT_SERVERS, UNKNOWN_RECHECK_SECONDS

    text = _words(section)
    assert f"every {UNKNOWN_RECHECK_SECONDS:g} s while its reachability is unknown, a node asks up to" in text
    assert f"asks up to {MAX_AUTONAT_SERVERS} servers" in text
    assert f"renews a slot {RENEW_BEFORE_SECONDS} s before it expires" in text
    assert f"the first {MAX_LISTEN_ADDRS} (`MAX_LISTEN_ADDRS`)" in text
    assert f"at least {ACTIVATION_THRESHOLD} distinct peers observed it" in text
    assert f"at most {dcutr.MAX_HOLE_PUNCH_ATTEMPTS} sessions per peer" in text
    assert f"at most {dcutr.MAX_OBSERVED_ADDRS}." in text
    assert f"rounds of {dcutr._HOLE_PUNCH_ROUND_TIMEOUT:g} s, 2 s apart" in text
    from dgrpo.net.traversal_config import TraversalConfig

    grace = TraversalConfig().relayed_grace_seconds
    assert f"`relayed_grace_seconds` ({grace:g} s; py-libp2p's own is {dcutr.RELAY_CLOSE_GRACE_PERIOD:g}) later" in text
    loop = inspect.getsource(dcutr.DCUtRProtocol._auto_drive_loop)
    assert "await trio.sleep(2.0)" in loop and "Every 2 s a node looks at the peers" in text
    assert "min(max(rtt / 2.0, 0.0), 2.0)" in inspect.getsource(dcutr.DCUtRProtocol._initiate_hole_punch_locked)
    assert "(at most 2 s)" in text
    # py-libp2p's own dialers, turned off (tests/test_own_dialers.py shows it on real hosts)
    from libp2p.pubsub.gossipsub import GossipSub

    from dgrpo.net.own_dialers import ROUTER_OPTIONS

    assert ROUTER_OPTIONS["px_peers_count"] == 0 and "px_peers_count: int = 16" in inspect.getsource(GossipSub)
    assert "dgrpo turns both off" in text and "(16) peers that a `PRUNE` it receives names" in text


# ------------------------------------------------------------------------------ protocols a node serves
def _documented_protocols(doc: str) -> set[str]:
    rows = table_after(doc, "<!-- traversal-protocols -->", ["protocol id", "protocol", "a dgrpo node"])
    return {r[0].strip("`") for r in rows}


def test_protocol_ids_are_the_packages(doc: str) -> None:
    from libp2p.host.autonat.autonat import AUTONAT_PROTOCOL_ID
    from libp2p.host.ping import ID as PING_ID
    from libp2p.identity.identify.identify import ID as IDENTIFY_ID
    from libp2p.identity.identify_push.identify_push import ID_PUSH
    from libp2p.relay.circuit_v2.dcutr import PROTOCOL_ID as DCUTR_ID
    from libp2p.relay.circuit_v2.protocol import PROTOCOL_ID as HOP_ID
    from libp2p.relay.circuit_v2.protocol import STOP_PROTOCOL_ID

    ids = {IDENTIFY_ID, ID_PUSH, PING_ID, AUTONAT_PROTOCOL_ID, HOP_ID, STOP_PROTOCOL_ID, DCUTR_ID}
    assert _documented_protocols(doc) == {str(i) for i in ids}


async def _served(config: TraversalConfig) -> tuple[set[str], list[str], list[str]]:
    """What a node serves besides gossipsub, its announced addresses with one slot injected, and without."""
    from dgrpo.net.gossip import GossipNode
    from dgrpo.net.relay import Slot

    relay = _relay_identity().peer_id
    listen = GossipConfig(listen="/ip4/127.0.0.1/tcp/0", shutdown_flush_timeout=0.0)
    async with GossipNode.open(listen, PEER.to_libp2p_keypair(), config) as node:
        if node.traversal.dcutr is not None:  # it registers its handler once its service runs
            await node.traversal.dcutr.event_started.wait()
        served = {str(p) for p in node._host.get_mux().get_protocols() if not str(p).startswith("/meshsub/")}
        plain = node.listen_addrs()
        # no checkpoint between these lines: the relay loop cannot drop the slot before it is announced
        node.traversal.client.slots[relay] = Slot(relay, ("/ip4/203.0.113.1/tcp/4001",), 2e9, 0)
        with_slot = node.listen_addrs()
        del node.traversal.client.slots[relay]
        return served, plain, with_slot


def _relay_identity() -> Identity:
    return Identity.from_seed(bytes(range(32, 64)))


def test_a_node_serves_the_documented_protocols_and_announces_circuits_first(doc: str) -> None:
    from libp2p.relay.circuit_v2.protocol import PROTOCOL_ID as HOP_ID

    announce = "/ip4/198.51.100.7/tcp/4001"
    served, plain, with_slot = trio.run(_served, TraversalConfig(relay_service=True, announce=(announce,)))
    assert served == _documented_protocols(doc)
    served_plain, _, _ = trio.run(_served, TraversalConfig())
    assert served_plain == served - {str(HOP_ID)}, "hop must be served only with relay_service"
    # "Announced addresses": circuits first, then the bound listen addresses, then `announce` with /p2p
    circuit = _kv_block(doc, "circuit-address")["text"]
    assert with_slot == [circuit, *plain]
    assert plain[-1] == f"{announce}/p2p/{PEER.peer_id}" and plain[0].startswith("/ip4/127.0.0.1/tcp/")
    assert all(a.endswith(f"/p2p/{PEER.peer_id}") for a in with_slot)


# ------------------------------------------------------------------------------ the circuit address
def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _peer_id_bytes(ident: Identity) -> bytes:
    return bytes([0x00, 0x24, 0x08, 0x01, 0x12, 0x20]) + ident.public_bytes


def test_circuit_address_vector(doc: str) -> None:
    from libp2p.peer.peerinfo import info_from_p2p_addr
    from multiaddr import Multiaddr

    v = _kv_block(doc, "circuit-address")
    relay = Identity.from_seed(bytes.fromhex(v["relay seed"]))
    assert relay.public_bytes.hex() == v["relay key"] and relay.peer_id == v["relay id"] == _relay_identity().peer_id
    assert v["peer id"] == PEER.peer_id
    text = f"/ip4/203.0.113.1/tcp/4001/p2p/{relay.peer_id}/p2p-circuit/p2p/{PEER.peer_id}"
    assert v["text"] == text and v["characters"] == str(len(text))
    binary = Multiaddr(text).to_bytes()
    assert v["hex"] == binary.hex() and v["bytes"] == str(len(binary))
    # the document's reading of it, byte by byte (multiaddr codes: ip4 4, tcp 6, p2p 421, p2p-circuit 290)
    by_hand = bytes([4, 203, 0, 113, 1]) + _varint(6) + (4001).to_bytes(2, "big")
    by_hand += _varint(421) + _varint(38) + _peer_id_bytes(relay) + _varint(290)
    by_hand += _varint(421) + _varint(38) + _peer_id_bytes(PEER)
    assert by_hand == binary
    assert _varint(421) == bytes.fromhex("a503") and _varint(290) == bytes.fromhex("a202")
    assert "`a5 03` (`p2p`, code 421" in _words(doc) and "`a2 02` (`p2p-circuit`, code 290" in _words(doc)
    assert info_from_p2p_addr(Multiaddr(text)).peer_id.to_base58() == PEER.peer_id  # it names the node, not the relay
    assert len(text) <= Limits().max_string_chars


# ------------------------------------------------------------------------------ the heartbeat
DIRECT = f"/ip4/192.168.1.20/tcp/4001/p2p/{PEER.peer_id}"
NONCE, TS = 1_700_000_000_000_001, 1_700_000_000_500


def _heartbeat(addrs: tuple[str, ...]) -> UnsignedEnvelope:
    body = HeartbeatBody(round=7, rounds_done=6, status="running", listen_addrs=addrs)
    return UnsignedEnvelope(
        v=1, kind="heartbeat", run="demo-run", round=7, author=PEER.public_bytes, nonce=NONCE, ts=TS, body=body
    )


def _validator() -> MessageValidator:
    return MessageValidator("demo-run", clock=lambda: TS / 1000)


def _signed(unsigned: UnsignedEnvelope) -> bytes:
    fields: dict[str, Any] = {name: getattr(unsigned, name) for name in UnsignedEnvelope.model_fields}
    return encode(Envelope(**fields, sig=PEER.sign(canonical_bytes(unsigned))))


def test_heartbeat_vector(doc: str) -> None:
    circuit = _kv_block(doc, "circuit-address")["text"]
    assert DIRECT in doc and f"(nonce {NONCE}, ts {TS}," in _words(doc)
    unsigned = _heartbeat((circuit, DIRECT))
    canonical = canonical_bytes(unsigned)
    assert code_block_after(doc, "<!-- test-vector: heartbeat-nat-canonical -->") == canonical.hex()
    assert f'("Canonical signing bytes"; {len(canonical)} bytes, hex)' in _words(doc)
    # the document's reading of the body: an array of 4, two str 8 addresses
    assert f"`d9 {len(circuit):02x}` (str 8, {len(circuit)} bytes)" in doc
    assert f"`d9 {len(DIRECT):02x}` ({len(DIRECT)} bytes)" in doc
    tail = bytes([0x94, 7, 6, 0xA7]) + b"running" + bytes([0x92, 0xD9, len(circuit)]) + circuit.encode()
    tail += bytes([0xD9, len(DIRECT)]) + DIRECT.encode()
    assert canonical.startswith(DOMAIN_TAG) and canonical.endswith(tail)
    v = _kv_block(doc, "heartbeat-nat")
    assert v["sha256"] == hashlib.sha256(canonical).hexdigest()
    assert v["signature"] == PEER.sign(canonical).hex()
    wire = _signed(unsigned)
    verdict = _validator().validate(wire, source_peer=PEER.peer_id, expected_kind="heartbeat")
    assert verdict.ok, verdict.reason
    assert verdict.envelope is not None and verify_signature(verdict.envelope)


def test_heartbeat_address_bounds_as_documented(doc: str) -> None:
    """At most 8 entries (more is `schema`), each at most max_string_chars (more is `string_too_long`)."""
    text = _words(doc)
    cap = Limits().max_string_chars
    bounds = f"Each is at most `max_string_chars` ({cap}) characters (`string_too_long`); more than {MAX_LISTEN_ADDRS}"
    assert f"{bounds} entries is `schema`" in text
    too_long = _signed(_heartbeat(("/ip4/10.0.0.1/tcp/1/p2p/" + "x" * cap,)))
    assert _validator().validate(too_long, PEER.peer_id, "heartbeat").reason == "string_too_long"
    at_cap = _signed(_heartbeat((DIRECT + "x" * (cap - len(DIRECT)),)))
    assert _validator().validate(at_cap, PEER.peer_id, "heartbeat").ok
    nine = [DIRECT] * (MAX_LISTEN_ADDRS + 1)
    body = [7, 6, "running", nine]
    canonical = DOMAIN_TAG + msgpack.packb([1, "heartbeat", "demo-run", 7, PEER.public_bytes, NONCE, TS, body])
    wire = msgpack.packb(
        {
            "v": 1, "kind": "heartbeat", "run": "demo-run", "round": 7, "author": PEER.public_bytes, "nonce": NONCE,
            "ts": TS, "body": {"round": 7, "rounds_done": 6, "status": "running", "listen_addrs": nine},
            "sig": PEER.sign(canonical),
        }
    )  # fmt: skip
    assert _validator().validate(wire, PEER.peer_id, "heartbeat").reason == "schema"


# ------------------------------------------------------------------------------ reachability
def test_autonat_request_vector(doc: str) -> None:
    from libp2p.host.autonat.pb.autonat_pb2 import Message
    from libp2p.peer.id import ID
    from libp2p.utils.varint import encode_varint_prefixed
    from multiaddr import Multiaddr

    from dgrpo.net.reachability import dial_back_candidates

    v = _kv_block(doc, "autonat-dial", value_words=True)
    addrs = dial_back_candidates([Multiaddr(v["listen"])], [Multiaddr(v["observed"])])
    assert " ".join(map(str, addrs)) == v["addrs"]
    request = Message()  # as AutoNATService.query_server builds it
    request.type = Message.DIAL
    request.dial.peer.id = ID.from_base58(PEER.peer_id).to_bytes()
    for addr in addrs:
        request.dial.peer.addrs.append(addr.to_bytes())
    wire = encode_varint_prefixed(request.SerializeToString())
    assert v["request"] == wire.hex()
    # the document's reading of it
    inner = [b"\x12" + _varint(len(a.to_bytes())) + a.to_bytes() for a in addrs]
    peer = b"\x0a" + _varint(38) + _peer_id_bytes(PEER) + b"".join(inner)
    dial = b"\x0a" + _varint(len(peer)) + peer
    message = b"\x08\x00" + b"\x12" + _varint(len(dial)) + dial
    assert wire == _varint(len(message)) + message
    assert f"`{wire[0]:02x}` the length ({len(message)})" in doc


def test_autonat_verdicts(doc: str) -> None:
    from libp2p.host.autonat.pb.autonat_pb2 import Message

    from dgrpo.net.reachability import Reachability

    rows = table_after(doc, "<!-- autonat-verdicts -->", ["status", "code", "counts as"])
    assert {r[0] for r in rows} == set(Message.ResponseStatus.keys())
    for status, code, counts in rows:
        assert Message.ResponseStatus.Value(status) == int(code), status
        seen = Reachability()
        seen.record("server", int(code))
        verdict = seen.verdicts.get("server")
        expected = {"dialled back": True, "not dialled back": False}.get(counts)
        assert (verdict[0] if verdict else None) == expected, status
        assert counts in ("dialled back", "not dialled back") or counts.startswith("no verdict"), counts
    # an answer without a verdict keeps the server's earlier one
    seen = Reachability()
    seen.record("server", Message.OK)
    seen.record("server", Message.E_DIAL_REFUSED)
    assert seen.status == "public" and "server" in seen.no_answer


def test_reachability_rule_as_documented() -> None:
    from libp2p.host.autonat.pb.autonat_pb2 import Message

    from dgrpo.net.reachability import Reachability

    def documented(yes: int, no: int, confirmations: int) -> str:
        if yes >= confirmations and yes > no:
            return "public"
        if no >= confirmations and no > yes:
            return "private"
        return "unknown"

    for yes, no, confirmations in itertools.product(range(5), range(5), range(1, 4)):
        seen = Reachability(confirmations)
        for i in range(yes):
            seen.record(f"ok-{i}", Message.OK)
        for i in range(no):
            seen.record(f"no-{i}", Message.E_DIAL_ERROR)
        assert seen.status == documented(yes, no, confirmations), (yes, no, confirmations)


# ------------------------------------------------------------------------------ peer exchange
def test_peer_exchange_rules_as_documented() -> None:
    from dgrpo.net.peering import Peering, subnet_of

    relay = _relay_identity().peer_id
    circuit = f"/ip4/203.0.113.1/tcp/4001/p2p/{relay}/p2p-circuit/p2p/{PEER.peer_id}"
    assert subnet_of([circuit, DIRECT]) == "192.168.1.0/24"  # the first direct address, circuits skipped
    assert subnet_of([f"/ip6/2001:db8:1:2::7/tcp/4001/p2p/{PEER.peer_id}"]) == "2001:db8:1::/48"
    assert subnet_of([circuit]) is None
    config = TraversalConfig()
    peering = Peering(config, "me")
    for k in range(1, 10):
        peering.record("p", None, 0.0)
        bound = min(config.redial_max_seconds, config.redial_initial_seconds * 2 ** (k - 1))
        assert 0.5 * bound <= peering.backoff["p"].until < bound, k
    peering.record("p", "direct", 0.0)
    assert "p" not in peering.backoff
    # at most max_per_subnet per block, counting connected peers; circuit-only peers are not bounded
    known = {f"n{i}": [f"/ip4/10.0.0.{i}/tcp/1/p2p/{PEER.peer_id}"] for i in range(1, 6)}
    known |= {f"c{i}": [circuit] for i in range(3)}
    chosen = Peering(config, "me").candidates(known, {"n1"}, set(), 0.0)
    assert sum(1 for p in chosen if p.startswith("n")) == config.max_per_subnet - 1
    assert {p for p in chosen if p.startswith("c")} == {"c0", "c1", "c2"}
