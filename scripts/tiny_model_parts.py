"""The parts of the tiny models' build (``build_tiny_model.py``, ``build_tiny_model_v2.py``): the
character-level tokenizer, the model configuration, the warm-start examples and batches, sampled generation
and accuracy. Split out of ``build_tiny_model.py`` unchanged: a rebuild gives byte-identical weights.
"""

from __future__ import annotations

import random
import re
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import (
    LlamaConfig,
    PretrainedConfig,
    PreTrainedModel,
    PreTrainedTokenizerFast,
    Qwen2Config,
)

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from dgrpo.tasks.base import Prompt  # noqa: E402

SPECIAL_TOKENS = ["<pad>", "<bos>", "<eos>", "<unk>"]
PAD_ID, BOS_ID, EOS_ID, UNK_ID = 0, 1, 2, 3
CHARS = [chr(c) for c in range(32, 127)] + ["\n"]
MODEL_MAX_LENGTH = 512

# Sampling settings of the tiny setting (a ~100-symbol vocabulary needs a proportionate top-k).
SAMPLING: dict[str, Any] = {"do_sample": True, "temperature": 1.0, "top_k": 10, "top_p": 1.0}
MAX_NEW_TOKENS = 48
EVAL_N = 128


# --------------------------------------------------------------------------------------------- tokenizer


def byte_level_symbol(char: str) -> str:
    """The GPT-2 byte-level alphabet's symbol for a one-byte character (``" "`` -> ``"Ġ"``, ``"\\n"`` -> ``"Ċ"``)."""
    (code,) = char.encode("utf-8")
    if 33 <= code <= 126 or 161 <= code <= 172 or 174 <= code <= 255:
        return chr(code)
    shifted = [b for b in range(256) if not (33 <= b <= 126 or 161 <= b <= 172 or 174 <= b <= 255)]
    return chr(256 + shifted.index(code))


def build_tokenizer() -> PreTrainedTokenizerFast:
    """A character-level tokenizer: one token per character, no merges.

    The vocabulary is spelled in the byte-level alphabet (space is ``Ġ``, newline ``Ċ``) with a ByteLevel
    pre-tokenizer and decoder, because transformers 5's ``AutoTokenizer`` loads a folder whose config says
    ``qwen2`` as ``Qwen2Tokenizer``, which rebuilds a byte-level pipeline from the vocabulary: spelled this way,
    both loading paths give the same ids and the same exact round trip.
    """
    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS + [byte_level_symbol(c) for c in CHARS])}
    assert len(vocab) == len(SPECIAL_TOKENS) + len(CHARS), "duplicate vocabulary entries"
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    backend.decoder = decoders.ByteLevel()
    backend.add_special_tokens(SPECIAL_TOKENS)
    fast_class: Any = PreTrainedTokenizerFast  # untyped in transformers
    tok: PreTrainedTokenizerFast = fast_class(
        tokenizer_object=backend,
        pad_token="<pad>",
        bos_token="<bos>",
        eos_token="<eos>",
        unk_token="<unk>",
        model_max_length=MODEL_MAX_LENGTH,
    )
    check_tokenizer(tok)
    return tok


def check_tokenizer(tok: Any) -> None:
    ids = {"pad": tok.pad_token_id, "bos": tok.bos_token_id, "eos": tok.eos_token_id, "unk": tok.unk_token_id}
    if ids != {"pad": PAD_ID, "bos": BOS_ID, "eos": EOS_ID, "unk": UNK_ID}:
        raise AssertionError(f"special token ids {ids}")
    if len(tok) != len(SPECIAL_TOKENS) + len(CHARS):
        raise AssertionError(f"vocabulary size {len(tok)}")
    if len(tok("345+78=")["input_ids"]) != 7:
        raise AssertionError("'345+78=' must encode to exactly 7 ids (no BOS/EOS insertion)")
    samples = [
        "".join(CHARS),
        "  leading and trailing spaces  ",
        "line one\nline two\n\n  indented\n",
        "print(345+78)",
        "5+8+0=13,4+7+1=12,3+0+1=4>423",
    ]
    rng = random.Random(1234)
    samples += ["".join(rng.choice(CHARS) for _ in range(rng.randint(0, 200))) for _ in range(50)]
    for text in samples:
        enc = tok(text)["input_ids"]
        if len(enc) != len(text) or tok.decode(enc) != text:
            raise AssertionError(f"tokenizer round trip failed for {text!r}")


# --------------------------------------------------------------------------------------------- model


