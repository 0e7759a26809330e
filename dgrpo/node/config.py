"""Typed configuration of a node, split by concern (model, learner, rollout).

Every section forbids unknown keys; :func:`dgrpo.config_errors.validate_section` turns pydantic's error into
one that lists the valid keys.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from dgrpo.node.grpo import LossType
from dgrpo.protocol.messages import SplitMode


def fill_section(data: Any, key: str, default: BaseModel) -> Any:
    """Before validation: a partial ``key`` section (e.g. only ``sampling.max_new_tokens`` overridden) keeps
    the field's default values for the keys it leaves out, not the model class's defaults."""
    if isinstance(data, dict) and isinstance(data.get(key), dict):
        return {**data, key: {**default.model_dump(), **data[key]}}
    return data


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True)


class LoraConfig(Section):
    """LoRA adapters via peft (optional; the paper fine-tunes fully)."""

    r: Annotated[int, Field(ge=1, description="LoRA rank")] = 16
    alpha: Annotated[int, Field(ge=1, description="LoRA scaling alpha")] = 32
    dropout: Annotated[float, Field(ge=0.0, lt=1.0, description="LoRA dropout")] = 0.0
    target_modules: Annotated[
        list[str], Field(description="module names to adapt; 'all-linear' adapts every linear layer")
    ] = ["all-linear"]


class ModelConfig(Section):
    name: Annotated[
        str,
        Field(description="embedded name (dgrpo:tiny-arith), local folder, or hub id (Qwen/Qwen2.5-1.5B)"),
    ] = "dgrpo:tiny-arith"
    gguf_file: Annotated[str | None, Field(description="GGUF file inside the folder, if any")] = None
    device: Annotated[str, Field(description="'auto' (CUDA when present), 'cpu', 'cuda', 'cuda:1', ...")] = "auto"
    dtype: Annotated[
        Literal["auto", "float32", "bfloat16", "float16"],
        Field(description="'auto': float32 on the CPU (bf16 is very slow there), bfloat16 on CUDA"),
    ] = "auto"
    chat_template: Annotated[bool, Field(description="wrap prompts in the tokenizer's chat template")] = False
    lora: Annotated[LoraConfig | None, Field(description="LoRA adapters; None trains all weights")] = None


class LearnerConfig(Section):
    lr: Annotated[float, Field(gt=0.0, description="learning rate (paper: Adam 2e-5)")] = 5e-5
    optimizer: Annotated[Literal["adam", "adamw"], Field(description="optimizer")] = "adam"
    weight_decay: Annotated[float, Field(ge=0.0, description="AdamW weight decay")] = 0.0
    loss_type: Annotated[LossType, Field(description="grpo | dr_grpo | dapo, with TRL's meanings")] = "dapo"
    beta: Annotated[float, Field(ge=0.0, description="KL weight (paper: 0)")] = 0.0
    epsilon: Annotated[float | None, Field(gt=0.0, description="PPO clip epsilon; None: no clipping")] = None
    epsilon_high: Annotated[float | None, Field(gt=0.0, description="upper clip (DAPO); None: = epsilon")] = None
    scale_rewards: Annotated[bool, Field(description="divide advantages by the group std")] = True
    advantage_eps: Annotated[float, Field(gt=0.0, description="eps in (r - mean) / (std + eps)")] = 1e-4
    micro_batch_size: Annotated[int, Field(ge=1, description="sequences per forward/backward pass")] = 32
    max_grad_norm: Annotated[float | None, Field(gt=0.0, description="gradient clipping; None: off")] = 1.0
    seed: Annotated[int, Field(ge=0, description="seed for initialisation and sampling")] = 0


class RolloutConfig(Section):
    """What one node generates per round (the paper's horizontal / vertical split, sec. 3)."""

    split: Annotated[
        SplitMode,
        Field(description="horizontal: all nodes answer the same prompts; vertical: each its own prompts"),
    ] = "horizontal"
    prompts_per_round: Annotated[int, Field(ge=1, description="prompts this node answers per round")] = 8
    completions_per_prompt: Annotated[int, Field(ge=1, description="completions per prompt per node")] = 2
    sampler: Annotated[
        Literal["multinomial", "seeded"],
        Field(
            description="multinomial: transformers' sampling from the node's seed; seeded: the verifiable seeded "
            "sampler (each completion's seed derived from run, round, author, prompt and index; needed by the "
            "sampling-proof defense; docs/protocol.md)"
        ),
    ] = "multinomial"
    max_completions_per_message: Annotated[int, Field(ge=1, description="limit on received rollouts")] = 64
    max_completion_chars: Annotated[int, Field(ge=1, description="limit on a received completion")] = 16384


class TaskConfig(Section):
    name: Annotated[str, Field(description="task name: arith, arith-code, gsm8k, code, humaneval")] = "arith"
    options: dict[str, Any] = Field(default_factory=dict, description="task options, e.g. {data = 'path/to.jsonl'}")
