"""Poisoning on a real language model, on the CPU: SmolLM2-135M-Instruct nodes (LoRA through peft) on a
reasoning-gym task, honest against the TEXT attack against the TEXT attack under the best homogeneous chain,
and one heterogeneous run (SmolLM2-135M beside Gemma-3-270m) under the cross-model chain (issue 26).

    .venv/bin/python benchmarks/real_study.py --out runs/real-study [--scenario gym-chain-sum] [--rounds 12]
        [--only honest,text,text-defended,hetero] [--set key=value ...]
    .venv/bin/python benchmarks/real_study.py --out runs/real-study --summarize-only   # tables and plots

Each run is a `dgrpo simulate` of the scenario with the run's overrides, in ``OUT/<run>``; a run whose
``summary.json`` says it completed is not run again, an interrupted one with a saved state is resumed, any other
is run again from the start (hours in all on 2 cores, one run at a time; rerun the same command after an
interruption). Progress: one line per round on stderr. At the end (and with
``--summarize-only``) it writes ``OUT/study.json``, ``OUT/study.csv``, ``OUT/study.md`` and the plots
``OUT/reward.png``, ``OUT/asr.png``: reward curves, ASR over rounds, stop rate and false-positive rate, wall
time per round. The heterogeneous run needs the Gemma-3-270m wheels (``dgrpo/learner/gemma3.py``).
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import sys
import time
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from dgrpo.simulations.summary import RunSummary, has_summary, load_summary

# The best homogeneous chain of docs/results.md (stop 1.000 at FPR 0 against every attack on the tiny
# models) and the cross-model one (surprisal + repetition, "new" in the heterogeneous table).
HOMOGENEOUS_CHAIN = '["code-policy","sampling-proof"]'
HETEROGENEOUS_CHAIN = '["surprisal","repetition"]'
RUNS: dict[str, list[str]] = {
    "honest": ["nodes.malicious=0"],
    "text": ["nodes.malicious=1", "adversary.name='text'"],
    "text-defended": ["nodes.malicious=1", "adversary.name='text'", f"defense.chain={HOMOGENEOUS_CHAIN}",
                      "rollout.sampler='seeded'"],
    "hetero": ["nodes.malicious=1", "adversary.name='text'", "nodes.mode='heterogeneous'",
               "nodes.models=['pypi:SmolLM2-135M-Instruct','pypi:gemma-3-270m']",
               f"defense.chain={HETEROGENEOUS_CHAIN}"],
}  # fmt: skip


def run_one(name: str, scenario: str, rounds: int, sets: list[str], out: Path) -> RunSummary:
    from dgrpo.simulations.run_folder import RunFolder
    from dgrpo.simulations.runner import resume_simulation, run_simulation
    from dgrpo.simulations.scenario import load_scenario

    folder = out / name
    if has_summary(folder) and (done := load_summary(folder)).complete:
        print(f"[{name}] done before: {folder}/summary.json", file=sys.stderr)
        return done
    sc = load_scenario(Path(scenario), [f"rounds={rounds}", f"run_id='real-study-{name}'", *RUNS[name], *sets])
    started = time.monotonic()

    def progress(row: dict[str, Any]) -> None:
        bits = [f"round {row['round']}/{rounds}", f"reward {row['honest_mean_reward']:.3f}",
                f"{row['seconds']:.0f}s", f"elapsed {(time.monotonic() - started) / 60:.1f} min"]  # fmt: skip
        if row.get("accuracy") is not None:
            bits.append(f"accuracy {row['accuracy']:.3f}")
        if row.get("asr") is not None:
            bits.append(f"ASR {row['asr']:.3f}")
        print(f"[{name}] " + ", ".join(bits), file=sys.stderr, flush=True)

    if RunFolder(folder).resumable():
        print(f"[{name}] resuming the interrupted run in {folder}", file=sys.stderr, flush=True)
        return resume_simulation(folder, progress)
    print(f"[{name}] {sc.nodes.count} nodes, {rounds} rounds -> {folder}", file=sys.stderr, flush=True)
    return run_simulation(sc, folder, progress, overwrite=True)  # what an interrupted run left: from the start


def row_of(name: str, s: RunSummary, rows: list[dict[str, Any]]) -> dict[str, Any]:
    d = s.defense if s.defense is not None and s.defense.names else None  # no chain: no stop rate, no FPR
    seconds = [r["seconds"] for r in rows if r.get("seconds") is not None]
    return {
        "run": name,
        "models": s.model,
        "attack": s.attack,
        "defense": "+".join(d.names) if d is not None else "none",
        "rounds": s.rounds,
        "initial_accuracy": s.initial_accuracy,
        "final_accuracy": s.final_accuracy,
        "final_asr": s.final_asr,
        "max_asr": s.max_asr,
        "stop_rate": d.stop_rate if d is not None else None,
        "false_positive_rate": d.false_positive_rate if d is not None else None,
        "attacker_share": s.attacker_share,
        "defense_overhead": d.overhead_ratio if d is not None else None,
        "honest_own_reward_last": rows[-1].get("honest_own_reward") if rows else None,
        "seconds_per_round": round(sum(seconds) / len(seconds), 1) if seconds else None,
        "wall_seconds": s.wall_seconds,
    }


def summarize(out: Path, names: list[str]) -> list[dict[str, Any]]:
    table, curves = [], {}
    for name in names:
        folder = out / name
        if not has_summary(folder):
            continue
        s = load_summary(folder)
        rows = [json.loads(x) for x in (folder / "metrics.jsonl").read_text().splitlines() if x.strip()]
        table.append(row_of(name, s, rows))
        curves[name] = (rows, s)
    (out / "study.json").write_text(json.dumps(table, indent=2) + "\n")
    if table:
        buf = io.StringIO()
        writer = csv.DictWriter(buf, fieldnames=list(table[0]))
        writer.writeheader()
        writer.writerows(table)
        (out / "study.csv").write_text(buf.getvalue())
        cols = list(table[0])
        md = ["| " + " | ".join(cols) + " |", "|" + " --- |" * len(cols)]
        md += ["| " + " | ".join(_fmt(r[c]) for c in cols) + " |" for r in table]
        (out / "study.md").write_text("\n".join(md) + "\n")
    fig, ax = plt.subplots(figsize=(7, 4))
    for name, (rows, _) in curves.items():
        line = ax.plot([r["round"] for r in rows], [r["honest_own_reward"] for r in rows], marker=".", label=name)
        ax.plot([r["round"] for r in rows], [r["honest_mean_reward"] for r in rows], linestyle=":",
                color=line[0].get_color(), label=f"{name}: all it trained on")  # fmt: skip
    # An attacker's completions are correct (reward 1): the mean over everything trained on hides how the
    # honest nodes' own answers fare, which is the learning curve.
    ax.set(xlabel="round", ylabel="reward", title="honest nodes' own completions (solid), all trained on (dotted)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(out / "reward.png", dpi=120)
    plt.close(fig)
    fig, ax = plt.subplots(figsize=(7, 4))
    for name, (_, s) in curves.items():
        if s.asr:
            ax.plot([r for r, _ in s.asr], [v for _, v in s.asr], marker="o", label=name)
        ax.plot([r for r, _ in s.accuracy], [v for _, v in s.accuracy],
                linestyle="--", alpha=0.6, label=f"{name}: held-out accuracy")  # fmt: skip
    ax.set(xlabel="round", ylabel="rate", title="ASR (solid) and held-out accuracy (dashed)", ylim=(-0.02, 1.02))
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / "asr.png", dpi=120)
    plt.close(fig)
    return table


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.3f}"
    return "-" if v is None else str(v)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=Path("runs/real-study"))
    ap.add_argument("--scenario", default="gym-chain-sum")
    ap.add_argument("--rounds", type=int, default=12)
    ap.add_argument("--only", default=",".join(RUNS))
    ap.add_argument("--set", dest="sets", action="append", default=[], help="an override for every run")
    ap.add_argument("--summarize-only", action="store_true")
    args = ap.parse_args(argv)
    names = [n for n in args.only.split(",") if n]
    unknown = [n for n in names if n not in RUNS]
    if unknown:
        ap.error(f"unknown runs {unknown}; known: {', '.join(RUNS)}")
    args.out.mkdir(parents=True, exist_ok=True)
    if not args.summarize_only:
        for name in names:
            run_one(name, args.scenario, args.rounds, args.sets, args.out)
    table = summarize(args.out, list(RUNS))
    for r in table:
        print(json.dumps(r))
    print(f"written: {args.out}/study.json, study.csv, study.md, reward.png, asr.png")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
