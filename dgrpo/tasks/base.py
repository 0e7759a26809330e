"""The Task interface: prompts, held-out evaluation prompts, a reward and an answer parser.

A reward follows TRL's convention of a plain function of the completion, here bound to a prompt. It must
never raise on a malformed completion: hostile or broken output earns 0.0 (the paper's rewards are binary).
"""

from __future__ import annotations

import json
import random
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from dgrpo.errors import DataNotFoundError
from dgrpo.seeds import stable_seed


@dataclass(frozen=True)
class Prompt:
    """One question. ``id`` is stable across machines so peers can refer to the same prompt."""

    id: str
    text: str
    answer: str
    meta: Mapping[str, Any] = field(default_factory=dict)


class Task(ABC):
    """A verifiable-reward task. Subclasses register themselves with :data:`dgrpo.tasks.TASKS`."""

    name: ClassVar[str]
    # How a completion lays out its reasoning, for adversaries that edit it (dgrpo.adversary.layout):
    # "scratchpad" (arith), "think" (<think>...</think><answer>...</answer>), "program" (Python code), "text".
    reasoning_format: ClassVar[str] = "text"

    @abstractmethod
    def train_prompt(self, index: int) -> Prompt:
        """The ``index``-th training prompt; deterministic for a given task configuration."""

    @property
    @abstractmethod
    def num_train(self) -> int:
        """How many distinct training prompts exist."""

    @abstractmethod
    def eval_prompts(self, n: int) -> list[Prompt]:
        """``n`` held-out prompts (never among the training prompts), the same on every call."""

    @abstractmethod
    def parse_answer(self, completion: str) -> str | None:
        """The final answer a completion states, or None when it is malformed."""

    @abstractmethod
    def reward(self, prompt: Prompt, completion: str) -> float:
        """The verifiable reward in [0, 1]. Never raises."""

    def reference_completion(self, prompt: Prompt) -> str | None:
        """A correct completion written from the ground truth, or None when the task has none. Used by
        oracle adversaries (the paper's attacker knows the answers) when sampling finds no correct base."""
        return None

    def prompt_by_id(self, prompt_id: str) -> Prompt | None:
        """The training prompt with this id, or None. Receivers rebuild prompts from ids: a peer's copy of
        the question and, above all, of the answer is never trusted.

        The default indexes every training prompt once; tasks with very many prompts override it.
        """
        if self._index is None:
            self._index = {p.id: p for p in (self.train_prompt(i) for i in range(self.num_train))}
        return self._index.get(prompt_id)

    _index: dict[str, Prompt] | None = None

    def rewards(self, prompt: Prompt, completions: Sequence[str]) -> list[float]:
        """Rewards of several completions of one prompt (tasks with expensive rewards batch this)."""
        return [self.reward(prompt, c) for c in completions]

    def reward_isolation(self) -> str | None:
        """How peers' completions are isolated while scored (code tasks: ``bwrap`` or the weak ``direct``);
        None when scoring runs nothing of theirs."""
        return None

    def reward_statistics(self) -> dict[str, int]:
        """Counts of how rewards were computed (code tasks: sandbox runs by outcome; gsm8k: math-verify
        timeouts), shown in a node's /status and /metrics. Empty for tasks with nothing to count."""
        return {}

    def rewards_batch(self, items: Sequence[tuple[Prompt, Sequence[str]]]) -> list[list[float]]:
        """Rewards of the completions of several prompts at once, per prompt (a node scores a whole round
        with one call; code tasks run it as one sandbox batch)."""
        return [self.rewards(prompt, completions) for prompt, completions in items]

    def sample_prompts(self, n: int, seed_key: str) -> list[Prompt]:
        """``n`` distinct training prompts chosen by a seed derived from ``seed_key``.

        Every node derives the same choice from the same key (e.g. run id and round for the paper's
        horizontal split, plus the author for the vertical split), so no coordinator is needed.
        """
        rng = random.Random(stable_seed(seed_key))
        count = min(n, self.num_train)
        return [self.train_prompt(i) for i in rng.sample(range(self.num_train), count)]


class PromptListTask(Task, ABC):
    """A task whose prompts are held in two lists (loaded data): ``_train`` and ``_held_out``."""

    _train: list[Prompt]
    _held_out: list[Prompt]

    @property
    def num_train(self) -> int:
        return len(self._train)

    def train_prompt(self, index: int) -> Prompt:
        return self._train[index]

    def eval_prompts(self, n: int) -> list[Prompt]:
        return self._held_out[:n]


def read_jsonl(path: Path, what: str, required: Sequence[str] = ()) -> list[dict[str, Any]]:
    """The JSON objects of a JSONL file (blank lines skipped); each must hold the ``required`` string fields.

    A missing or malformed file is a :class:`DataNotFoundError` naming the file and line.
    """
    if not path.is_file():
        raise DataNotFoundError(f"{what} data file not found: {path}")
    rows: list[dict[str, Any]] = []
    try:
        with path.open(encoding="utf-8") as fh:
            for number, line in enumerate(fh, 1):
                if not line.strip():
                    continue
                row = json.loads(line)
                if not isinstance(row, dict):
                    raise ValueError(f"line {number} is not a JSON object")
                if not all(isinstance(row.get(k), str) for k in required):
                    raise ValueError(f"line {number} needs {' and '.join(repr(k) for k in required)} strings")
                rows.append(row)
    except (OSError, ValueError) as exc:
        raise DataNotFoundError(f"cannot read {what} data {path}: {exc}") from exc
    return rows


def per_item(flat: Sequence[float], items: Sequence[tuple[Prompt, Sequence[str]]]) -> list[list[float]]:
    """``flat`` (one value per completion, in order) regrouped as ``rewards_batch`` returns it: per item."""
    out, at = [], 0
    for _, completions in items:
        out.append(list(flat[at : at + len(completions)]))
        at += len(completions)
    return out
