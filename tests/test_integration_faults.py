"""Faults a daemon must ride out without slowing the others: a frozen peer (SIGSTOP), a peer that stops
mid-round (SIGTERM). Real daemons, real processes, real libp2p gossipsub on loopback."""

from __future__ import annotations

import signal
import statistics
import time
from pathlib import Path

import pytest

from dgrpo.daemon.testnet import rounds_log, start_testnet, stop_nodes, wait_until

pytestmark = pytest.mark.slow  # real processes / many rounds: not in the fast tier


def test_a_frozen_peer_does_not_slow_the_others_and_catches_up(tmp_path: Path) -> None:
    # peer_timeout 3 s (6 heartbeats): the round in which the peer freezes waits at most that long for it.
    extra = ["rounds.deadline_seconds=30", "rounds.peer_timeout_seconds=3"]
    nodes = start_testnet(3, tmp_path, rounds=None, extra=extra)
    victim, others = nodes[2], nodes[:2]
    try:
        wait_until(lambda: all(len(rounds_log(nd)) >= 4 for nd in nodes), 240, "four rounds everywhere")
        before = [row["seconds"] for nd in others for row in rounds_log(nd)[1:4]]
        frozen_at = [len(rounds_log(nd)) for nd in others]
        victim.process.send_signal(signal.SIGSTOP)
        wait_until(
            lambda: all(len(rounds_log(nd)) >= n + 6 for nd, n in zip(others, frozen_at, strict=True)),
            180,
            "six rounds of the others while the peer is frozen",
        )
        during = [rounds_log(nd)[n : n + 6] for nd, n in zip(others, frozen_at, strict=True)]
        # What did not fit in its outbound queue was dropped to it and counted per peer (how much depends on
        # how much the socket buffers took first: tests/test_gossip.py checks the pacing rule itself).
        for nd in others:
            status = nd.status()
            assert status is not None
            dropped = status["dropped_to_peer"]
            assert set(dropped) <= {victim.peer_id}, dropped
            assert status["messages_dropped"].get("peer_queue_full", 0) == sum(dropped.values())
        victim.process.send_signal(signal.SIGCONT)
        network = max(rounds_log(nd)[-1]["round"] for nd in others)
        # It catches up: it rejoins at the network's round and the others train on its completions again.
        wait_until(
            lambda: any(row["round"] > network and len(row["authors"]) == 3 for row in rounds_log(victim)),
            180,
            "the thawed peer to complete a round with everyone",
        )
        wait_until(
            lambda: all(
                any(row["round"] > network and victim.peer_id in row["authors"] for row in rounds_log(nd))
                for nd in others
            ),
            120,
            "the others to train on the thawed peer's completions again",
        )
        status = victim.status()
        assert status is not None and status["catch_ups"] >= 1, status
        # Woken with a stale peer table, it found the others' rollouts far ahead of its round: it must not count
        # them against their authors (the round horizon waits until it hears the network again).
        for nd in nodes:
            assert (nd.status() or {}).get("blacklisted_peers") == [], nd.index
    finally:
        if victim.process.poll() is None:
            victim.process.send_signal(signal.SIGCONT)
        stop_nodes(nodes)
    normal = statistics.median(before)
    seconds = [row["seconds"] for rows in during for row in rows]
    # Before: publishing waited 10 s on the frozen peer's full queue and rounds took 17.8 s instead of ~1 s.
    assert max(seconds) < 3 + 2 * normal + 2, (normal, seconds)
    # Rounds after the first without it run at the normal pace (2x is the reliability target).
    later = [row["seconds"] for rows in during for row in rows[2:]]
    assert statistics.median(later) <= 2 * normal + 0.5, (normal, later)
    for rows in during:
        # It may have delivered the round it froze in (and the next, a round ahead); after that, never.
        assert all(victim.peer_id not in row["authors"] for row in rows[2:])
        assert all(len(row["authors"]) == 2 for row in rows[2:])  # the two live nodes keep training together


