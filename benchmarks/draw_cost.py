"""What one node's round costs beside its own generation and update as the network grows, with nothing else
running (issue 24: "work bounded by J, not N"). ``python benchmarks/draw_cost.py --sizes 3 10 30 100 300 1000``.

``benchmarks/scale.py`` measures the same stages inside a live testnet of N light peers, where N daemons share
2 cores: there every stage's CPU grows with N through caches and the interpreter's switching, including the
update, whose work is fixed (its 12 completions). This script isolates the algorithm: one process, one
receiving node built as the daemon builds it (default defense chain, J = ``--external``), and N - 1 authors whose
real rollouts (the tiny model's, each on its own plan) are generated once per round; then the receiver's
``consume`` runs on all of them, and its per-stage thread CPU (``RoundOutcome.cpu``) is read. Side by side in one
run, per N:

- ``rest_ms``: draw + defend + score per round (median over rounds): target at N = 100 at most 1.2x N = 3.
- ``draw_ms``, ``defend_score_ms``: the two parts; ``admit_us_per_completion``: the admit stage (plan binding's
  structural checks of every offered rollout) per offered completion, which is per message like the receive
  path, not bounded by J.
- ``update_ms``: the update on the completions drawn (fixed work: the control).
- ``draw_alone_us``: the draw stage alone, 300 times on the last round's admitted rollouts (median): the algorithm
  without what the round around it leaves in memory.

Writes ``draw_cost.json`` and ``draw_cost.csv`` in ``--out``.
"""

from __future__ import annotations

import argparse
import csv
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from dgrpo.config import RunConfig
from dgrpo.overrides import apply_overrides
from dgrpo.protocol.messages import Rollout
from dgrpo.round.build import build_node
from dgrpo.round.draw import draw, private_rng
from dgrpo.round.node import Node
from dgrpo.tasks.registry import get_task


def progress(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def measure(n: int, rounds: int, external: int, prompts: int) -> dict[str, Any]:
    run = RunConfig.model_validate(
        apply_overrides({}, [f"rollout.external_per_round={external}", f"rollout.prompts_per_round={prompts}"])
    )
    task = get_task(run.task.name, **run.task.options)
    receiver = build_node(run, "node-0", "cost", task)
    author = build_node(run, "author", "cost", task)  # one model writes every author's rollouts
    authors = [Node(f"node-{i}", "cost", task, author.learner, run.rollout, run.sampling) for i in range(1, n)]
    rows = []
    for round_idx in range(1, rounds + 1):
        offered: list[Rollout] = []
        for peer in authors:
            offered.extend(peer.produce(round_idx))
        own = receiver.produce(round_idx)
        outcome = receiver.consume(round_idx, [*own, *offered])
        cpu = outcome.cpu
        completions = sum(len(r.completions) for r in offered)
        rows.append(
            {
                "rest_ms": 1e3 * (cpu.draw + cpu.defend + cpu.score),
                "draw_ms": 1e3 * cpu.draw,
                "defend_score_ms": 1e3 * (cpu.defend + cpu.score),
                "admit_us_per_completion": 1e6 * cpu.admit / max(1, completions),
                "update_ms": 1e3 * cpu.update,
                "drawn": outcome.drawn.drawn if outcome.drawn is not None else None,
                "offered": completions,
            }
        )
    # The draw alone, on the last round's admitted rollouts, with the receiver's rules and seniority as they are.
    admission = receiver.admitter.admit([*own, *offered], rounds, receiver.blacklisted, 0)
    seniors = receiver.seniority.has_seniors()
    alone = []
    for rep in range(300):
        c0 = time.thread_time()
        draw(
            admission.admitted, receiver.peer_id, receiver.draw_rules, receiver.seniority.weight,
            receiver.seniority.young, private_rng(receiver.secret, rep), top_up=not seniors, offered=admission.offered,
            own=admission.own, per_rollout=run.rollout.completions_per_prompt, everyone_young=not seniors,
            max_weight=receiver.seniority.max_weight(), by_weight=admission.by_weight,
        )  # fmt: skip
        alone.append(1e6 * (time.thread_time() - c0))
    kept = rows[1:] if len(rows) > 1 else rows  # the first round warms caches and lazy imports
    out: dict[str, Any] = {"n": n, "rounds": rounds, "external_per_round": external}
    for key in ("rest_ms", "draw_ms", "defend_score_ms", "admit_us_per_completion", "update_ms"):
        out[key] = round(statistics.median(r[key] for r in kept), 3)
    out["draw_alone_us"] = round(statistics.median(alone), 1)
    out["offered"] = kept[-1]["offered"]
    out["drawn"] = kept[-1]["drawn"]
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=int, nargs="+", default=[3, 10, 30, 100, 300, 1000])
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--external", type=int, default=8, help="J: external completions drawn per round")
    parser.add_argument("--prompts", type=int, default=2, help="prompts per node and round (as benchmarks/scale.py)")
    parser.add_argument("--out", type=Path, default=Path("runs/draw_cost"))
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    results = []
    for n in sorted(args.sizes):
        progress(f"N = {n}: {n - 1} authors' rollouts, {args.rounds} rounds")
        row = measure(n, args.rounds, args.external, args.prompts)
        print(json.dumps(row), flush=True)
        results.append(row)
    base = results[0]
    ratios = {
        f"{key}_ratio_{base['n']}_to_{r['n']}": round(r[key] / base[key], 2)
        for r in results[1:]
        for key in ("rest_ms", "update_ms")
        if base[key]
    }
    summary = {"results": results, "ratios": ratios, "targets": {"rest_ms ratio N=3 to N=100": "<= 1.2"}}
    (args.out / "draw_cost.json").write_text(json.dumps(summary, indent=2))
    with (args.out / "draw_cost.csv").open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(results[0]))
        writer.writeheader()
        writer.writerows(results)
    print(json.dumps(ratios, indent=2))


if __name__ == "__main__":
    main()
