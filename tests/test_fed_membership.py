"""Membership in a federated round: whose update a round still waits for when peers leave
(``FederatedExchange.awaited``, ``updates_complete``), when a departure may close the round (``drained``: what
the peer sent before it left has been handled), and how far along a joiner finds the federation
(``UpdateExchange.latest``, ``FederatedExchange.heard_round``).

In the decentralised topology every node must aggregate the same set of updates, or their global weights part.
A CI run (of 0453a8a) ended with three daemons holding three global hashes after one round, which no majority
can heal. Two ways there, both closed here: a node that saw a peer's ``stopping`` heartbeat before that peer's
update (sent first, but on another topic, read by another task) closed the round without it; and a joiner that
judged the federation's round from heartbeats (every 2 s, rounds take 1 to 2 s) announced a first round its
peers had already begun, so some waited for it and some did not.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import trio
import trio.testing

from dgrpo.daemon.daemon import Daemon
from dgrpo.daemon.federated import FederatedExchange
from dgrpo.daemon.launch import open_daemon
from dgrpo.daemon.settings import load_node_settings
from dgrpo.federated.encoding import encode
from dgrpo.net.gossip import drained
from dgrpo.net.p2p import PeerInfo
from dgrpo.net.updates import UpdateExchange, updates_complete
from dgrpo.protocol.chunks import Reassembler
from dgrpo.protocol.envelope import decode
from dgrpo.protocol.identity import Identity
from dgrpo.protocol.limits import Limits
from dgrpo.protocol.update_bodies import UpdateBody
from tests.test_daemon_membership import Connections, TableTransport
from tests.test_federated_wire import ALICE, BOB, CAROL, RUN, SIZE, an_update, signer, update_messages


def test_departed_authors_close_the_round_only_once_everything_received_is_handled() -> None:
    expected, have = {"a", "b", "c"}, {"a", "b"}
    assert not updates_complete(expected, have, awaited={"a", "b", "c"}, settled=True)  # c's update is due
    assert not updates_complete(expected, have, awaited={"a", "b"}, settled=False)  # c left: its update may be queued
    assert updates_complete(expected, have, awaited={"a", "b"}, settled=True)
    assert updates_complete(expected, {"a", "b", "c"}, awaited=set(), settled=False)  # all here: nothing to wait for


def test_drained_means_taken_and_handled_not_only_an_empty_buffer() -> None:
    async def main() -> None:
        send, receive = trio.open_memory_channel[int](8)
        assert not drained(send)  # no reader waiting yet: whatever comes next would sit unhandled
        send.send_nowait(1)
        assert not drained(send)  # buffered
        handled: list[int] = []

        async def reader() -> None:
            async for item in receive:
                handled.append(item)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(reader)
            await trio.testing.wait_all_tasks_blocked()
            assert handled == [1] and drained(send)
            # Handed straight to the waiting reader: the buffer is empty, yet the item is not handled until the
            # reader runs.
            send.send_nowait(2)
            assert send.statistics().current_buffer_used == 0 and handled == [1]
            assert not drained(send)
            await trio.testing.wait_all_tasks_blocked()
            assert handled == [1, 2] and drained(send)
            nursery.cancel_scope.cancel()

    trio.run(main)


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Daemon:
    state = tmp_path_factory.mktemp("fed")
    sets = [f"state_dir={str(state)!r}", "status.enabled=false", "mode='federated'", "federated.clients=3"]
    return open_daemon(load_node_settings(None, sets))


def fed(d: Daemon) -> FederatedExchange:
    """The daemon's federated exchange (its membership in the federation lives there)."""
    assert isinstance(d.exchange, FederatedExchange)
    return d.exchange


def first_chunk() -> UpdateBody:
    return UpdateBody(
        chunk=0, chunks=2, size=8, sha256=bytes(32), data=b"abcd", mean=0.5, std=0.1, samples=4, groups=1,
        base=bytes(32),
    )  # fmt: skip


def test_a_stopping_peer_is_awaited_only_for_an_update_it_already_sent(daemon: Daemon) -> None:
    table = [
        PeerInfo("running", 10, 9, "running", 0.0),
        PeerInfo("finished", 11, 10, "stopping", 0.0),  # stopped after finishing round 10: its update went out
        PeerInfo("midway", 10, 9, "stopping", 0.0),  # stopped during round 10
        PeerInfo("sending", 10, 9, "stopping", 0.0),  # stopped during round 10, some of its update arrived
        PeerInfo("gone", 11, 10, "stopping", 0.0),  # finished round 10, then its connection closed
        PeerInfo("banned", 11, 10, "stopping", 0.0),
    ]
    names = {p.peer_id for p in table}
    daemon.transport = TableTransport(table)  # type: ignore[assignment]
    daemon.gossip = Connections(names - {"gone"}, blacklisted=frozenset({"banned"}))  # type: ignore[assignment]
    daemon._connected_at_start = names
    fed(daemon).reassembler = Reassembler()
    fed(daemon).reassembler.advance(10)
    assert fed(daemon).reassembler.add("update", "sending", 10, first_chunk()) is None  # the first of two chunks
    assert fed(daemon).reassembler.started("update", 10) == {"sending"}
    assert fed(daemon).awaited(10) == {"running", "finished", "sending"}
    # Its update for round 11 never went out: not awaited there.
    assert fed(daemon).awaited(11) == {"running"}


