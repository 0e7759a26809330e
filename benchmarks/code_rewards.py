"""Reward cost of code tasks: programs per second on a fixed batch, two versions side by side (issue 22), or
reward time per completion on a code scenario (issue 9: isolation start-up must not dominate).

    .venv/bin/python benchmarks/code_rewards.py --batch [--before 6cffddc] [--repeats 5] [--out runs/bench-code-batch]

``--batch`` scores one fixed batch through ``HumanEvalTask.rewards_batch`` (the 164 canonical solutions and
164 wrong bodies) and ``ArithCodeTask.rewards_batch`` (256 programs, half right) with this checkout and with
the commit ``--before`` (extracted with ``git archive`` into a temporary folder), each in a fresh process,
alternating, and prints programs per second of each, their ratio and the rewards (which must agree, except
where the older version was wrong). Default ``--before``: 6cffddc, the last commit before the process
boundary of issue 22.

    .venv/bin/python benchmarks/code_rewards.py [--scenario code-horizontal] [--rounds 10] [--out runs/bench-rewards]

Runs the scenario exactly as ``dgrpo simulate`` does, timing every call into the task's reward (training
rewards of every node and the held-out evaluation alike), and prints the reward seconds per completion next
to the run's results (accuracy and ASR at each evaluation), so that two code versions can be compared on both:
reward time must drop or stay, results must not change. It only uses entry points every version of dgrpo has
(``get_task``, ``Task.rewards``, and ``Task.rewards_batch`` where it exists), so the same script measures an
older checkout:

    git worktree add /tmp/dgrpo-old <commit>
    PYTHONPATH=/tmp/dgrpo-old .venv/bin/python benchmarks/code_rewards.py --out runs/bench-rewards-old
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
BEFORE = "6cffddc"  # the last commit before issue 22's process boundary


class RewardClock:
    """Seconds spent in a task's reward calls and completions scored; nested calls count once."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self.completions = 0
        self.calls = 0
        self._lock = threading.Lock()
        self._depth = threading.local()

    def wrap(self, method: Callable[..., Any], count: Callable[..., int]) -> Callable[..., Any]:
        def timed(*args: Any, **kwargs: Any) -> Any:
            depth = getattr(self._depth, "value", 0)
            self._depth.value = depth + 1
            t0 = time.perf_counter()
            try:
                return method(*args, **kwargs)
            finally:
                self._depth.value = depth
                if depth == 0:
                    with self._lock:
                        self.seconds += time.perf_counter() - t0
                        self.completions += count(*args, **kwargs)
                        self.calls += 1

        return timed

    def instrument(self, task: Any) -> Any:
        task.rewards = self.wrap(task.rewards, lambda prompt, completions: len(completions))  # type: ignore[method-assign]
        batch = getattr(task, "rewards_batch", None)
        if batch is not None:
            setattr(task, "rewards_batch", self.wrap(batch, lambda items: sum(len(c) for _, c in items)))  # noqa: B010
        return task


# ---------------------------------------------------------------------------------------------- batch mode
def measure_batch(repeats: int) -> dict[str, Any]:
    """In a child process (whichever dgrpo PYTHONPATH names): the batch scored ``repeats`` times per task,
    after one warm-up call; seconds of each call and the rewards of the last."""
    from dgrpo.tasks.arith_code import ArithCodeTask, make_prompt
    from dgrpo.tasks.code import HumanEvalTask

    humaneval = HumanEvalTask()
    prompts = [humaneval.train_prompt(i) for i in range(humaneval.num_train)] + humaneval.eval_prompts(1000)
    he_items = [(p, [p.answer, "    return None\n"]) for p in prompts]
    arith = ArithCodeTask()
    pairs = [(10 + 7 * i, 20 + 3 * i) for i in range(128)]
    ar_items = [(make_prompt("sum", a, b), [f"print({a}+{b})", f"print({a}-{b})"]) for a, b in pairs]
    out: dict[str, Any] = {"dgrpo": __import__("dgrpo").__file__}
    for name, task, items in (("humaneval", humaneval, he_items), ("arith-code", arith, ar_items)):
        task.rewards_batch(items[:4])  # warm-up: the sandbox probe, imports
        seconds = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            rewards = task.rewards_batch(items)
            seconds.append(time.perf_counter() - t0)
        out[name] = {"programs": sum(len(c) for _, c in items), "seconds": seconds, "rewards": rewards}
    return out


