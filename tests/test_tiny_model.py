"""The embedded default model ``dgrpo:tiny-arith`` ships inside the package, loads offline and solves some
held-out ``arith`` prompts when sampled (it is deliberately only partly trained: GRPO needs room to improve)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

import dgrpo
from dgrpo.tasks.arith import ArithTask

MODEL_DIR = Path(dgrpo.__file__).parent / "assets" / "tiny-arith"


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    return AutoTokenizer.from_pretrained(MODEL_DIR)


@pytest.fixture(scope="module")
def model() -> Any:
    m: Any = AutoModelForCausalLM.from_pretrained(MODEL_DIR, dtype=torch.float32)
    m.eval()
    return m


def test_files_are_shipped() -> None:
    for name in ("config.json", "model.safetensors", "generation_config.json", "tokenizer.json", "MODEL_CARD.md"):
        assert (MODEL_DIR / name).is_file(), name


def test_tokenizer_round_trips_text_exactly(tokenizer: Any) -> None:
    texts = [
        "345+78=",
        "5+8+0=13,4+7+1=12,3+0+1=4>423",
        "print the sum of 345 and 78:print(345+78)",
        "  two leading spaces, two trailing  ",
        "line one\nline two\n\n    indented {braces} [brackets] ~`'\"\\|",
        "".join(chr(c) for c in range(32, 127)) + "\n",
    ]
    for text in texts:
        ids = tokenizer(text)["input_ids"]
        assert len(ids) == len(text)  # character level, nothing added
        assert tokenizer.decode(ids) == text
    assert len(tokenizer("345+78=")["input_ids"]) == 7
    assert (tokenizer.pad_token_id, tokenizer.bos_token_id, tokenizer.eos_token_id) == (0, 1, 2)


def test_small_fp32_model(model: Any) -> None:
    params = list(model.parameters())
    assert all(p.dtype == torch.float32 for p in params)
    assert sum(p.numel() for p in params) < 2_000_000


def test_sampled_completions_solve_some_held_out_prompts(model: Any, tokenizer: Any) -> None:
    task = ArithTask()
    prompts = task.eval_prompts(32)
    tokenizer.padding_side = "left"
    enc = tokenizer([p.text for p in prompts], return_tensors="pt", padding=True)
    torch.manual_seed(0)
    with torch.no_grad():
        out = model.generate(
            **enc,
            do_sample=True,
            temperature=1.0,
            top_k=10,
            top_p=1.0,
            max_new_tokens=48,
            pad_token_id=tokenizer.pad_token_id,
            eos_token_id=tokenizer.eos_token_id,
        )
    completions = tokenizer.batch_decode(out[:, enc["input_ids"].shape[1] :], skip_special_tokens=True)
    rewards = [task.reward(p, c) for p, c in zip(prompts, completions, strict=True)]
    assert sum(r == 1.0 for r in rewards) >= 3, list(zip(completions, rewards, strict=True))


@pytest.mark.slow
@pytest.mark.parametrize("name", ["tiny-arith-text", "tiny-arith-code-text"])
def test_sibling_models_are_shipped_and_solve_their_tasks(name: str) -> None:
    """The attack-study siblings load offline and solve some held-out prompts of the tasks their cards name
    (arith for both; arith-code for tiny-arith-code-text, which the CODE scenarios use)."""
    from dgrpo.config import LearnerConfig, ModelConfig
    from dgrpo.learner.learner import Learner
    from dgrpo.protocol.messages import DEFAULT_SAMPLING
    from dgrpo.tasks import get_task

    folder = MODEL_DIR.parent / name
    assert (folder / "MODEL_CARD.md").is_file()
    learner = Learner(ModelConfig(name=f"dgrpo:{name}"), LearnerConfig())
    tasks = ["arith", "arith-code"] if name == "tiny-arith-code-text" else ["arith"]
    for task_name in tasks:
        task = get_task(task_name)
        prompts = task.eval_prompts(32)
        sp = DEFAULT_SAMPLING.model_copy(update={"max_new_tokens": 96, "seed": 0})
        texts = [t[0] for t in learner.generate([p.text for p in prompts], 1, sp)]
        solved = sum(r == 1.0 for r in (task.reward(p, t) for p, t in zip(prompts, texts, strict=True)))
        assert solved >= 4, (task_name, texts[:4])
