"""What one node generates per round, and how: the paper's horizontal or vertical split (sec. 3) and the
sampler every node of a run must share."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from dgrpo.config.sections import Section
from dgrpo.protocol.messages import SplitMode

Sampler = Literal["multinomial", "seeded"]


class RolloutConfig(Section):
    """What one node generates per round (the paper's horizontal / vertical split, sec. 3)."""

    split: Annotated[
        SplitMode,
        Field(description="horizontal: all nodes answer the same prompts; vertical: each its own prompts"),
    ] = "horizontal"
    prompts_per_round: Annotated[int, Field(ge=1, description="prompts this node answers per round")] = 8
    completions_per_prompt: Annotated[int, Field(ge=1, description="completions per prompt per node")] = 2
    sampler: Annotated[
        Sampler,
        Field(
            description="multinomial: transformers' sampling from the node's seed; seeded: the verifiable seeded "
            "sampler (each completion's seed derived from run, round, author, prompt and index; needed by the "
            "sampling-proof defense; docs/protocol.md)"
        ),
    ] = "multinomial"
