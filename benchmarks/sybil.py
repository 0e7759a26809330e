"""Sybils: what share of an honest node's training batch fresh identities take (issue 24).
``python benchmarks/sybil.py --sybils 10 50 --out docs/figures/sybil``.

Three honest daemons (light peers, one process) run a bounded draw (J = ``--external`` external completions a
round, at most ``--per-author`` from one author, young authors together at most ``young_share``). After
``--warmup`` rounds (more than K = ``rollout.young_rounds``: the honest nodes have earned seniority with each
other by verified work), S fresh identities join, all in one more process: each a real daemon with its own key
and libp2p host, publishing validly signed zero-reward junk on the prompts of its plan (``--adversary junk``).
Over the next ``--rounds`` rounds, per honest node:

- ``sybil_share``: the Sybils' completions among the external completions it trained on (from ``/status``
  ``completions_trained_by_author``, the difference over the Sybil phase), ``max_round_young_completions``, the
  most young authors' completions in one round's draw (bounded by ``floor(young_share * J)`` once the node knows
  a senior), and ``max_round_young_share``, the largest share of young authors' in one round's draw
  (``rounds.jsonl``): ``young_share`` where the node drew its J, more where seniors offered fewer;
- ``honest_peers_every_round``: in how many of those rounds it trained on both other honest nodes.

``--no-cap`` runs the same with ``young_share = 1`` (no cap: the draw is by seniority weight alone) and
``--all-gather`` with no draw at all (every admitted completion, the default before issue 24), side by side.
``--fast``: the Sybils are one publisher that writes their junk on time (``benchmarks/fast_sybils.py``), not
daemons, which fall behind the honest rounds and never reach their draw.
Writes ``sybil.json`` and ``sybil.png``. (``max_round_young_share`` needs a draw: None in all-gather rows.)
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from dgrpo.daemon.light import HostedNode, HostPlan
from dgrpo.daemon.testnet import (
    NetNode,
    node_identity,
    node_overrides,
    rounds_log,
    start_testnet,
    stop_nodes,
    tcp_address,
    wait_for_node_file,
    wait_until,
)

HONEST = 3


def progress(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def run(out: Path, sybils: int, warmup: int, rounds: int, extra: list[str], fast: bool) -> dict[str, Any]:
    shutil.rmtree(out, ignore_errors=True)
    sets = [*extra, "rounds.deadline_seconds=60", "rounds.peer_timeout_seconds=20", "rounds.heartbeat_seconds=5"]
    honest = start_testnet(HONEST, out, None, extra=sets, per_process=HONEST)
    sybil_nodes: list[NetNode] = []
    fast_proc: list[subprocess.Popen[bytes]] = []
    fake: set[str] = set()
    try:
        wait_until(lambda: all(len(rounds_log(nd)) >= warmup for nd in honest), 900, f"{warmup} honest rounds")
        before = [nd.status() or {} for nd in honest]
        marks = [len(rounds_log(nd)) for nd in honest]
        progress(f"{sybils} Sybils join" + (" (fast publisher)" if fast else ""))
        if fast:
            joined, fake = fast_sybils(out, sybils, honest, rounds, fast_proc)
        else:
            joined, fake = sybil_daemons(out, sybils, honest, sets, sybil_nodes)
        wait_until(
            lambda: all(len(rounds_log(nd)) >= j + rounds for nd, j in zip(honest, joined, strict=True)),
            600 + 60 * rounds,
            f"{rounds} rounds with the Sybils",
        )
        after = [nd.status() or {} for nd in honest]
    finally:
        stop_nodes(honest + sybil_nodes)
        for proc in fast_proc:
            proc.kill()
            proc.wait()
    peers = [nd.peer_id for nd in honest]
    rows: list[dict[str, Any]] = []
    for k, nd in enumerate(honest):
        trained = {
            a: after[k]["completions_trained_by_author"].get(a, 0)
            - before[k]["completions_trained_by_author"].get(a, 0)
            for a in after[k]["completions_trained_by_author"]
        }
        external = sum(v for a, v in trained.items() if a != nd.peer_id)
        from_sybils = sum(v for a, v in trained.items() if a in fake)
        phase = rounds_log(nd)[joined[k] : joined[k] + rounds]
        others = set(peers) - {nd.peer_id}
        young = [r["drawn"]["young"] / r["drawn"]["drawn"] for r in phase if r.get("drawn") and r["drawn"]["drawn"]]
        young_count = [r["drawn"]["young"] for r in phase if r.get("drawn")]
        rows.append(
            {
                "node": nd.peer_id[-8:],
                "sybil_share": round(from_sybils / external, 3) if external else None,
                "max_round_young_share": round(max(young), 3) if young else None,
                "max_round_young_completions": max(young_count) if young_count else None,
                "honest_peers_every_round": f"{sum(others <= set(r['authors']) for r in phase)}/{len(phase)}",
                "sybils_blacklisted": len(fake & set(after[k].get("blacklisted_peers", []))),
                "rounds_before_join": marks[k],
            }
        )
    shares = [r["sybil_share"] for r in rows if r["sybil_share"] is not None]
    return {
        "sybils": sybils,
        "rounds": rounds,
        "nodes": rows,
        "sybil_share_max": max(shares) if shares else None,
        "sybil_share_median": statistics.median(shares) if shares else None,
    }


def sybil_daemons(
    out: Path, sybils: int, honest: list[NetNode], sets: list[str], sybil_nodes: list[NetNode]
) -> tuple[list[int], set[str]]:
    """Sybils as full daemons (light peers in one process, the ``junk`` adversary): the honest nodes' rounds
    when every Sybil has run one, and the Sybils' peer ids."""
    n = HONEST + sybils
    hosted = []
    for i in range(HONEST, n):
        state = out / f"node-{i}"
        node_identity(state)
        overrides = node_overrides(i, n, None, "testnet", "completions", [], sets, ("junk", sybils))
        overrides.append("rounds.min_peers=1")
        hosted.append(HostedNode(state, tuple(overrides), None, out / "node-0"))
    plan = HostPlan(tuple(hosted), tuple(tcp_address(nd) for nd in honest), 1)
    plan.dump(out / "sybils.json")
    log = open(out / "sybils.log", "ab")  # noqa: SIM115 (kept open for the child's lifetime)
    cmd = [sys.executable, "-m", "dgrpo", "node", "host", str(out / "sybils.json")]
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    for i, h in enumerate(hosted, start=HONEST):
        sybil_nodes.append(NetNode(i, h.state_dir, proc, node_identity(h.state_dir).peer_id))
    for nd in sybil_nodes:
        wait_for_node_file(nd, timeout=600)
    # Measured from when the Sybils publish: 50 light peers take longer to load than the honest nodes take for
    # the measured rounds (a first run with 50 measured 6 honest rounds before any Sybil had run one).
    wait_until(lambda: all(rounds_log(nd) for nd in sybil_nodes), 900, "a round on every Sybil")
    return [len(rounds_log(nd)) for nd in honest], {nd.peer_id for nd in sybil_nodes}


