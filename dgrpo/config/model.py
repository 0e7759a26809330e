"""Which model a node trains, where, and whether through LoRA adapters."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from dgrpo.config.sections import Section


class LoraConfig(Section):
    """LoRA adapters via peft (optional; the paper fine-tunes fully)."""

    r: Annotated[int, Field(ge=1, description="LoRA rank")] = 16
    alpha: Annotated[int, Field(ge=1, description="LoRA scaling alpha")] = 32
    dropout: Annotated[float, Field(ge=0.0, lt=1.0, description="LoRA dropout")] = 0.0
    target_modules: list[str] = Field(
        default_factory=lambda: ["all-linear"],
        description="module names to adapt; 'all-linear' adapts every linear layer",
    )


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