def test_a_peer_that_stops_mid_round_is_not_waited_for(tmp_path: Path) -> None:
    # A long peer_timeout and deadline: only the `stopping` heartbeat (or the disconnect) can end the wait.
    extra = ["rounds.deadline_seconds=60", "rounds.peer_timeout_seconds=60"]
    nodes = start_testnet(3, tmp_path, rounds=None, extra=extra)
    victim, others = nodes[2], nodes[:2]
    try:
        wait_until(lambda: all(len(rounds_log(nd)) >= 3 for nd in nodes), 240, "three rounds everywhere")
        normal = statistics.median(row["seconds"] for nd in others for row in rounds_log(nd)[1:3])
        stopped_at = [len(rounds_log(nd)) for nd in others]
        t0 = time.time()
        victim.process.send_signal(signal.SIGTERM)
        assert victim.process.wait(timeout=60) == 0
        wait_until(
            lambda: all(len(rounds_log(nd)) >= n + 3 for nd, n in zip(others, stopped_at, strict=True)),
            120,
            "three rounds of the others after the peer stopped",
        )
        elapsed = time.time() - t0
    finally:
        stop_nodes(nodes)
    after = [row for nd, n in zip(others, stopped_at, strict=True) for row in rounds_log(nd)[n : n + 3]]
    assert max(row["seconds"] for row in after) < 10 + 2 * normal, (normal, after)
    assert elapsed < 40, elapsed  # three rounds, none held to the 60 s deadline or peer timeout
    # In every round after the stop the victim either still delivered (SIGTERM came between its rounds: it
    # finishes the round it is in), was dropped at once (``departed``), or was no longer expected (its
    # ``stopping`` heartbeat came first); never expected, silent and kept (that round would have closed only at
    # its deadline, which the times above rule out as well). CI once saw the first and third in one run, which
    # the earlier form of this check (dropped somewhere, or expected everywhere) refused.
    for row in after:
        delivered = victim.peer_id in row["authors"]
        dropped = victim.peer_id in row["departed"]
        assert delivered or dropped or row["expected_peers"] == 1, (row["round"], row["expected_peers"], dropped)


def test_a_flood_spread_over_rounds_to_come_is_cut_off(tmp_path: Path) -> None:
    """A flooder publishing valid rollouts for rounds nobody may publish yet, 8 a round (within each round's
    quota), 600 of them: before, every message passed gossipsub's validation, was forwarded by every node and
    dropped on arrival (``future_round``, no evidence), never cut off (and honest rounds ran 2.5-3.5x slower:
    ``benchmarks/reliability_faults.py spread-flood`` measures that). Now each is refused inside gossipsub as
    ``future_round`` at the transport, a penalty, and ``blacklist_after`` (20) of them blacklist the flooder."""
    import subprocess
    import sys

    from dgrpo.daemon.testnet import tcp_address

    extra = ["rounds.deadline_seconds=30", "rounds.peer_timeout_seconds=4"]
    nodes = start_testnet(3, tmp_path, rounds=None, extra=extra)
    flooder = None
    try:
        wait_until(lambda: all(len(rounds_log(nd)) >= 3 for nd in nodes), 240, "three rounds everywhere")
        script = Path(__file__).resolve().parents[1] / "benchmarks" / "spread_flooder.py"
        cmd = [sys.executable, str(script), str(tmp_path / "flooder"), "testnet", "600", "8"]
        flooder = subprocess.run(
            [*cmd, *(tcp_address(nd) for nd in nodes)], capture_output=True, text=True, timeout=300
        )
        lines = flooder.stdout.splitlines()
        attacker = next(line.split()[2] for line in lines if line.startswith("flooding from"))
        sent = int(next(line.split()[1] for line in lines if line.startswith("SENT")))
        assert sent < 600, f"cut off before the end of its flood: {flooder.stdout}{flooder.stderr[-2000:]}"
        marks = [len(rounds_log(nd)) for nd in nodes]
        wait_until(
            lambda: all(
                any(len(row["authors"]) == 3 for row in rounds_log(nd)[m:]) for nd, m in zip(nodes, marks, strict=True)
            ),
            120,
            "a round with every honest author after the flood",
        )
        for nd in nodes:
            status = nd.status()
            assert status is not None
            assert attacker in status["blacklisted_peers"], status["blacklisted_peers"]
            refused = status["rejected_by_peer_reason"].get(attacker, {})
            assert refused.get("future_round", 0) >= 1, refused
            assert status["messages_rejected"].get("future_round", 0) >= 1
            assert attacker not in status["completions_trained_by_author"]
            honest = {n.peer_id for n in nodes} - {nd.peer_id}
            assert not (set(status["blacklisted_peers"]) & honest)
        total = sum(
            (nd.status() or {})["rejected_by_peer_reason"].get(attacker, {}).get("future_round", 0) for nd in nodes
        )
        assert total >= 20, "blacklist_after penalties, counted where they arrived"
    finally:
        stop_nodes(nodes)
