"""Reward time per completion on a code scenario (issue 9: isolation start-up must not dominate).

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
import json
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import dgrpo
from dgrpo.simulations import runner
from dgrpo.simulations.scenario import load_scenario
from dgrpo.tasks.base import Task


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

    def instrument(self, task: Task) -> Task:
        task.rewards = self.wrap(task.rewards, lambda prompt, completions: len(completions))  # type: ignore[method-assign]
        batch = getattr(task, "rewards_batch", None)
        if batch is not None:
            setattr(task, "rewards_batch", self.wrap(batch, lambda items: sum(len(c) for _, c in items)))  # noqa: B010
        return task


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--scenario", default="code-horizontal")
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--out", type=Path, default=Path("runs/bench-rewards"))
    ap.add_argument("--set", "-s", action="append", default=[], help="scenario override, as in dgrpo simulate")
    args = ap.parse_args()

    clock = RewardClock()
    make_task = runner.get_task

    def get_task(name: str, **options: Any) -> Task:
        return clock.instrument(make_task(name, **options))

    runner.get_task = get_task  # type: ignore[assignment]
    scenario = load_scenario(Path(args.scenario), [f"rounds={args.rounds}", *args.set])
    t0 = time.perf_counter()
    summary = runner.run_simulation(scenario, args.out)
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
        "accuracy": summary.get("accuracy"),
        "asr": summary.get("asr"),
        "final_accuracy": summary.get("final_accuracy"),
        "final_asr": summary.get("final_asr"),
    }
    (args.out / "reward_time.json").write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
