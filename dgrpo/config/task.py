"""Which task (prompts and verifiable reward) a run trains on."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import Field

from dgrpo.config.sections import Section


class TaskConfig(Section):
    name: Annotated[
        str, Field(description="task name: arith, arith-code, gsm8k, gym (reasoning-gym), code, humaneval")
    ] = "arith"
    options: dict[str, Any] = Field(default_factory=dict, description="task options, e.g. {data = 'path/to.jsonl'}")
