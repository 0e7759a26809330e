"""Whom a round waits for, and when a node that fell behind rejoins (``Daemon.expected_peers``,
``network_round``, ``_catch_up``), from a peer table as heartbeats and rollouts fill it."""

from __future__ import annotations

import pytest

from dgrpo.daemon.daemon import Daemon
from dgrpo.daemon.launch import open_daemon
from dgrpo.daemon.settings import load_node_settings
from dgrpo.net.p2p import PeerInfo
from dgrpo.protocol.messages import DEFAULT_SAMPLING, Rollout
from dgrpo.tasks.arith import ArithTask


class TableTransport:
    """The two views of the peer table a daemon reads: all heartbeats, and the active peers among them."""

    def __init__(self, table: list[PeerInfo]) -> None:
        self.table = table

    def peers(self) -> set[str]:
        return {p.peer_id for p in self.table if p.status != "stopping"}

    def peer_table(self) -> list[PeerInfo]:
        return self.table


class Connections:
    """The gossip layer's view: who is connected, who is blacklisted."""

    def __init__(self, peers: set[str], blacklisted: frozenset[str] = frozenset()) -> None:
        self.peers, self.banned = peers, blacklisted

    def connected_peers(self) -> set[str]:
        return set(self.peers)

    def blacklisted(self) -> list[str]:
        return sorted(self.banned)


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Daemon:
    state = tmp_path_factory.mktemp("node")
    return open_daemon(load_node_settings(None, [f"state_dir={str(state)!r}", "status.enabled=false"]))


def _rollout(author: str, round_idx: int) -> Rollout:
    prompt = ArithTask().train_prompt(0)
    return Rollout(
        author=author, round=round_idx, part=0, parts=8, prompt_id=prompt.id, prompt=prompt.text,
        completions=("a", "b"), indices=(0, 1), model_id="m", weights="", sampling=DEFAULT_SAMPLING,
        split="horizontal",
    )  # fmt: skip


def peer(name: str, round_idx: int, status: str = "running", rounds_done: int = 3) -> PeerInfo:
    return PeerInfo(name, round_idx, rounds_done, status, 0.0)


def attach(d: Daemon, table: list[PeerInfo], connected: set[str] | None = None) -> Connections:
    names = {p.peer_id for p in table}
    conns = Connections(names if connected is None else connected)
    d.transport = TableTransport(table)  # type: ignore[assignment]
    d.gossip = conns  # type: ignore[assignment]
    d._connected_at_start = conns.connected_peers()
    d.inbox.latest.clear()
    return conns


def test_a_round_waits_for_peers_in_step_only(daemon: Daemon) -> None:
    table = [
        peer("at", 10),
        peer("behind-one", 9),  # still training on round 9: it publishes round 10 next
        peer("behind-two", 8),  # or its round-start heartbeat has not arrived yet
        peer("straggler", 7),  # will rejoin at the network's round, never publishes round 10
        peer("ahead", 11),  # already past it and sent nothing of it: joined after round 10 began
        peer("stopping", 10, status="stopping"),
    ]
    attach(daemon, table)
    assert daemon.expected_peers(10) == {"at", "behind-one", "behind-two"}
    # A rollout overtakes the heartbeat announcing its round: a peer that sent round 9 is in step.
    daemon.inbox.latest["straggler"] = 9
    assert daemon.expected_peers(10) == {"at", "behind-one", "behind-two", "straggler"}


def test_a_peer_that_sent_part_of_a_round_is_waited_for_until_it_is_two_rounds_past(daemon: Daemon) -> None:
    """A node thawed after a freeze held part of an old round from peers long past it: it waited for the rest
    until the deadline (30 s in the reliability run), although they never send it."""
    attach(daemon, [peer("next", 11), peer("far", 12)])
    daemon.inbox.open(10)
    for author in ("next", "far"):
        daemon.inbox.add(_rollout(author, 10))
    assert daemon.expected_peers(10) == {"next"}  # its other parts may still be in flight


