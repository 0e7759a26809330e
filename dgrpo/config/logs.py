"""Where a run logs besides its own files (``metrics.jsonl``, ``rounds.jsonl``): TensorBoard event files."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

from pydantic import Field

from dgrpo.config.sections import Section


class LoggingConfig(Section):
    tensorboard: Annotated[
        Path | None,
        Field(
            description="write TensorBoard event files to this folder, one step per round (view them with "
            "`tensorboard --logdir DIR`); None: none"
        ),
    ] = None
