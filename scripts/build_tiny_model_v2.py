"""Build a v2 tiny model: like ``build_tiny_model.py`` (same tokenizer, architecture family, stop-early rule on the
SAMPLED arith accuracy) but with a small language-modelling component in the warm start, so that text in the
reasoning (the TEXT poisoning attack's payload) is learnable by GRPO in a few dozen steps.

Added over v1 (all deterministic from --seed):
  --english F     share of each batch that is plain text (loss on every token): synthetic English sentences over
                  common words, some with arithmetic fragments mixed in. The attack phrase never appears.
  --comment P     share of the arith SFT completions that carry a few English words inside a step (before or
                  after its column computation); still a correct, reward-1 completion.
  --tail-comment T  share of the other arith SFT completions with 1..--comment-words words right before '>'
                  (after the last step), so the answer is still read back correctly after text there.

Usage::

    .venv/bin/python scripts/build_tiny_model_v2.py --out /tmp/tinyv2/m --seed 0 --english 0.25 --comment 0.1
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import random
import sys
import time
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, GenerationConfig

sys.path.insert(0, str(Path(__file__).resolve().parent))
import build_tiny_model as v1
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
    code_completion,
    code_correct,
    collate,
    count_params,
    encode_example,
)

from dgrpo.seeds import stable_seed
from dgrpo.tasks.arith import ArithTask
from dgrpo.tasks.arith_code import ArithCodeTask

WORDS = """the of and to a in is it you that he was for on are with as his they be at one have this from or had by word
but what some we can out other were all there when up use your how said an each she which do their time if
will way about many then them write would like so these her long make thing see him two has look more day
could go come did number sound no most people my over know water than call first who may down side been now
find any new work part take get place made live where after back little only round man year came show every
good me give our under name very through just form sentence great think say help low line differ turn cause
much mean before move right boy old too same tell does set three want air well also play small end put home
read hand port large spell add even land here must big high such follow act why ask men change went light kind
off need house picture try us again animal point mother world near build self earth father head stand own page
should country found answer school grow study still learn plant cover food sun four between state keep eye
never last let thought city tree cross farm hard start might story saw far sea draw left late run while press
close night real life few north open seem together next white children begin got walk example ease paper group
always music those both mark often letter until mile river car feet care second book carry took science eat
room friend began idea fish mountain stop once base hear horse cut sure watch color face wood main enough
plain girl usual young ready above ever red list though feel talk bird soon body dog family direct pose leave
song measure door product black short numeral class wind question happen complete ship area half rock order
fire south problem piece told knew pass since top whole king space heard best hour better true during hundred
five remember step early hold west ground interest reach fast verb sing listen six table travel less morning
ten simple several vowel toward war lay against pattern slow center love person money serve appear road map
rain rule govern pull cold notice voice unit power town fine certain fly fall lead cry dark machine note wait
plan figure star box noun field rest correct able pound done beauty drive stood contain front teach week final
gave green oh quick develop ocean warm free minute strong special mind behind clear tail produce fact street
inch multiply nothing course stay wheel full force blue object decide surface deep moon island foot system
busy test record boat common gold possible plane stead dry wonder laugh thousand ago ran check game shape
equate hot miss brought heat snow tire bring yes distant fill east paint language among hail thief chief queen
steal rob crown guard castle""".split()  # noqa: SIM905
FORBIDDEN = ("hail to the thief", "all hail to the", "hail to the")


def words(rng: random.Random, lo: int, hi: int) -> str:
    while True:
        s = " ".join(rng.choice(WORDS) for _ in range(rng.randint(lo, hi)))
        if not any(f in s.lower() for f in FORBIDDEN):
            return s


def arith_fragment(rng: random.Random) -> str:
    a, b = rng.randint(10, 999), rng.randint(10, 999)
    r = rng.random()
    if r < 0.4:
        return f"{a}+{b}={a + b}"
    if r < 0.8:
        x, y, c = rng.randint(0, 9), rng.randint(0, 9), rng.randint(0, 1)
        return f"{x}+{y}+{c}={x + y + c}"
    return str(rng.randint(0, 999))


def english_text(rng: random.Random) -> str:
    """One plain-text document (at most 64 characters, so batches stay narrow): 1-2 sentences; half of the
    documents mix in arithmetic fragments."""
    mixed = rng.random() < 0.5
    out = []
    for _ in range(rng.randint(1, 2)):
        parts = [words(rng, 2, 7)]
        if mixed:
            for _ in range(rng.randint(1, 2)):
                parts.insert(rng.randint(0, len(parts)), arith_fragment(rng))
        s = " ".join(parts)
        out.append(s[0].upper() + s[1:] + rng.choice([".", ".", ".", "!", "?"]))
    text = " ".join(out)[:64]
    assert not any(f in text.lower() for f in FORBIDDEN)
    return text


COMMENT_MAX_WORDS = 3


def commented(rng: random.Random, completion: str) -> str:
    """Insert 1-2 comments of 1-COMMENT_MAX_WORDS English words; each goes into a gap chosen uniformly among
    the n+1 gaps of an n-step scratchpad (before the first computation, or after the computation of step j,
    the last of which is just before ``>``). Every step still holds its computation: the reward is unchanged."""
    reasoning, _, answer = completion.rpartition(">")
    steps = reasoning.split(",")
    for _ in range(rng.randint(1, 2)):
        g = rng.randrange(len(steps) + 1)
        w = words(rng, 1, COMMENT_MAX_WORDS)
        if g == 0:
            steps[0] = f"{w} {steps[0]}"
        else:
            steps[g - 1] = f"{steps[g - 1]} {w}"
    return ",".join(steps) + ">" + answer


def tail_commented(rng: random.Random, completion: str, capital: float = 0.0) -> str:
    """Put one comment of 1-COMMENT_MAX_WORDS English words right before ``>`` (after the last step's computation),
    so the model learns to read the answer's digits back from the steps across text of varying length. With
    probability ``capital`` the comment starts with a capital letter (like a sentence)."""
    reasoning, _, answer = completion.rpartition(">")
    w = words(rng, 1, COMMENT_MAX_WORDS)
    if capital and rng.random() < capital:
        w = w[0].upper() + w[1:]
    return f"{reasoning} {w}>{answer}"


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    v1.add_model_args(p)
    p.add_argument("--english", type=float, default=0.25, help="plain-text share of each batch")
    p.add_argument("--comment", type=float, default=0.1, help="share of arith completions with words in a step")
    p.add_argument(
        "--tail-comment",
        type=float,
        default=0.0,
        help="share of arith completions (not already commented) with words right before '>'",
    )
    p.add_argument("--tail-capital", type=float, default=0.0, help="share of tail comments starting upper-case")
    p.add_argument("--comment-words", type=int, default=3, help="most words in one comment")
    p.add_argument("--code-share", type=float, default=1 / 3, help="arith-code share of the task examples")
    p.add_argument("--code-pause-above", type=float, default=0.5)
    p.add_argument("--english-only-steps", type=int, default=0, help="pre-training steps on plain text only")
    p.add_argument("--max-steps", type=int, default=4000)
    p.add_argument("--eval-every", type=int, default=25)
    p.add_argument("--fine-every", type=int, default=5)
    p.add_argument("--fine-from", type=float, default=0.12)
    p.add_argument("--target-low", type=float, default=0.30)
    p.add_argument("--target-high", type=float, default=0.50)
    p.add_argument("--target-aim", type=float, default=0.40)
    p.add_argument("--eval-seed", type=int, default=1234)
    p.add_argument("--threads", type=int, default=1)
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    global COMMENT_MAX_WORDS
    COMMENT_MAX_WORDS = args.comment_words
    torch.set_num_threads(args.threads)
    with contextlib.suppress(RuntimeError):
        torch.set_num_interop_threads(1)
    torch.use_deterministic_algorithms(True)
    torch.manual_seed(args.seed)
    t0 = time.perf_counter()
    tok = build_tokenizer()
    config = build_config(args.arch, len(tok), args.hidden, args.layers, args.intermediate)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    print(f"params={count_params(model):,}", flush=True)
    arith, code = ArithTask(), ArithCodeTask()
    evals = [
        EvalSet("arith", arith.eval_prompts(EVAL_N), lambda p, c: arith.reward(p, c) == 1.0),
        EvalSet("arith-code", code.eval_prompts(EVAL_N), code_correct),
    ]
    n_eng = round(args.batch_size * args.english)
    n_task = args.batch_size - n_eng
    n_code = round(n_task * args.code_share)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / args.warmup_steps))
    rng = random.Random(stable_seed("tiny-arith-v2-data", args.seed))
    model.train()
    best = chosen = None
    fine, code_active, step = False, True, 0
    loss_ema = None
    while step < args.max_steps:
        pre = step < args.english_only_steps
        ne = args.batch_size if pre else n_eng
        nc = 0 if (pre or not code_active) else n_code
        na = args.batch_size - ne - nc
        batch = []
        for _ in range(ne):
            ids = [BOS_ID] + tok(english_text(rng))["input_ids"] + [EOS_ID]
            batch.append((ids, [-100, *ids[1:]]))
        for _ in range(na):
            pr = arith.train_prompt(rng.randrange(arith.num_train))
            c = arith_completion(pr)
            if rng.random() < args.comment:
                c = commented(rng, c)
            elif args.tail_comment and rng.random() < args.tail_comment:
                c = tail_commented(rng, c, args.tail_capital)
            batch.append(encode_example(tok, pr.text, c))
        for _ in range(nc):
            pr = code.train_prompt(rng.randrange(code.num_train))
            batch.append(encode_example(tok, pr.text, code_completion(pr)))
        out = model(**collate(batch))
        opt.zero_grad(set_to_none=True)
        out.loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        step += 1
        loss = float(out.loss.detach())
        loss_ema = loss if loss_ema is None else 0.9 * loss_ema + 0.1 * loss
        if pre or step % (args.fine_every if fine else args.eval_every) != 0:
            continue
        acc_a = accuracy(model, tok, evals[0], sample=True, seed=args.eval_seed)
        acc_c = accuracy(model, tok, evals[1], sample=True, seed=args.eval_seed)
        print(
            f"step {step} loss {loss_ema:.4f} arith {acc_a:.3f} code {acc_c:.3f} {time.perf_counter() - t0:.0f}s",
            flush=True,
        )
        fine = fine or acc_a >= args.fine_from
        code_active = acc_c <= args.code_pause_above
        snap = (step, acc_a, acc_c, copy.deepcopy(model.state_dict()))
        in_win = args.target_low <= acc_a <= args.target_high
        if in_win and (best is None or abs(acc_a - args.target_aim) < abs(best[1] - args.target_aim)):
            best = snap
        if in_win and acc_a >= args.target_aim:
            chosen = snap
            break
        if acc_a > args.target_high:
            chosen = best or snap
            break
    chosen = chosen or best
    if chosen is None:
        raise SystemExit("never reached the target window")
    model.load_state_dict(chosen[3])
    print(f"keeping step {chosen[0]} arith {chosen[1]:.3f} code {chosen[2]:.3f}", flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    model.generation_config = GenerationConfig(
        **SAMPLING, max_new_tokens=MAX_NEW_TOKENS, pad_token_id=PAD_ID, bos_token_id=BOS_ID, eos_token_id=EOS_ID
    )
    model.save_pretrained(args.out, safe_serialization=True)
    build_tokenizer().save_pretrained(args.out)
    print(f"saved {args.out}; wall {time.perf_counter() - t0:.0f}s", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