def run_batch_mode(args: argparse.Namespace) -> None:
    before_dir = Path(tempfile.mkdtemp(prefix="dgrpo-before-"))
    archive = subprocess.run(["git", "-C", str(REPO), "archive", args.before, "dgrpo"], capture_output=True, check=True)
    subprocess.run(["tar", "-x", "-C", str(before_dir)], input=archive.stdout, check=True)
    versions = {"before": before_dir, "after": REPO}
    runs: dict[str, list[dict[str, Any]]] = {"before": [], "after": []}
    for round_ in range(args.rounds_of_pairs):
        for version, root in versions.items():
            env = {**os.environ, "PYTHONPATH": str(root)}
            cmd = [sys.executable, __file__, "--child", "--repeats", str(args.repeats)]
            proc = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True, cwd=root)
            runs[version].append(json.loads(proc.stdout.strip().splitlines()[-1]))
            print(f"pair {round_ + 1}/{args.rounds_of_pairs}: {version} measured", flush=True)
    rows = []
    report: dict[str, Any] = {"before": args.before, "after": "this checkout", "repeats": args.repeats}
    for task in ("humaneval", "arith-code"):
        row: dict[str, Any] = {"task": task, "programs": runs["after"][0][task]["programs"]}
        for version in versions:
            seconds = [s for run in runs[version] for s in run[task]["seconds"]]
            row[f"{version}_programs_per_s"] = round(row["programs"] / statistics.median(seconds), 1)
            row[f"{version}_reward_sum"] = sum(sum(r) for r in runs[version][-1][task]["rewards"])
        row["cost_after_over_before"] = round(row["before_programs_per_s"] / row["after_programs_per_s"], 3)
        changed = [
            i
            for i, (a, b) in enumerate(
                zip(runs["before"][-1][task]["rewards"], runs["after"][-1][task]["rewards"], strict=True)
            )
            if a != b
        ]
        row["prompts_whose_rewards_differ"] = len(changed)
        rows.append(row)
    report["rows"] = rows
    print(
        f"{'task':12s} {'programs':>8s} {'before/s':>10s} {'after/s':>10s} {'cost':>6s} {'rewards before/after':>22s}"
    )
    for r in rows:
        print(
            f"{r['task']:12s} {r['programs']:8d} {r['before_programs_per_s']:10.1f} {r['after_programs_per_s']:10.1f}"
            f" {r['cost_after_over_before']:6.2f}x {r['before_reward_sum']:>10.0f} / {r['after_reward_sum']:<10.0f}"
        )
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "code_rewards_batch.json").write_text(json.dumps(report, indent=1) + "\n")
    with (args.out / "code_rewards_batch.csv").open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    print(f"wrote {args.out}/code_rewards_batch.json and .csv")


# ---------------------------------------------------------------------------------------------- scenario mode
def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batch", action="store_true", help="programs per second on a fixed batch, two versions")
    ap.add_argument("--before", default=BEFORE, help="the commit to compare with (batch mode)")
    ap.add_argument("--repeats", type=int, default=3, help="timed calls per task and process (batch mode)")
    ap.add_argument("--pairs", dest="rounds_of_pairs", type=int, default=3, help="before/after process pairs")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--scenario", default="code-horizontal")
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--set", "-s", action="append", default=[], help="scenario override, as in dgrpo simulate")
    args = ap.parse_args()
    if args.child:
        print(json.dumps(measure_batch(args.repeats)))
        return
    if args.batch:
        args.out = args.out or Path("runs/bench-code-batch")
        run_batch_mode(args)
        return
    args.out = args.out or Path("runs/bench-rewards")

    import dgrpo
    from dgrpo.simulations import runner
    from dgrpo.simulations.scenario import load_scenario

    clock = RewardClock()
    make_task = runner.get_task

    def get_task(name: str, **options: Any) -> Any:
        return clock.instrument(make_task(name, **options))

    runner.get_task = get_task  # type: ignore[assignment]
    scenario = load_scenario(Path(args.scenario), [f"rounds={args.rounds}", *args.set])
    t0 = time.perf_counter()
    summary = runner.run_simulation(scenario, args.out, overwrite=True)  # a new measurement: replace the last
    wall = time.perf_counter() - t0
    result = {
        "dgrpo": str(Path(dgrpo.__file__).resolve().parent),
        "scenario": scenario.name,
        "rounds": args.rounds,
        "reward_calls": clock.calls,
        "completions_scored": clock.completions,
        "reward_seconds": round(clock.seconds, 3),
        "reward_ms_per_completion": round(1000 * clock.seconds / max(1, clock.completions), 3),
        "wall_seconds": round(wall, 1),
        "reward_share_of_wall": round(clock.seconds / wall, 3),
        "accuracy": summary.accuracy,
        "asr": summary.asr,
        "final_accuracy": summary.final_accuracy,
        "final_asr": summary.final_asr,
    }
    (args.out / "reward_time.json").write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
