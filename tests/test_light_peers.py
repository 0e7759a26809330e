"""Light peers (issue 24): many daemons in one OS process (``dgrpo node host``, ``testnet up --per-process``), each
with its own key, libp2p host, model and state, over real gossipsub between real processes; a bounded draw
(``rollout.external_per_round``) keeps each node's work at its own completions plus J."""

from __future__ import annotations

import json
import statistics
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from dgrpo.daemon.light import HostedNode, HostPlan, bootstrap_for
from dgrpo.daemon.testnet import rounds_log, scale_overrides, start_testnet, stop_nodes, wait_rounds

SCALE = ["rollout.prompts_per_round=2", "rollout.external_per_round=8", "checkpoint.every=5"]


def test_bootstrap_is_the_creator_and_the_latest_few() -> None:
    assert bootstrap_for([]) == []
    assert bootstrap_for(["a"]) == ["a"]
    assert bootstrap_for(["a", "b", "c"]) == ["a", "b", "c"]
    assert bootstrap_for([f"n{i}" for i in range(50)]) == ["n0", "n47", "n48", "n49"]


def test_a_plan_round_trips(tmp_path: Path) -> None:
    plan = HostPlan(
        (
            HostedNode(tmp_path / "a", ("run_id='x'",)),
            HostedNode(tmp_path / "b", (), tmp_path / "c.toml", tmp_path / "a"),
        ),
        ("/ip4/127.0.0.1/tcp/1/p2p/12D3KooW",),
        3,
    )
    plan.dump(tmp_path / "plan.json")
    assert HostPlan.load(tmp_path / "plan.json") == plan


def test_scale_timing_starts_past_ten_nodes() -> None:
    assert scale_overrides(10) == []
    sets = dict(item.split("=", 1) for item in scale_overrides(30))
    assert sets["rounds.heartbeat_seconds"] == "10.0" and sets["rounds.announce_rounds"] == "false"


def statuses_of(nodes: list[Any]) -> list[dict[str, Any]]:
    return [json.loads((nd.state_dir / "status.json").read_text()) for nd in nodes]


@pytest.mark.slow
def test_six_light_peers_in_two_processes_train_together(tmp_path: Path) -> None:
    nodes = start_testnet(6, tmp_path, rounds=3, extra=SCALE, per_process=3)
    try:
        assert len({nd.process.pid for nd in nodes}) == 2
        assert wait_rounds(nodes, 3, lambda statuses: None, timeout=600)
    finally:
        assert stop_nodes(nodes), "one SIGTERM per process stops its nodes cleanly: each writes status.json"
    statuses = statuses_of(nodes)
    assert len({s["peer_id"] for s in statuses}) == 6  # each its own key
    assert len({json.loads((nd.state_dir / "node.json").read_text())["status_url"] for nd in nodes}) == 6
    for nd, st in zip(nodes, statuses, strict=True):
        log = (nd.state_dir / "node.log").read_text()
        assert st["peer_id"] in log and "completed 3 rounds" in log  # each node's own log lines
        others = {s["peer_id"] for s in statuses} - {st["peer_id"]}
        assert all(other not in log.split("listening on")[0] for other in others)
        assert st["rounds_done"] == 3 and (nd.state_dir / "checkpoints").is_dir()
        # the bounded draw: its own 4 completions and 8 of its 5 peers' 20, every round
        assert st["draw"]["rounds_full"] == 3 and st["draw"]["drawn"] == 3 * 8 and st["draw"]["offered"] == 3 * 20
        rows = rounds_log(nd)
        assert [r["completions"] for r in rows] == [4 + 8] * 3
        assert all(
            {k: r["drawn"][k] for k in ("offered", "drawn", "full")} == {"offered": 20, "drawn": 8, "full": True}
            for r in rows
        )
        assert st["receive"]["messages"]["rollout"] >= 5 * 2 * 3  # every peer's rollouts, checked one by one


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS")) / 1024