def test_a_peer_that_disconnects_mid_round_is_no_longer_expected(daemon: Daemon) -> None:
    conns = attach(daemon, [peer("a", 5), peer("b", 5)])
    assert daemon.expected_peers(5) == {"a", "b"}
    conns.peers.discard("b")  # its connection closed; its last heartbeat is still fresh
    assert daemon.expected_peers(5) == {"a"}


def test_a_node_that_fell_behind_rejoins_after_the_networks_round(daemon: Daemon) -> None:
    attach(daemon, [peer("a", 20), peer("b", 20), peer("c", 19)])
    daemon.round, daemon.catch_ups = 12, 0
    assert daemon.network_round() == 20
    daemon._catch_up()
    assert (daemon.round, daemon.catch_ups) == (21, 1)  # round 20's rollouts went out while it was away
    daemon._catch_up()
    assert (daemon.round, daemon.catch_ups) == (21, 1)  # in step now: no further jump


def test_one_peer_announcing_a_far_round_does_not_move_the_network(daemon: Daemon) -> None:
    attach(daemon, [peer("liar", 1_000_000), peer("a", 8), peer("b", 8)])
    daemon.round, daemon.catch_ups = 8, 0
    assert daemon.network_round() == 8  # the lower median
    daemon._catch_up()
    assert (daemon.round, daemon.catch_ups) == (8, 0)
    # Peers that have not completed a round (starting together, or joining) say nothing of the network's round.
    attach(daemon, [peer("new", 0, rounds_done=0), peer("new2", 3, rounds_done=0)])
    assert daemon.network_round() == 0


def test_a_joiner_takes_the_most_advanced_round_within_reach_of_the_median() -> None:
    from dgrpo.daemon.membership import joining_round

    assert joining_round([]) == 0
    assert joining_round([7]) == 7
    assert joining_round([7, 7, 8]) == 8  # a round boundary: the one ahead has published its round already
    assert joining_round([5, 7, 8]) == 8  # median 7: 8 is within 2
    # one peer (a Sybil) announcing a far-off round cannot send the joiner there: median 7, so at most 9
    assert joining_round([7, 8, 1_000_000]) == 8
    assert joining_round([7, 7, 9, 10]) == 9  # lower median 7: 10 is out of reach, 9 is not
    # a majority of liars still can (bounded Sybil influence is issue 24's work)
    assert joining_round([7, 500, 500]) == 500


def test_a_peer_that_ran_all_its_rounds_is_neither_waited_for_nor_the_networks_round(daemon: Daemon) -> None:
    """A finished node that stays on announced "running" with the round it ended at: 80 of 100 async light peers
    done at round 21 made the network's round 21 for the 20 still running at 28, and they waited at every step
    (the huge test). It now announces "done"."""
    table = [peer(f"done-{i}", 21, status="done", rounds_done=20) for i in range(5)]
    table += [peer("a", 28), peer("b", 27)]
    attach(daemon, table)
    assert daemon.expected_peers(21) == set()  # sync: nobody publishes round 21 any more
    assert daemon.expected_peers(28) == {"a", "b"}
    daemon.asynchronous = True
    try:
        assert daemon.network_round() == 28  # the upper median of the running ones only
        daemon.round = 28
        daemon._catch_up()
        assert daemon.round == 28
    finally:
        daemon.asynchronous = False
    # Before: the same table with the finished nodes announcing "running" pulls the network back to 21.
    attach(daemon, [peer(f"done-{i}", 21, rounds_done=20) for i in range(5)] + [peer("a", 28), peer("b", 27)])
    daemon.asynchronous = True
    try:
        assert daemon.network_round() == 21
    finally:
        daemon.asynchronous = False


def test_a_done_heartbeat_is_on_the_wire() -> None:
    from dgrpo.protocol.envelope import HeartbeatBody

    assert HeartbeatBody(round=21, rounds_done=20, status="done", listen_addrs=()).status == "done"
    with pytest.raises(ValueError):
        HeartbeatBody(round=21, rounds_done=20, status="finished", listen_addrs=())  # type: ignore[arg-type]