def fast_sybils(
    out: Path, sybils: int, honest: list[NetNode], rounds: int, procs: list[subprocess.Popen[bytes]]
) -> tuple[list[int], set[str]]:
    """Sybils that publish on time (``benchmarks/fast_sybils.py``): measured from when they are up."""
    folder = out / "fast-sybils"
    folder.mkdir(parents=True, exist_ok=True)
    script = Path(__file__).with_name("fast_sybils.py")
    seconds = 900 + 60 * rounds
    cmd = [sys.executable, str(script), str(out / "node-0" / "manifest.json"), str(folder), str(sybils), str(seconds)]
    log = open(out / "sybils.log", "ab")  # noqa: SIM115 (kept open for the child's lifetime)
    proc = subprocess.Popen([*cmd, *(tcp_address(nd) for nd in honest)], stdout=log, stderr=subprocess.STDOUT)
    procs.append(proc)
    wait_until(lambda: (folder / "sybils.json").exists() or proc.poll() is not None, 600, "the Sybils up")
    if proc.poll() is not None:
        raise RuntimeError(f"the Sybil publisher exited: see {out / 'sybils.log'}")
    return [len(rounds_log(nd)) for nd in honest], set(json.loads((folder / "sybils.json").read_text()))


def plot(results: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.6))
    labels = [f"{r['sybils']} Sybils, {r['cap']}" for r in results]
    ax.bar(labels, [r["sybil_share_max"] or 0 for r in results])
    ax.axhline(results[0]["young_share"], color="red", linestyle="--", label="young_share cap")
    ax.set_ylabel("Sybils' share of external\ncompletions trained (max of 3 nodes)")
    ax.set_ylim(0, 1)
    ax.tick_params(axis="x", labelrotation=20, labelsize=8)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sybils", type=int, nargs="+", default=[10, 50])
    parser.add_argument("--warmup", type=int, default=8, help="honest rounds before the Sybils join (> K)")
    parser.add_argument("--rounds", type=int, default=8, help="rounds measured with the Sybils")
    parser.add_argument("--external", type=int, default=8)
    parser.add_argument("--per-author", type=int, default=4)
    parser.add_argument("--young-share", type=float, default=0.25)
    parser.add_argument("--no-cap", action="store_true", help="also run each with young_share = 1 (no cap)")
    parser.add_argument(
        "--all-gather", action="store_true", help="also run each with no draw at all (every admitted completion)"
    )
    parser.add_argument(
        "--fast",
        action="store_true",
        help="Sybils from one publisher that writes junk on time and trains nothing (benchmarks/fast_sybils.py) "
        "instead of full daemons, which fall behind the honest rounds",
    )
    parser.add_argument("--out", type=Path, default=Path("runs/sybil"))
    parser.add_argument("--keep", action="store_true", help="keep each run's node folders (logs, rounds.jsonl)")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    base = [
        "rollout.prompts_per_round=2",
        f"rollout.external_per_author={args.per_author}",
        "rollout.young_rounds=5",
        "checkpoint.every=5",
    ]
    results = []
    draw = f"rollout.external_per_round={args.external}"
    variants = [("capped", [draw, f"rollout.young_share={args.young_share}"])]
    variants += [("no cap", [draw, "rollout.young_share=1.0"])] if args.no_cap else []
    variants += [("all-gather", [])] if args.all_gather else []  # no J: every admitted completion
    for sybils in args.sybils:
        for cap, sets in variants:
            progress(f"{sybils} Sybils, {cap}")
            out = args.out / f"s{sybils}-{cap.replace(' ', '-')}"
            row = run(out, sybils, args.warmup, args.rounds, [*base, *sets], args.fast)
            row.update(cap=cap, young_share=args.young_share, sybils_from="publisher" if args.fast else "daemons")
            for node in row["nodes"] if not sets else []:  # all-gather: nothing is drawn, nothing capped
                node["max_round_young_share"] = node["max_round_young_completions"] = None
            print(json.dumps(row), flush=True)
            results.append(row)
            if not args.keep:
                shutil.rmtree(out, ignore_errors=True)
    (args.out / "sybil.json").write_text(json.dumps(results, indent=2))
    plot(results, args.out / "sybil.png")


if __name__ == "__main__":
    main()
