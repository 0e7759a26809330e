"""Build the embedded default model ``dgrpo:tiny-arith``: a character-level tokenizer plus a tiny
Qwen2/Llama-style causal LM, warm-started by supervised learning on the ``arith`` and ``arith-code`` tasks.

The warm start stops early on purpose: as soon as the SAMPLED accuracy on held-out ``arith`` prompts reaches a
target window (default [0.30, 0.50], aiming near 0.40), so that GRPO later has both a learning signal and room
to improve. Everything is deterministic on a given machine: same command and seed give the same weights.

Usage::

    .venv/bin/python scripts/build_tiny_model.py --out dgrpo/assets/tiny-arith --arch qwen2 --seed 0
    .venv/bin/python scripts/build_tiny_model.py --out dgrpo/assets/tiny-arith-llama --arch llama --seed 1 \\
        --mix 1:1

The arith:arith-code mix decides whether arith-code is learnt by then (it has a sharp transition, earlier
with a larger share); arith-code examples pause while its sampled accuracy is above ``--code-pause-above``.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import hashlib
import json
import math
import platform
import random
import shlex
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import tokenizers
import torch
import transformers
from tiny_model_parts import (
    BOS_ID,
    EOS_ID,
    EVAL_N,
    MAX_NEW_TOKENS,
    PAD_ID,
    SAMPLING,
    EvalSet,
    accuracy,
    arith_completion,
    build_config,
    build_tokenizer,
    check_tokenizer,
    code_completion,
    code_correct,
    collate,
    count_params,
    encode_example,
)
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    GenerationConfig,
    PretrainedConfig,
    PreTrainedModel,
)

from dgrpo.seeds import stable_seed
from dgrpo.tasks.arith import ArithTask
from dgrpo.tasks.arith_code import ArithCodeTask


def parse_ratio(text: str) -> tuple[float, float]:
    a, _, c = text.partition(":")
    try:
        ra, rc = float(a), float(c)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"ratio must look like 3:1, got {text!r}") from exc
    if ra <= 0 or rc < 0:
        raise argparse.ArgumentTypeError("ratio parts must be positive (arith) and >= 0 (arith-code)")
    return ra, rc


def add_model_args(p: argparse.ArgumentParser) -> None:
    """Output, architecture and optimiser flags shared with ``build_tiny_model_v2.py``."""
    p.add_argument("--out", type=Path, required=True, help="output folder (overwritten)")
    p.add_argument("--arch", choices=["qwen2", "llama"], default="qwen2")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--intermediate", type=int, default=512)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--warmup-steps", type=int, default=20, help="linear warm-up, then constant lr")


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_model_args(p)
    p.add_argument("--weight-decay", type=float, default=0.0)
    p.add_argument("--mix", type=parse_ratio, default=(2.0, 1.0), help="arith:arith-code batch share")
    p.add_argument(
        "--code-pause-above",
        type=float,
        default=0.5,
        help="batches hold only arith while arith-code sampled acc is above this (1.0: never pause)",
    )
    p.add_argument("--max-steps", type=int, default=3000)
    p.add_argument("--eval-every", type=int, default=25, help="eval interval while far from the target")
    p.add_argument("--fine-every", type=int, default=5, help="eval interval near the target")
    p.add_argument("--fine-from", type=float, default=0.12, help="arith sampled acc that turns on fine evals")
    p.add_argument("--target-low", type=float, default=0.30)
    p.add_argument("--target-high", type=float, default=0.50)
    p.add_argument("--target-aim", type=float, default=0.40)
    p.add_argument("--eval-seed", type=int, default=1234)
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args(argv)
    if not args.target_low <= args.target_aim <= args.target_high:
        p.error("need target-low <= target-aim <= target-high")
    return args


@dataclass
class Snapshot:
    step: int
    loss: float
    arith: float
    code: float
    state: dict[str, torch.Tensor]


def distance_to_target(acc: float, low: float, high: float, aim: float) -> tuple[float, float]:
    outside = max(low - acc, acc - high, 0.0)
    return outside, abs(acc - aim)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    command = shlex.join([".venv/bin/python", "scripts/build_tiny_model.py", *sys.argv[1:]])
    torch.set_num_threads(args.threads)
    with contextlib.suppress(RuntimeError):  # already set in this process
        torch.set_num_interop_threads(1)
    torch.use_deterministic_algorithms(True)
    torch.manual_seed(args.seed)
    t0 = time.perf_counter()

    tok = build_tokenizer()
    config = build_config(args.arch, len(tok), args.hidden, args.layers, args.intermediate)
    auto_class: Any = AutoModelForCausalLM  # untyped in transformers
    model: PreTrainedModel = auto_class.from_config(config, dtype=torch.float32)
    n_params = count_params(model)
    print(f"arch={args.arch} seed={args.seed} params={n_params:,} vocab={len(tok)}", flush=True)

    arith = ArithTask()
    code = ArithCodeTask()  # prompts only: the build never runs a program (see code_correct)
    code_note = "from dgrpo.tasks.arith_code"
    evals = [
        EvalSet("arith", arith.eval_prompts(EVAL_N), lambda p, c: arith.reward(p, c) == 1.0),
        EvalSet("arith-code", code.eval_prompts(EVAL_N), code_correct),
    ]
    wa, wc = args.mix
    n_code = round(args.batch_size * wc / (wa + wc))
    n_arith = args.batch_size - n_code
    print(f"batch: {n_arith} arith + {n_code} arith-code; {code_note}", flush=True)

    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=args.weight_decay)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / args.warmup_steps) if args.warmup_steps > 0 else 1.0
    )
    data_rng = random.Random(stable_seed("tiny-arith-data", args.seed))
    model.train()

    best: Snapshot | None = None  # in-window snapshot closest to the aim
    last: Snapshot | None = None
    chosen: Snapshot | None = None
    reason = ""
    code_steps_at: dict[int, int] = {}
    loss_ema = math.nan
    fine = False
    code_active = True  # arith-code examples are paused while its sampled accuracy is above --code-pause-above
    code_steps = 0
    step = 0
    while step < args.max_steps:
        batch = [
            encode_example(tok, pr.text, arith_completion(pr))
            for pr in (
                arith.train_prompt(data_rng.randrange(arith.num_train))
                for _ in range(n_arith if code_active else args.batch_size)
            )
        ] + [
            encode_example(tok, pr.text, code_completion(pr))
            for pr in (
                code.train_prompt(data_rng.randrange(code.num_train)) for _ in range(n_code if code_active else 0)
            )
        ]
        out = model(**collate(batch))
        opt.zero_grad(set_to_none=True)
        out.loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        step += 1
        code_steps += code_active
        loss = float(out.loss.detach())
        loss_ema = loss if math.isnan(loss_ema) else 0.9 * loss_ema + 0.1 * loss

        if step % (args.fine_every if fine else args.eval_every) != 0:
            continue
        acc_a = accuracy(model, tok, evals[0], sample=True, seed=args.eval_seed)
        acc_c = accuracy(model, tok, evals[1], sample=True, seed=args.eval_seed)
        elapsed = time.perf_counter() - t0
        print(
            f"step {step:5d}  loss {loss_ema:.4f}  arith {acc_a:.3f}  arith-code {acc_c:.3f}  elapsed {elapsed:6.1f}s",
            flush=True,
        )
        code_steps_at[step] = code_steps
        snap = Snapshot(step, loss_ema, acc_a, acc_c, copy.deepcopy(model.state_dict()))
        fine = fine or acc_a >= args.fine_from
        if code_active != (acc_c <= args.code_pause_above):
            code_active = not code_active
            print(f"  arith-code examples {'resumed' if code_active else 'paused'}", flush=True)
        in_window = args.target_low <= acc_a <= args.target_high
        if in_window and (best is None or abs(acc_a - args.target_aim) < abs(best.arith - args.target_aim)):
            best = snap
        if in_window and acc_a >= args.target_aim:
            chosen, reason = snap, "first eval in the target window at or above the aim"
            break
        if acc_a > args.target_high:
            candidates = [s for s in (best, last) if s is not None] + [snap]
            chosen = min(
                candidates,
                key=lambda s: distance_to_target(s.arith, args.target_low, args.target_high, args.target_aim),
            )
            reason = f"overshot the window at step {step}; kept the closest evaluated step"
            break
        last = snap
    if chosen is None:
        candidates = [s for s in (best, last) if s is not None]
        if not candidates:
            raise SystemExit("no evaluation ran; raise --max-steps or lower --eval-every")
        chosen = min(
            candidates,
            key=lambda s: distance_to_target(s.arith, args.target_low, args.target_high, args.target_aim),
        )
        reason = f"max steps ({args.max_steps}) reached; kept the closest evaluated step"
    model.load_state_dict(chosen.state)
    train_wall = time.perf_counter() - t0
    print(f"keeping step {chosen.step}: {reason}", flush=True)

    # ---- save (fp32), then reload from disk and measure what was shipped
    out_dir: Path = args.out
    out_dir.mkdir(parents=True, exist_ok=True)
    for stale in out_dir.iterdir():
        if stale.is_file():
            stale.unlink()
    generation_class: Any = GenerationConfig  # untyped in transformers
    model.generation_config = generation_class(
        **SAMPLING,
        max_new_tokens=MAX_NEW_TOKENS,
        pad_token_id=PAD_ID,
        bos_token_id=BOS_ID,
        eos_token_id=EOS_ID,
    )
    if any(p.dtype != torch.float32 for p in model.parameters()):
        raise AssertionError("the model must be saved in fp32")
    model.save_pretrained(out_dir, safe_serialization=True)
    build_tokenizer().save_pretrained(out_dir)  # a fresh one: eval set left padding on `tok`

    loaded = AutoModelForCausalLM.from_pretrained(out_dir, dtype=torch.float32)
    loaded_tok = AutoTokenizer.from_pretrained(out_dir)
    check_tokenizer(loaded_tok)
    if loaded_tok.padding_side != "right" or "padding_side" in (out_dir / "tokenizer_config.json").read_text():
        raise AssertionError("the saved tokenizer must not store a padding side")
    if json.loads((out_dir / "tokenizer.json").read_text()).get("padding") is not None:
        raise AssertionError("the saved tokenizer.json must not enable padding")
    for a, b in zip(model.state_dict().values(), loaded.state_dict().values(), strict=True):
        if not torch.equal(a, b):
            raise AssertionError("reloaded weights differ from the trained ones")
    results = {
        f"{ev.name} {mode}": accuracy(loaded, loaded_tok, ev, sample=mode == "sampled", seed=args.eval_seed)
        for ev in evals
        for mode in ("sampled", "greedy")
    }
    weights = out_dir / "model.safetensors"
    for f in out_dir.iterdir():
        f.chmod(0o644)  # shipped as package data
    digest = hashlib.sha256(weights.read_bytes()).hexdigest()
    sizes = {f.name: f.stat().st_size for f in sorted(out_dir.iterdir()) if f.is_file()}
    total_wall = time.perf_counter() - t0
    print(json.dumps({"step": chosen.step, **results, "sha256": digest}), flush=True)

    card = render_card(
        args,
        command,
        config,
        n_params,
        n_arith,
        n_code,
        code_steps_at[chosen.step],
        chosen,
        reason,
        train_wall,
        total_wall,
        results,
        digest,
        code_note,
    )
    (out_dir / "MODEL_CARD.md").write_text(card)
    sizes["MODEL_CARD.md"] = (out_dir / "MODEL_CARD.md").stat().st_size
    print(f"saved {out_dir} ({sum(sizes.values()) / 1e6:.2f} MB): {sizes}", flush=True)
    print(f"wall time {total_wall:.1f}s", flush=True)
    return 0


def render_card(
    args: argparse.Namespace,
    command: str,
    config: PretrainedConfig,
    n_params: int,
    n_arith: int,
    n_code: int,
    code_steps: int,
    chosen: Snapshot,
    reason: str,
    train_wall: float,
    total_wall: float,
    results: dict[str, float],
    digest: str,
    code_note: str,
) -> str:
    name = args.out.name
    r = results
    lines = [
        f"# {name}",
        "",
        f"A tiny character-level causal LM ({args.arch}, {n_params:,} parameters, fp32), an embedded model of `dgrpo`",
        f"(load it by the name `dgrpo:{name}`, or with `AutoModelForCausalLM.from_pretrained(<this folder>)` and",
        "`AutoTokenizer.from_pretrained(<this folder>)`). It was warm-started by plain supervised learning on the",
        "`arith` and `arith-code` tasks and stopped EARLY on purpose, when its sampled accuracy on held-out `arith`",
        f"prompts reached the target window [{args.target_low:.2f}, {args.target_high:.2f}] (aim"
        f" {args.target_aim:.2f}): GRPO needs both a learning signal and room to improve.",
        "",
        "## How it was made",
        "",
        f"    {command}",
        "",
        f"- script `scripts/build_tiny_model.py`, seed {args.seed}, deterministic CPU training with {args.threads}"
        " threads: the same command and seed give the same weights on the same machine and library versions.",
        f"- architecture: `{type(config).__name__}`, hidden {config.hidden_size}, {config.num_hidden_layers} layers,"
        f" {config.num_attention_heads} attention heads, {config.num_key_value_heads} key/value heads, intermediate"
        f" {config.intermediate_size}, max positions {config.max_position_embeddings}, tied embeddings,"
        f" vocabulary {config.vocab_size}; {n_params:,} parameters.",
        "- tokenizer: one token per character (a BPE vocabulary with no merges, spelled in the byte-level alphabet",
        "  with a ByteLevel pre-tokenizer and decoder, so that transformers' `Qwen2Tokenizer`, which `AutoTokenizer`",
        "  picks for a qwen2 folder, reads it the same way): `<pad>`=0, `<bos>`=1, `<eos>`=2, `<unk>`=3, then",
        "  printable ASCII 32..126 and newline. Nothing is added automatically (no BOS/EOS), no chat template.",
        "  Printable ASCII and newlines round-trip exactly; other characters become `<unk>` (dropped by",
        "  `Qwen2Tokenizer`).",
        f"- data: each batch of {args.batch_size} = {n_arith} `arith` + {n_code} `arith-code` training prompts"
        f" (mix {args.mix[0]:g}:{args.mix[1]:g}); input = prompt + completion + `<eos>`, loss on the completion"
        " and `<eos>` only.",
        f"- `arith-code` examples were paused (batches of {args.batch_size} `arith` only) while the arith-code"
        f" sampled accuracy at the last evaluation was above {args.code_pause_above:g}; they were in"
        f" {code_steps} of the {chosen.step} steps. arith-code prompts: {code_note}.",
        f"- optimiser: AdamW, lr {args.lr:g} (linear warm-up {args.warmup_steps} steps, then constant), weight"
        f" decay {args.weight_decay:g}, gradient clipping 1.0, fp32.",
        f"- stopped at step {chosen.step} ({reason}); training loss (EMA) {chosen.loss:.4f}.",
        f"- wall time: {train_wall:.1f} s training with evaluations, {total_wall:.1f} s in all.",
        f"- library versions: torch {torch.__version__}, transformers {transformers.__version__}, tokenizers"
        f" {tokenizers.__version__}, Python {platform.python_version()}.",
        f"- `model.safetensors` sha256: `{digest}`",
        "",
        "## Measured accuracy at the saved step",
        "",
        f"On {EVAL_N} held-out prompts of each task (`eval_prompts({EVAL_N})`), at most {MAX_NEW_TOKENS} new"
        " tokens, completion = new tokens up to `<eos>`, one left-padded batch per task. Sampled: temperature 1.0,",
        f"top_k 10, top_p 1.0, `torch.manual_seed({args.eval_seed})` before generating. `arith` is scored with"
        " `ArithTask.reward`; `arith-code` by exact match with the reference program or a safe (non-executing)",
        "check that a `print(a+b)` / `print(a*b)` completion gives the answer.",
        "",
        "| task | sampled | greedy |",
        "| --- | --- | --- |",
        f"| arith | {r['arith sampled']:.3f} | {r['arith greedy']:.3f} |",
        f"| arith-code | {r['arith-code sampled']:.3f} | {r['arith-code greedy']:.3f} |",
        "",
        "`generation_config.json` holds the sampling defaults of the tiny setting (do_sample, temperature 1.0,",
        f"top_k 10, top_p 1.0, max_new_tokens {MAX_NEW_TOKENS}). Formats: `345+78=` ->"
        " `5+8+0=13,4+7+1=12,3+0+1=4>423`; `print the sum of 345 and 78:` -> `print(345+78)`.",
    ]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    raise SystemExit(main())