@pytest.mark.slow
def test_thirty_light_peers_run_rounds_with_bounded_work(tmp_path: Path) -> None:
    """30 daemons, 15 to a process, real gossipsub: every node trains on its own completions plus J = 8 drawn
    from its 29 peers' 116, hears every peer, and a light peer costs well under 100 MB."""
    rounds = 3
    nodes = start_testnet(30, tmp_path, rounds=rounds, extra=SCALE, per_process=15)
    peak: dict[int, float] = {}
    try:

        def sample(statuses: list[dict[str, Any] | None]) -> None:
            for pid in {nd.process.pid for nd in nodes}:
                peak[pid] = max(peak.get(pid, 0.0), rss_mb(pid))

        assert wait_rounds(nodes, rounds, sample, timeout=1200)
    finally:
        assert stop_nodes(nodes)
    statuses = statuses_of(nodes)
    assert max(peak.values()) / 15 < 100, f"RSS per light peer: {peak}"
    heard = [len(s["completions_trained_by_author"]) for s in statuses]
    for nd in nodes:
        rows = rounds_log(nd)
        assert len(rows) == rounds
        assert all(r["drawn"]["drawn"] == 8 and r["completions"] == 4 + 8 for r in rows), rows
        assert max(r["drawn"]["offered"] for r in rows) == 29 * 4  # every peer's completions were offered
    # over 3 rounds of 8 draws from 29 peers each node trained on many of them, not a fixed few
    assert statistics.median(heard) >= 10, heard


@pytest.mark.slow  # also slow: the fast tier's -m "not slow" replaces the default -m "not huge"
@pytest.mark.huge
@pytest.mark.timeout(4 * 3600)  # not pyproject's 900 s: starting 100 daemons on 2 cores alone takes ~10 minutes
def test_a_hundred_light_peers_run_twenty_async_steps(tmp_path: Path) -> None:
    """Issue 24's size on this machine (2 cores): 100 daemons, 20 to a process, in async mode (sync rounds of 100
    nodes sharing 2 cores close at their deadlines: docs/scale.md). Not in CI (about 40 minutes):
    ``pytest -m huge tests/test_light_peers.py``. Every node runs its 20 steps, trains on what it drew from many
    authors, never on anything older than S, and a light peer stays under 100 MB."""
    rounds = 20
    nodes = start_testnet(100, tmp_path, rounds=rounds, extra=[*SCALE, "rollout.mode='async'"], per_process=20)
    peak: dict[int, float] = {}
    t0 = time.time()
    try:

        def sample(statuses: list[dict[str, Any] | None]) -> None:
            for pid in {nd.process.pid for nd in nodes}:
                peak[pid] = max(peak.get(pid, 0.0), rss_mb(pid))

        assert wait_rounds(nodes, rounds, sample, timeout=3 * 3600)
        wall = time.time() - t0
    finally:
        assert stop_nodes(nodes, timeout=300)
    statuses = statuses_of(nodes)
    rows = [r for nd in nodes for r in rounds_log(nd)]
    authors = [len(s["completions_trained_by_author"]) for s in statuses]
    full = [s["draw"]["rounds_full"] / max(1, s["draw"]["rounds"]) for s in statuses]
    ages = Counter(int(k) for r in rows for k, v in (r.get("staleness") or {}).items() for _ in range(v))
    print(json.dumps({
        "wall_s": round(wall), "peak_rss_mb": peak, "authors_median": statistics.median(authors),
        "draw_full_median": statistics.median(full), "staleness": dict(sorted(ages.items())),
        "completions_median": statistics.median(r["completions"] for r in rows),
        "paced_seconds_median": statistics.median(s["paced"]["seconds"] for s in statuses),
        "drawn_median": statistics.median(r["drawn"]["drawn"] for r in rows),
    }))  # fmt: skip
    assert all(s["rounds_done"] == rounds for s in statuses)
    assert max(peak.values()) / 20 < 100, f"RSS per light peer: {peak}"
    assert max(ages) <= 4, ages  # rollout.max_staleness
    # Not a fixed few (2 authors can fill a draw of 8 at 4 each); but not most of the 99 either: seniority
    # weighs the draw towards the authors a node verified first, and young ones get 2 of 8 (docs/scale.md).
    assert statistics.median(authors) >= 6, authors  # 10 and 8 in two runs
    # The young share's bound at this size: a step's draw is all young (the node knows no senior yet) or holds at
    # most floor(0.25 * 8) = 2 young authors' completions.
    assert all(r["drawn"]["young"] <= 2 or r["drawn"]["young"] == r["drawn"]["drawn"] for r in rows)
    # Once a node knows a senior, young authors fill at most 2 of the 8 and seniors (few, after 20 steps of 100
    # peers) the rest: most steps draw 6, not 8 (docs/scale.md); at least half of J in the median step.
    assert statistics.median(r["drawn"]["drawn"] for r in rows[1:]) >= 4