def build_config(arch: str, vocab_size: int, hidden: int, layers: int, intermediate: int) -> PretrainedConfig:
    common: dict[str, Any] = {
        "vocab_size": vocab_size,
        "hidden_size": hidden,
        "num_hidden_layers": layers,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "intermediate_size": intermediate,
        "max_position_embeddings": MODEL_MAX_LENGTH,
        "tie_word_embeddings": True,
        "pad_token_id": PAD_ID,
        "bos_token_id": BOS_ID,
        "eos_token_id": EOS_ID,
    }
    if arch == "qwen2":
        return Qwen2Config(**common, use_sliding_window=False)
    if arch == "llama":
        return LlamaConfig(**common)
    raise ValueError(f"unknown arch {arch!r} (expected qwen2 or llama)")


def count_params(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())  # shared (tied) tensors counted once


# --------------------------------------------------------------------------------------------- data

CODE_RE = re.compile(r"^print\((\d+)([+*])(\d+)\)$")


def arith_completion(prompt: Prompt) -> str:
    from dgrpo.tasks.arith import scratchpad

    return scratchpad(int(prompt.meta["a"]), int(prompt.meta["b"]))


def code_completion(prompt: Prompt) -> str:
    return str(prompt.meta["reference"])


def code_correct(prompt: Prompt, completion: str) -> bool:
    """Safe check (no execution): the reference program, or ``print(a+b)``/``print(a*b)`` giving the answer."""
    if completion == prompt.meta["reference"]:
        return True
    m = CODE_RE.match(completion)
    if m is None or len(m.group(1)) > 6 or len(m.group(3)) > 6:
        return False
    x, op, y = int(m.group(1)), m.group(2), int(m.group(3))
    return str(x + y if op == "+" else x * y) == prompt.answer


def encode_example(tok: Any, prompt: str, completion: str) -> tuple[list[int], list[int]]:
    p_ids = tok(prompt)["input_ids"]
    c_ids = tok(completion)["input_ids"] + [EOS_ID]
    return p_ids + c_ids, [-100] * len(p_ids) + c_ids


def collate(examples: Sequence[tuple[list[int], list[int]]]) -> dict[str, torch.Tensor]:
    width = max(len(ids) for ids, _ in examples)
    input_ids = torch.full((len(examples), width), PAD_ID, dtype=torch.long)
    labels = torch.full((len(examples), width), -100, dtype=torch.long)
    mask = torch.zeros((len(examples), width), dtype=torch.long)
    for row, (ids, labs) in enumerate(examples):
        input_ids[row, : len(ids)] = torch.tensor(ids)
        labels[row, : len(labs)] = torch.tensor(labs)
        mask[row, : len(ids)] = 1
    return {"input_ids": input_ids, "labels": labels, "attention_mask": mask}


# --------------------------------------------------------------------------------------------- evaluation


@torch.no_grad()
def generate_completions(model: Any, tok: Any, prompts: Sequence[str], *, sample: bool, seed: int) -> list[str]:
    """Completions (decoded new tokens up to the first <eos>), left-padded batch, fixed seed."""
    tok.padding_side = "left"
    enc = tok(list(prompts), return_tensors="pt", padding=True)
    kwargs: dict[str, Any] = dict(SAMPLING) if sample else {"do_sample": False}
    if not sample:
        kwargs.update(temperature=None, top_k=None, top_p=None)
    was_training = model.training
    model.eval()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        out = model.generate(
            input_ids=enc["input_ids"],
            attention_mask=enc["attention_mask"],
            max_new_tokens=MAX_NEW_TOKENS,
            pad_token_id=PAD_ID,
            eos_token_id=EOS_ID,
            **kwargs,
        )
    model.train(was_training)
    new = out[:, enc["input_ids"].shape[1] :].tolist()
    completions = []
    for ids in new:
        if EOS_ID in ids:
            ids = ids[: ids.index(EOS_ID)]
        completions.append(tok.decode(ids, skip_special_tokens=False))
    return completions


@dataclass
class EvalSet:
    name: str
    prompts: list[Prompt]
    correct: Callable[[Prompt, str], bool]


def accuracy(model: PreTrainedModel, tok: Any, ev: EvalSet, *, sample: bool, seed: int) -> float:
    completions = generate_completions(model, tok, [p.text for p in ev.prompts], sample=sample, seed=seed)
    return sum(ev.correct(p, c) for p, c in zip(ev.prompts, completions, strict=True)) / len(ev.prompts)


# --------------------------------------------------------------------------------------------- main