def test_the_round_waits_for_a_peer_that_left_after_sending_until_its_update_is_handled(
    daemon: Daemon, tmp_path: Path
) -> None:
    """The race of the failed CI run, replayed in order: the peer's update is still queued when its ``stopping``
    heartbeat is seen; the round closes with the update, not without it."""
    table = [PeerInfo("me-too", 10, 9, "running", 0.0), PeerInfo("leaver", 11, 10, "stopping", 0.0)]
    daemon.transport = TableTransport(table)  # type: ignore[assignment]
    conns = Connections({"me-too", "leaver"})
    daemon.gossip = conns  # type: ignore[assignment]
    daemon._connected_at_start = {"me-too", "leaver"}
    expected = {"me-too", "leaver", daemon.peer_id}
    have = {"me-too", daemon.peer_id}
    awaited = fed(daemon).awaited(10) | {daemon.peer_id}
    assert not updates_complete(expected, have, awaited, settled=True)  # it finished the round: its update is due
    conns.peers = {"me-too"}  # then its connection closes
    awaited = fed(daemon).awaited(10) | {daemon.peer_id}
    assert not updates_complete(expected, have, awaited, settled=False)  # its chunks are still being handled
    assert updates_complete(expected, have | {"leaver"}, awaited, settled=True)


def test_the_exchange_remembers_how_far_each_author_is_even_from_chunks_it_refuses(tmp_path: Path) -> None:
    reassembler = Reassembler(Limits(max_tracked_peers=2))  # rounds 0 to 2 are kept: round 9 is future_round
    ex = UpdateExchange(ALICE.peer_id, signer(tmp_path, ALICE), reassembler, SIZE, RUN, 4096)
    payload = encode(an_update())
    ex.handle(decode(update_messages(signer(tmp_path, BOB), payload, round_idx=9)[0]))
    ex.handle(decode(update_messages(signer(tmp_path, BOB), payload, round_idx=8)[1]))
    assert ex.latest == {BOB.peer_id: 9}  # the newest round, never moved back
    assert reassembler.statistics().rejected_by_reason == {"future_round": 2}
    ex.handle(decode(update_messages(signer(tmp_path, CAROL), payload, round_idx=1)[0]))
    ex.handle(decode(update_messages(signer(tmp_path, BOB), payload, round_idx=9)[2]))  # Bob heard again
    dave = Identity.from_seed(bytes([4]) * 32)
    ex.handle(decode(update_messages(signer(tmp_path, dave), payload, round_idx=3)[0]))
    assert ex.latest == {BOB.peer_id: 9, dave.peer_id: 3}  # bounded: Carol, heard least recently, is forgotten


def test_a_joiner_takes_the_round_live_peers_sent_updates_for_by_their_lower_median(daemon: Daemon) -> None:
    table = [PeerInfo(name, 5, 4, "running", 0.0) for name in ("a", "b", "c")]
    daemon.transport = TableTransport(table)  # type: ignore[assignment]
    daemon.gossip = Connections({"a", "b", "c"})  # type: ignore[assignment]
    daemon._connected_at_start = {"a", "b", "c"}
    fed(daemon).updates.latest = {"a": 7, "b": 8, "c": 1_000_000, "gone": 50}  # c names a far-off round
    assert fed(daemon).heard_round() == 8  # "gone" is not a live peer; c cannot move it past the others
    fed(daemon).updates.latest = {}
    assert fed(daemon).heard_round() == 0


def test_a_peer_that_ran_all_its_rounds_is_not_expected_to_send_more(daemon: Daemon) -> None:
    table = [PeerInfo("running", 10, 9, "running", 0.0), PeerInfo("done", 8, 7, "done", 0.0)]
    daemon.transport = TableTransport(table)  # type: ignore[assignment]
    fed(daemon).updates.submissions.clear()
    assert fed(daemon).expected_peers(10) == {"running"}
    # the same peer announcing "running" at round 8 (what a finished node said before "done") is expected
    daemon.transport = TableTransport([*table[:1], PeerInfo("done", 8, 7, "running", 0.0)])  # type: ignore[assignment]
    assert fed(daemon).expected_peers(10) == {"running", "done"}
