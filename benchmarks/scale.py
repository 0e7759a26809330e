"""Scale: a network of N light peers, bounded work per node (issue 24).
``python benchmarks/scale.py --sizes 3 10 30 100 --out docs/figures/scale``.

For each N, a testnet of N real daemons (light peers: ``--per-process`` to an OS process, each with its own key,
libp2p host, gossipsub router and model) runs ``--rounds`` rounds with a bounded draw (``rollout.external_per_round``
= J). Per N, measured side by side in one run (this machine has 2 cores, so CPU per node, not wall time):

- ``receive_us_per_message``: CPU of the receive path (validation, dedup, quota: every message's signature is
  checked) divided by the messages it checked, median over nodes: flat in N is the target (within 1.5x).
- ``messages_per_node_round``: what a node's receive path checks each round (grows with N: the gossip traffic).
- ``rest_cpu_ms_per_round``: CPU of the stages outside a node's own generation and update on the completions
  it drew (draw, defend, score), median over nodes and rounds after the first: bounded by J, not N (target at
  N = 100 at most 1.2x that at N = 3).
- ``defend_score_cpu_ms_per_round``: the same without the draw, which gives every offered completion a random
  key (``draw_us_per_completion``: per message, like the receive path).
- ``admit_us_per_completion``: the admit stage (the plan binding's structural checks, on every rollout of the
  round) per external completion offered: per message, like the receive path.
- ``update_cpu_ms_per_round``: the update's CPU (bounded by I + J).
- ``rss_mb_per_peer``: a host process's peak RSS divided by the peers it holds (target at most 100 MB).
- ``draw_full_pct``: rounds in which a node drew its J external completions.
- ``round_s_median``: wall time of a round (the whole network shares 2 cores: this grows with N); ``wall_s``: of
  all ``--rounds``.
- with ``--mode async``: ``staleness`` (peers' completions trained on, by age in rounds), ``completions_median``
  (a step's own + drawn) and ``paced_s_median`` (seconds a node waited for the network, ``rounds.keep_pace``).

Writes ``scale.json``, ``scale.csv`` and ``scale.png`` in ``--out``.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import json
import shutil
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

import psutil

from dgrpo.daemon.testnet import rounds_log, start_testnet, stop_nodes, wait_rounds

SCALE = [
    "rollout.prompts_per_round=2",  # 2 messages a node a round: the traffic of 100 nodes fits 2 cores
    "checkpoint.every=5",
]


def progress(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


class RssSampler:
    """Peak RSS of each host process, sampled every second in a thread."""

    def __init__(self, pids: list[int]) -> None:
        self.pids = pids
        self.peak: dict[int, float] = dict.fromkeys(pids, 0.0)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            for pid in self.pids:
                with contextlib.suppress(psutil.Error):
                    self.peak[pid] = max(self.peak[pid], psutil.Process(pid).memory_info().rss / 2**20)
            self._stop.wait(1.0)

    def __enter__(self) -> RssSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def measure(
    n: int, out: Path, rounds: int, per_process: int, external: int, timeout: float, mode: str, sets: list[str]
) -> dict[str, Any]:
    shutil.rmtree(out, ignore_errors=True)
    progress(f"N = {n}: starting {n} light peers, {per_process} to a process ({mode} rounds)")
    t0 = time.time()
    extra = [*SCALE, f"rollout.external_per_round={external}", f"rollout.mode='{mode}'", *sets]
    nodes = start_testnet(n, out, rounds, extra=extra, per_process=min(n, per_process))
    started = time.time() - t0
    processes = {nd.process.pid: sum(1 for m in nodes if m.process.pid == nd.process.pid) for nd in nodes}
    try:
        with RssSampler(list(processes)) as rss:
            last = [0.0]

            def show(statuses: list[dict[str, Any] | None]) -> None:
                if time.time() - last[0] > 30:
                    last[0] = time.time()
                    done = sorted(int((s or {}).get("rounds_done", 0)) for s in statuses)
                    progress(f"N = {n}: rounds done {done[0]}..{done[-1]} of {rounds}")

            finished = wait_rounds(nodes, rounds, show, timeout)
            wall = time.time() - t0 - started
            statuses = [nd.status() or {} for nd in nodes]
    finally:
        stop_nodes(nodes)
    logs = [rounds_log(nd)[1:] for nd in nodes]  # the first round pays for start-up
    rows = [row for log in logs for row in log]
    receive = [s.get("receive") or {} for s in statuses]
    per_message = [
        1e6 * r["cpu_seconds"] / sum(r["messages"].values()) for r in receive if sum(r.get("messages", {}).values())
    ]
    messages = [
        sum(r.get("messages", {}).values()) / max(1, st.get("rounds_done", 1))
        for r, st in zip(receive, statuses, strict=True)
    ]
    rest = [1e3 * sum(row["cpu"][k] for k in ("draw", "defend", "score")) for row in rows if "cpu" in row]
    checked = [1e3 * (row["cpu"]["defend"] + row["cpu"]["score"]) for row in rows if "cpu" in row]
    per_offered = [
        1e6 * row["cpu"]["draw"] / max(1, row["drawn"]["offered"]) for row in rows if "cpu" in row and row.get("drawn")
    ]
    admit = [
        1e6 * row["cpu"]["admit"] / max(1, row["drawn"]["offered"]) for row in rows if "cpu" in row and row.get("drawn")
    ]
    update = [1e3 * row["cpu"]["update"] for row in rows if "cpu" in row]
    drawn = [row["drawn"] for row in rows if row.get("drawn")]
    ages: dict[str, int] = {}
    for row in rows:
        for age, count in (row.get("staleness") or {}).items():
            ages[age] = ages.get(age, 0) + count
    return {
        "n": n,
        "mode": mode,
        "sets": sets,
        "finished": finished,
        "rounds": rounds,
        "per_process": min(n, per_process),
        "external_per_round": external,
        "start_s": round(started, 1),
        "receive_us_per_message": round(statistics.median(per_message), 1) if per_message else None,
        "messages_per_node_round": round(statistics.median(messages), 1) if messages else None,
        "rest_cpu_ms_per_round": round(statistics.median(rest), 2) if rest else None,
        "defend_score_cpu_ms_per_round": round(statistics.median(checked), 3) if checked else None,
        "draw_us_per_completion": round(statistics.median(per_offered), 2) if per_offered else None,
        "update_cpu_ms_per_round": round(statistics.median(update), 2) if update else None,
        "admit_us_per_completion": round(statistics.median(admit), 1) if admit else None,
        "rss_mb_per_peer": round(max(rss.peak[pid] / k for pid, k in processes.items()), 1),
        "rss_mb_process_peak": round(max(rss.peak.values()), 1),
        "draw_full_pct": round(100 * sum(d["full"] for d in drawn) / len(drawn), 1) if drawn else None,
        "drawn_median": statistics.median(d["drawn"] for d in drawn) if drawn else None,
        "offered_median": statistics.median(d["offered"] for d in drawn) if drawn else None,
        "round_s_median": round(statistics.median(row["seconds"] for row in rows), 2) if rows else None,
        "wall_s": round(wall, 1),
        "completions_median": statistics.median(row["completions"] for row in rows) if rows else None,
        "staleness": dict(sorted(ages.items(), key=lambda kv: int(kv[0]))),
        "paced_s_median": statistics.median(float((s.get("paced") or {}).get("seconds", 0.0)) for s in statuses),
        "rounds_at_deadline": sum(1 for s in statuses if s.get("last_errors")),
    }


def ratios(results: list[dict[str, Any]]) -> dict[str, Any]:
    base, top = results[0], results[-1]

    def ratio(key: str) -> float | None:
        a, b = base.get(key), top.get(key)
        return round(b / a, 2) if a and b is not None else None

    return {
        "from_n": base["n"],
        "to_n": top["n"],
        "rest_cpu_ratio": ratio("rest_cpu_ms_per_round"),
        "defend_score_cpu_ratio": ratio("defend_score_cpu_ms_per_round"),
        "update_cpu_ratio": ratio("update_cpu_ms_per_round"),
        "receive_per_message_ratio": ratio("receive_us_per_message"),
        "messages_ratio": ratio("messages_per_node_round"),
        "targets": {"rest_cpu_ratio": "<= 1.2", "receive_per_message_ratio": "<= 1.5", "rss_mb_per_peer": "<= 100"},
    }


def plot(results: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ns = [r["n"] for r in results]
    fig, axes = plt.subplots(1, 4, figsize=(16, 3.6))
    panels = [
        ("rest_cpu_ms_per_round", "admit+draw+defend+score CPU (ms/round)"),
        ("receive_us_per_message", "receive path CPU (us/message)"),
        ("messages_per_node_round", "messages checked (per node, round)"),
        ("rss_mb_per_peer", "RSS per light peer (MB)"),
    ]
    for ax, (key, title) in zip(axes, panels, strict=True):
        ax.plot(ns, [r[key] or 0 for r in results], marker="o")
        ax.set_xscale("log")
        ax.set_xticks(ns, [str(n) for n in ns])
        ax.set_xlabel("peers")
        ax.set_title(title, fontsize=9)
        ax.set_ylim(bottom=0)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=int, nargs="+", default=[3, 10, 30, 100])
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--per-process", type=int, default=20)
    parser.add_argument("--external", type=int, default=8, help="J: external completions drawn per round")
    parser.add_argument("--timeout", type=float, default=3600.0, help="seconds for one N's rounds")
    parser.add_argument("--mode", choices=["sync", "async"], default="sync", help="rollout.mode of the testnets")
    parser.add_argument("--set", dest="sets", action="append", default=[], help="another key=value for every node")
    parser.add_argument("--out", type=Path, default=Path("runs/scale"))
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    results = []
    for n in sorted(args.sizes):
        row = measure(
            n, args.out / f"n{n}", args.rounds, args.per_process, args.external, args.timeout, args.mode, args.sets
        )
        print(json.dumps(row), flush=True)
        results.append(row)
    summary = {"results": results, "ratios": ratios(results)}
    (args.out / "scale.json").write_text(json.dumps(summary, indent=2))
    with (args.out / "scale.csv").open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(results[0]))
        writer.writeheader()
        writer.writerows(results)
    plot(results, args.out / "scale.png")
    for net in args.out.glob("n*"):
        shutil.rmtree(net, ignore_errors=True)  # the nodes' state: gigabytes of checkpoints at N = 100
    print(json.dumps(summary["ratios"], indent=2))


if __name__ == "__main__":
    main()