def test_a_sybil_majority_does_not_decide_the_networks_round(daemon: Daemon) -> None:
    """50 fresh identities far behind (or far ahead) beside two senior honest peers: the network's round is the
    seniors'. Before, the lower median over 52 peers was a Sybil's round, so an honest node that fell behind its
    honest peers never rejoined them (docs/scale.md: node 0 ran 263 rounds alone)."""
    from dgrpo.defense.seniority import Seniority

    saved = daemon.node.seniority
    daemon.node.seniority = Seniority(young_rounds=5)
    try:
        for r in range(5):
            daemon.node.seniority.credit(r, {"honest-a", "honest-b"})
        behind = [peer(f"sybil-{i}", 22) for i in range(50)]
        attach(daemon, [*behind, peer("honest-a", 218), peer("honest-b", 219)])
        daemon.round, daemon.catch_ups = 200, 0
        assert daemon.network_round() == 218
        daemon._catch_up()
        assert (daemon.round, daemon.catch_ups) == (219, 1)
        # A Sybil majority announcing a far-off round moves nobody there, in either mode.
        attach(daemon, [peer(f"sybil-{i}", 1_000_000) for i in range(50)] + [peer("honest-a", 219)])
        assert daemon.network_round() == 219
        daemon.asynchronous = True
        try:
            assert daemon.network_round() == 219
            daemon._catch_up()
            assert daemon.round == 219
            assert daemon.rollout_horizon() == 219 + daemon.settings.limits.rounds_ahead + 2
        finally:
            daemon.asynchronous = False
        # A node that knows no senior peer (a young network, or a joiner) counts everyone, as before.
        daemon.node.seniority = Seniority(young_rounds=5)
        attach(daemon, [*behind, peer("honest-a", 218), peer("honest-b", 219)])
        assert daemon.network_round() == 22
    finally:
        daemon.node.seniority = saved


def test_a_round_does_not_wait_for_young_peers_where_seniors_are_live(daemon: Daemon) -> None:
    """Fifty slow Sybils in step with the round: a node that knows senior peers waits for those only (the Sybils'
    rollouts still count if they arrive before the round closes); one that knows none waits for everybody."""
    from dgrpo.defense.seniority import Seniority

    saved = daemon.node.seniority
    daemon.node.seniority = Seniority(young_rounds=5)
    try:
        for r in range(5):
            daemon.node.seniority.credit(r, {"honest-a", "honest-b"})
        table = [peer(f"sybil-{i}", 30) for i in range(50)] + [peer("honest-a", 30), peer("honest-b", 29)]
        attach(daemon, table)
        assert daemon.expected_peers(30) == {"honest-a", "honest-b"}
        # The seniors gone (disconnected, or done), the young are waited for again.
        attach(daemon, [*table[:50], peer("honest-a", 30, status="done")])
        assert daemon.expected_peers(30) == {f"sybil-{i}" for i in range(50)}
        daemon.node.seniority = Seniority(young_rounds=5)  # nobody senior: a young network waits for all
        attach(daemon, table)
        assert len(daemon.expected_peers(30)) == 52
    finally:
        daemon.node.seniority = saved


def test_a_node_cut_off_from_its_seniors_waits_rather_than_running_alone(tmp_path: object) -> None:
    """Among young identities only, a node that knows senior peers waits (two heartbeats at most) before a
    round, as a node hearing nobody does, instead of racing ahead alone to where its seniors blacklist it for
    rollouts past their horizon."""
    import time

    import trio

    from dgrpo.defense.seniority import Seniority

    sets = [
        f"state_dir={str(tmp_path)!r}",
        "status.enabled=false",
        "rounds.min_peers=1",
        "rounds.heartbeat_seconds=0.25",
    ]
    d = open_daemon(load_node_settings(None, sets))
    d.node.seniority = Seniority(young_rounds=2)
    sybils = [peer(f"sybil-{i}", 30) for i in range(5)]

    def waited() -> float:
        t0 = time.perf_counter()
        trio.run(d._await_peers)
        return time.perf_counter() - t0

    attach(d, sybils)
    assert waited() < 0.1  # knowing no senior, young peers are peers
    for r in range(2):
        d.node.seniority.credit(r, {"honest-a"})
    assert waited() >= 0.45  # cut off from its senior: waits two heartbeats
    attach(d, [*sybils, peer("honest-a", 30)])
    assert waited() < 0.1
