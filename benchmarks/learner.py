"""Tokens per second of one GRPO update (forward, backward, clip, Adam step): dgrpo's learner vs TRL's
GRPOTrainer loss on the same model and the same batch, measured side by side in one run.

    .venv/bin/python benchmarks/learner.py [--model dgrpo:tiny-arith] [--batch 64] [--repeats 5]

Both sides get an identical copy of the weights, the same fp32 precision, the same batch (prompts from the
``arith`` task, completions of the model itself) and non-zero advantages for every sequence, so that our
skipping of zero-advantage sequences gives us no advantage here. The ratio printed is ours / TRL's.
"""

from __future__ import annotations

import argparse
import random
import statistics
import tempfile
import time

import torch
from datasets import Dataset
from trl import GRPOConfig, GRPOTrainer

from dgrpo.config import LearnerConfig, ModelConfig
from dgrpo.learner.batch import TrainSample
from dgrpo.learner.grpo import group_advantages
from dgrpo.learner.learner import Learner
from dgrpo.protocol.messages import SamplingParams
from dgrpo.tasks import get_task


def make_batch(learner: Learner, n: int, max_new: int, real_advantages: bool) -> list[TrainSample]:
    """``n`` completions of the model itself for ``n/8`` arith prompts (groups of 8). With real advantages,
    groups whose completions all earn the same reward have advantage 0, as in a real round."""
    task = get_task("arith")
    prompts = task.sample_prompts(n // 8, "bench")
    texts = learner.generate([p.text for p in prompts], 8, SamplingParams(top_k=10, max_new_tokens=max_new, seed=1))
    rng = random.Random(0)
    rewards = [task.reward(p, t) for p, group in zip(prompts, texts, strict=True) for t in group]
    groups = [p.id for p in prompts for _ in range(8)]
    advantages = group_advantages(rewards, groups) if real_advantages else [rng.choice([-1.0, 1.0]) for _ in rewards]
    pairs = [(p, t) for p, group in zip(prompts, texts, strict=True) for t in group]
    return [
        TrainSample(learner.encode_prompt(p.text), learner.encode_completion(t, max_new), a)
        for (p, t), a in zip(pairs, advantages, strict=True)
    ]


def trl_inputs(samples: list[TrainSample], pad: int) -> dict[str, torch.Tensor]:
    pw = max(len(s.prompt_ids) for s in samples)
    cw = max(len(s.completion_ids) for s in samples)
    return {
        "prompt_ids": torch.tensor([[pad] * (pw - len(s.prompt_ids)) + list(s.prompt_ids) for s in samples]),
        "prompt_mask": torch.tensor([[0] * (pw - len(s.prompt_ids)) + [1] * len(s.prompt_ids) for s in samples]),
        "completion_ids": torch.tensor(
            [list(s.completion_ids) + [pad] * (cw - len(s.completion_ids)) for s in samples]
        ),
        "completion_mask": torch.tensor(
            [[1] * len(s.completion_ids) + [0] * (cw - len(s.completion_ids)) for s in samples]
        ),
        "advantages": torch.tensor([s.advantage for s in samples]),
        "num_items_in_batch": torch.tensor(float(sum(len(s.completion_ids) for s in samples))),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="dgrpo:tiny-arith")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--loss-type", default="dapo", choices=["grpo", "dr_grpo", "dapo"])
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    cfg = LearnerConfig(loss_type=args.loss_type, micro_batch_size=32, max_grad_norm=1.0)
    ours = Learner(ModelConfig(name=args.model), cfg)
    theirs = Learner(ModelConfig(name=args.model), cfg)  # an identical, separate copy for TRL
    for real in (False, True):
        samples = make_batch(ours, args.batch, args.max_new_tokens, real)
        label = (
            f"real round batch ({sum(s.advantage == 0 for s in samples)} of {len(samples)} advantages are 0)"
            if real
            else "every advantage non-zero"
        )
        compare(ours, theirs, samples, args, cfg, label)


def compare(
    ours: Learner, theirs: Learner, samples: list[TrainSample], args: argparse.Namespace, cfg: LearnerConfig, label: str
) -> None:
    tokens = sum(len(s.completion_ids) for s in samples)

    trainer = GRPOTrainer(
        model=theirs.model,
        reward_funcs=lambda completions, **kw: [0.0] * len(completions),
        args=GRPOConfig(
            output_dir=tempfile.mkdtemp(),
            per_device_train_batch_size=args.batch,
            num_generations=4,
            max_completion_length=args.max_new_tokens,
            loss_type=args.loss_type,
            beta=0.0,
            learning_rate=cfg.lr,
            max_grad_norm=1.0,
            bf16=False,
            use_cpu=True,
            report_to=[],
            save_strategy="no",
        ),
        train_dataset=Dataset.from_list([{"prompt": "1+2="}] * args.batch),
        processing_class=theirs.tokenizer,
    )
    trainer.current_gradient_accumulation_steps = 1
    optimizer = torch.optim.Adam(trainer.model.parameters(), lr=cfg.lr)
    inputs = trl_inputs(samples, ours.pad_id)

    def trl_step() -> None:
        trainer.model.train()
        optimizer.zero_grad(set_to_none=True)
        loss = trainer.compute_loss(trainer.model, inputs)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(trainer.model.parameters(), 1.0)
        optimizer.step()

    def ours_step() -> None:
        ours.train_step(samples, 1.0, args.max_new_tokens)

    timings: dict[str, list[float]] = {"dgrpo": [], "trl": []}
    for _ in range(args.repeats + 1):  # the first round warms up both and is discarded
        for name, fn in (("dgrpo", ours_step), ("trl", trl_step)):
            t0 = time.perf_counter()
            fn()
            timings[name].append(time.perf_counter() - t0)
    med = {k: statistics.median(v[1:]) for k, v in timings.items()}
    tps = {k: tokens / v for k, v in med.items()}
    print(f"{label}: model {args.model}, {len(samples)} sequences, {tokens} completion tokens, loss {args.loss_type}")
    for k in ("dgrpo", "trl"):
        print(f"  {k:6s} median step {med[k] * 1000:8.1f} ms   {tps[k]:10.0f} tokens/s")
    print(f"ratio dgrpo/trl tokens per second: {tps['dgrpo'] / tps['trl']:.2f}  (target >= 1.0)")


if __name__ == "__main__":
    main()
