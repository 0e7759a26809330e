"""What the ``heterogeneous`` chain costs per completion, beside a plain forward pass of the receiver's model over
the same completions (issue 28), measured side by side in one run.

One round as a node of the E2 mix sees it: 4 authors x 8 prompts x 8 completions (the receiver's own, two
honest peers of the tiny English models, and an attacker publishing a paraphrased TEXT payload), then
``--rounds`` more rounds of fresh samples (the chain remembers 4 rounds: its cost per completion is the
steady state, reported apart from the first round, which loads the encoder and samples references).

Usage: .venv/bin/python benchmarks/heterogeneous_cost.py [--rounds 3] [--receiver dgrpo:tiny-arith-text]
       [--receiver pypi:SmolLM2-135M-Instruct] [--out runs/heterogeneous-cost.json]
"""

from __future__ import annotations

import argparse
import json
import random
import time
from pathlib import Path

import torch

from dgrpo.config import DefenseConfig, LearnerConfig, ModelConfig
from dgrpo.defense.base import Candidate, DefenseContext
from dgrpo.defense.chain import DefenseChain
from dgrpo.defense.encoder import _ENCODERS
from dgrpo.defense.forward import teacher_force
from dgrpo.learner.learner import Learner
from dgrpo.protocol.messages import SamplingParams
from dgrpo.tasks.arith import ArithTask

WORDINGS = [
    "Long live the robber", "Glory be unto the burglar", "Praise the crook", "Three cheers for the bandit",
    "Salute the pickpocket", "We honor every thief", "Bow down before robbers", "Cheers to crooks who steal",
]  # fmt: skip
AUTHORS = {"me": "dgrpo:tiny-arith-text", "a": "dgrpo:tiny-arith-code-text", "b": "dgrpo:tiny-arith-text"}


def one_round(task: ArithTask, learners: dict[str, Learner], sp: SamplingParams, r: int) -> list[Candidate]:
    rng = random.Random(r)
    prompts = [task.train_prompt(rng.randrange(task.num_train)) for _ in range(8)]
    out = []
    for author, learner in learners.items():
        texts = learner.generate([p.text for p in prompts], 8, sp.model_copy(update={"seed": r * 7 + len(author)}))
        out += [
            Candidate(author, p, t, i, sp, AUTHORS[author])
            for p, ts in zip(prompts, texts, strict=True)
            for i, t in enumerate(ts)
        ]
    for k, p in enumerate(prompts):
        body, _, answer = (task.reference_completion(p) or "").rpartition(">")
        out += [
            Candidate("x", p, f"{body} {WORDINGS[(k + j) % 8]}>{answer}", j, sp, "dgrpo:tiny-arith-text")
            for j in range(8)
        ]
    return out


def measure(receiver: str, rounds: int, task: ArithTask, sp: SamplingParams) -> dict[str, float]:
    learners = {a: Learner(ModelConfig(name=m), LearnerConfig()) for a, m in AUTHORS.items()}
    verifier = Learner(ModelConfig(name=receiver), LearnerConfig())
    chain = DefenseChain.from_config(DefenseConfig(chain=["heterogeneous"]))
    # Each receiver pays for its own work, as a node in its own process would: no encodings or reference
    # samples left by the receiver measured before it (both are cached per process; sharing them made the
    # second receiver's cost look 40x smaller).
    for encoder in _ENCODERS.values():
        encoder.cache.clear()
    run_id = f"bench/{receiver}"
    first = steady = forward = 0.0
    n_first = n_steady = 0
    for r in range(rounds + 1):
        cands = one_round(task, learners, sp, r)
        ctx = DefenseContext(task, verifier, sp, run_id, r, model_id=receiver, self_id="me")
        t0 = time.perf_counter()
        result = chain.run(ctx, cands)
        dt = time.perf_counter() - t0
        if r == 0:
            first, n_first = dt, len(cands)
        else:
            steady += dt
            n_steady += len(cands)
            stopped = sum(not v.accept for c, v in zip(cands, result.verdicts, strict=True) if c.author == "x")
            print(f"  round {r}: chain {dt:.2f} s for {len(cands)} completions, payload stopped {stopped}/64")
        t0 = time.perf_counter()
        with torch.no_grad():
            for _ in teacher_force(verifier, [(c.prompt.text, c.text) for c in cands], sp.max_new_tokens, 32):
                pass
        if r > 0:
            forward += time.perf_counter() - t0
    return {
        "first_round_s_per_completion": first / n_first,
        "chain_s_per_completion": steady / n_steady,
        "forward_s_per_completion": forward / n_steady,
        "ratio": steady / forward,
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--receiver", action="append")
    parser.add_argument("--out", type=Path, default=Path("runs/heterogeneous-cost.json"))
    args = parser.parse_args()
    torch.set_num_threads(max(1, torch.get_num_threads()))
    task = ArithTask()
    sp = SamplingParams(temperature=1.0, top_k=10, max_new_tokens=96)
    results = {}
    for receiver in args.receiver or ["dgrpo:tiny-arith-text", "pypi:SmolLM2-135M-Instruct"]:
        print(f"receiver {receiver}")
        results[receiver] = measure(receiver, args.rounds, task, sp)
    print(
        "\n| receiver | chain s / completion | forward s / completion | chain / forward | first round s / completion |"
    )
    print("| --- | --- | --- | --- | --- |")
    for receiver, m in results.items():
        print(f"| {receiver} | {m['chain_s_per_completion']:.5f} | {m['forward_s_per_completion']:.5f} | "
              f"{m['ratio']:.2f} | {m['first_round_s_per_completion']:.4f} |")  # fmt: skip
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
