"""The Defense interface: a verdict on each of a round's received completions, between receive and learn.

"Hail to the Thief" (sec. 6) places its defenses after the all-gather and before the advantages: a rejected
completion is removed from its group, so the group's advantages are computed without it. A defense sees each
completion with its prompt, author, index and claimed sampling parameters, and may use the node's own model
(``DefenseContext.learner``). Hostile input gets a verdict, never an exception: a defense that cannot decide
says so in its verdict (the chain treats an exception as a rejection with reason ``<name>:error``).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from pydantic import ValidationError

from dgrpo.config import Section
from dgrpo.overrides import explain_validation_error
from dgrpo.protocol.messages import SamplingParams
from dgrpo.tasks.base import Prompt, Task

if TYPE_CHECKING:
    from dgrpo.learner.learner import Learner


@dataclass(frozen=True)
class Candidate:
    """One received completion, as a defense sees it."""

    author: str
    prompt: Prompt
    text: str
    index: int  # the completion's index in the author's share for this prompt (part of its sampling seed)
    sampling: SamplingParams  # as claimed by the author
    model_id: str
    weights: str = ""  # SHA-256 of the weights the author announces having sampled with ("" if none)
    tokens: tuple[int, ...] | None = None  # the token ids the author says it sampled (None: not sent)


@dataclass(frozen=True)
class Verdict:
    """``accept`` or not, why (``reason``, empty when accepted) and a defense-specific ``score`` (for logs and
    thresholds). ``reward_scale`` multiplies an accepted completion's reward (the paper's judge mode)."""

    accept: bool
    reason: str = ""
    score: float = 0.0
    reward_scale: float = 1.0


ACCEPT = Verdict(True)


@dataclass(frozen=True)
class DefenseContext:
    """What a defense may use: the task, the node's model (None where a node has none), the run's agreed
    sampling parameters, where we are, the node's own model name and weights digest (the chain routes
    same-model checks by them) and ``self_id``: the checking node's peer id (empty where unknown); its own
    completions go through the chain too (author == self_id), and a cross-model defense calibrates on them
    (``surprisal``)."""

    task: Task
    learner: Learner | None
    sampling: SamplingParams
    run_id: str
    round: int
    model_id: str = ""
    weights: str = ""
    self_id: str = ""

    def same_model(self, candidate: Candidate) -> bool:
        """Whether ``candidate``'s author announces this node's model and weights: only then can a check
        against this node's own logits say anything about it."""
        return (candidate.model_id, candidate.weights) == (self.model_id, self.weights)


class NoDefenseOptions(Section):
    pass


class Defense(ABC):
    """Base class of the defenses. Subclasses set ``name``, ``cost`` (relative; a chain runs the cheapest
    first, so expensive checks see only what cheap ones let through) and ``Options``.

    ``same_model``: the check compares a completion with the node's own model (``logit``,
    ``sampling-proof``), so it applies only to authors announcing the node's model and weights; the chain
    sends the others to its foreign chain. ``proof``: a rejection is proof of tampering, never an honest
    accident (the seeded sampler's check: honest FPR 0), so the defend stage rejects the author's whole group
    and the reputation policy counts it as evidence, which no number of honest completions dilutes.
    """

    name: ClassVar[str]
    cost: ClassVar[int] = 100
    needs_model: ClassVar[bool] = False
    same_model: ClassVar[bool] = False
    proof: ClassVar[bool] = False
    Options: ClassVar[type[Section]] = NoDefenseOptions

    def __init__(self, options: dict[str, Any] | None = None) -> None:
        try:
            self.options: Any = self.Options.model_validate(options or {})
        except ValidationError as exc:
            raise explain_validation_error(exc, self.Options, f"{self.name} defense option") from None

    @abstractmethod
    def check(self, ctx: DefenseContext, candidates: Sequence[Candidate]) -> list[Verdict]:
        """One verdict per candidate, in order."""

    def reject(self, why: str, score: float = 0.0) -> Verdict:
        return Verdict(False, f"{self.name}:{why}", score)
