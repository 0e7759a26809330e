"""The homogeneous defenses on a real model: SmolLM2-135M-Instruct answering GSM8K questions, the way "Hail to
the Thief" (sec. 6.1) evaluates its logit check on Qwen2.5 (a BPE vocabulary of tens of thousands of tokens,
sampled with top-k 50), rather than on the tiny character-level models of the simulation matrix.

    .venv/bin/python benchmarks/defenses_real.py [--data ../shared/data/gsm8k] [--n 16] [--per-prompt 2]
                                                 [--max-new 128] [--top-k 50]

An author node samples the honest completions with the seeded sampler; a second node with the same weights
(a separate Learner, as a peer would be) checks three sets: the honest completions (false-positive rate),
the same completions with the TEXT attack's phrase put at the start of the reasoning, and with one computed
step made false, MATH-style (the first `a + b = c` / `a x b = c` the completion computes gets `c + 1`, the
attack's in-place edit `falsify_prose`, with the completion's own computation as the fact). SmolLM2 does not
write the `<think>` format, so the whole completion is the reasoning (layout `text`). Printed: rejected /
checked per set and defense.
"""

from __future__ import annotations

import argparse
import time

import torch

from dgrpo.adversary.facts import EQUATION_RE, parse_fact
from dgrpo.adversary.layout import layout
from dgrpo.adversary.math_step import falsify_prose
from dgrpo.adversary.text import TextOptions, insert_phrase
from dgrpo.config import LearnerConfig, ModelConfig
from dgrpo.defense import Candidate, DefenseChain, DefenseConfig, DefenseContext
from dgrpo.learner.learner import Learner
from dgrpo.learner.sampler import completion_seed
from dgrpo.protocol.messages import SamplingParams
from dgrpo.tasks import get_task

RUN, ROUND, AUTHOR = "bench-real", 1, "author"


def text_poison(completion: str) -> str | None:
    lay = layout(completion, "text")
    return None if lay is None else insert_phrase(lay, TextOptions().payload, "start", 0)


def math_poison(completion: str) -> str | None:
    """The first computation ``a op b = c`` of the completion made to state ``c + 1`` (``c + 2`` where
    ``c + 1`` happens to be right)."""
    m = next((m for m in EQUATION_RE.finditer(completion) if "." not in m.group(7)), None)
    if m is None:
        return None
    a, op, b, c = int(m.group(1)), m.group(3), int(m.group(5)), int(m.group(7))
    true = a + b if op == "+" else a * b
    false = c + 1 if c + 1 != true else c + 2  # the model's own step may be wrong already
    fact = parse_fact(f"{a}{op}{b}={false}")
    return falsify_prose(completion, "text", [fact], 0, insert=False)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", default="../shared/data/gsm8k")
    ap.add_argument("--model", default="pypi:SmolLM2-135M-Instruct")
    ap.add_argument("--n", type=int, default=16, help="GSM8K test questions")
    ap.add_argument("--per-prompt", type=int, default=2)
    ap.add_argument("--max-new", type=int, default=128)
    ap.add_argument("--top-k", type=int, default=50, help="the paper samples with top-k 50")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    task = get_task("gsm8k", data=args.data)
    prompts = task.eval_prompts(args.n)
    cfg = ModelConfig(name=args.model, chat_template=True)
    author, verifier = Learner(cfg, LearnerConfig()), Learner(cfg, LearnerConfig())
    sp = SamplingParams(temperature=1.0, top_k=args.top_k, top_p=1.0, max_new_tokens=args.max_new, seed=1)
    seeds = [[completion_seed(RUN, ROUND, AUTHOR, p.id, j) for j in range(args.per_prompt)] for p in prompts]
    t0 = time.perf_counter()
    outs = author.generate([p.text for p in prompts], args.per_prompt, sp, seeds=seeds)
    print(f"{args.model}: {len(prompts)} GSM8K questions x {args.per_prompt} completions generated in "
          f"{time.perf_counter() - t0:.1f} s (top-k {args.top_k}, temperature 1, seeded sampler)")  # fmt: skip
    attacks = {"text": text_poison, "math": math_poison}
    sets: dict[str, list[Candidate]] = {"honest": [], "text": [], "math": []}
    for p, completions in zip(prompts, outs, strict=True):
        for j, text in enumerate(completions):
            sets["honest"].append(Candidate(AUTHOR, p, text, j, sp, args.model))
            for name, attack in attacks.items():
                poisoned = attack(text)
                if poisoned is not None and poisoned != text:
                    sets[name].append(Candidate(AUTHOR, p, poisoned, j, sp, args.model))
    ctx = DefenseContext(task, verifier, sp, RUN, ROUND, args.model)
    print(f"{'defense':15} {'set':7} {'checked':>7} {'rejected':>8} {'rate':>6} {'seconds':>8}  reasons")
    for defense in ("logit", "sampling-proof"):
        for name, candidates in sets.items():
            chain = DefenseChain.from_config(DefenseConfig(chain=[defense]))
            t0 = time.perf_counter()
            verdicts = chain.run(ctx, candidates).verdicts
            seconds = time.perf_counter() - t0
            rejected = [v for v in verdicts if not v.accept]
            reasons = sorted({v.reason for v in rejected})
            n = len(candidates)
            print(f"{defense:15} {name:7} {n:7d} {len(rejected):8d} {len(rejected) / max(n, 1):6.3f} {seconds:8.1f}  "
                  f"{','.join(reasons)}")  # fmt: skip
    example = sets["math"][0].text if sets["math"] else ""
    print("example MATH-poisoned completion:", repr(example[:300]))


if __name__ == "__main__":
    main()
