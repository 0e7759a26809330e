"""What one node's round produced, as typed records, stage by stage.

Every consumer of a round reads these and nothing else, through :class:`dgrpo.round.observer.RoundObserver`:
the daemon's metrics, status and log lines; the simulation's ``metrics.jsonl``, defense meter and evaluator.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from dgrpo.learner.batch import StepStats
from dgrpo.protocol.messages import Rollout
from dgrpo.tasks.base import Prompt


@dataclass(frozen=True)
class Produced:
    """The generate stage: what this node published. ``attack`` names the node's adversary (None when
    honest); ``poisoned`` are the (prompt id, text) pairs it poisoned this round, ``poisoned_count`` how many
    poisoned completions it published."""

    completions: int
    seconds: float
    attack: str | None = None
    poisoned: frozenset[tuple[str, str]] = frozenset()
    poisoned_count: int = 0


@dataclass(frozen=True)
class Admitted:
    """A rollout that passed admission, with the prompt rebuilt from its id (a peer's copy is never used)."""

    rollout: Rollout
    prompt: Prompt


@dataclass(frozen=True)
class Drawn:
    """The draw stage (:mod:`dgrpo.round.draw`): what goes on to the defense, and how it was drawn (counts of
    peers' completions only)."""

    admitted: tuple[Admitted, ...]
    offered: int = 0  # peers' admitted completions
    drawn: int = 0
    young_drawn: int = 0
    by_author: Mapping[str, int] = field(default_factory=dict)
    full: bool = True  # drew as many as the bound (always, without a bound)


@dataclass(frozen=True)
class Checked:
    """A peer's completion after the defense chain, or dropped unchecked at admission (``reason``: its
    author is blacklisted, or its rollout broke an admission rule)."""

    author: str
    prompt_id: str
    text: str
    accepted: bool
    reason: str


@dataclass(frozen=True)
class Admission:
    """The admit stage at round close: every structural check of the round's rollouts."""

    messages: int
    completions_received: int
    admitted: tuple[Admitted, ...]
    rejected: Mapping[str, int] = field(default_factory=dict)  # messages, by reason
    rejected_by_author: Mapping[str, int] = field(default_factory=dict)  # messages, by author
    dropped: tuple[Checked, ...] = ()  # peers' completions rejected here, never checked or trained on
    evidence_by_author: Mapping[str, int] = field(default_factory=dict)  # rejections an honest peer never earns
    # Counted here with the other per-message work, for the draw stage: peers' admitted completions, and the
    # positions of the node's own rollouts in ``admitted``.
    offered: int = 0
    own: tuple[int, ...] = ()
    # Peers' admitted rollouts (positions in ``admitted``) by their author's draw weight (seniority), where the
    # node draws a bounded number: the draw samples a weight class, then a rollout in it, in O(J).
    by_weight: Mapping[float, tuple[int, ...]] | None = None


@dataclass(frozen=True)
class Kept:
    """A completion that goes on to be scored; ``reward_scale`` multiplies its reward (the judge's reward
    mode)."""

    author: str
    prompt: Prompt
    text: str
    reward_scale: float = 1.0


@dataclass(frozen=True)
class DefenseOutcome:
    """The defend stage (completion counts; peers' completions only, ours are filtered but not counted)."""

    names: tuple[str, ...]
    checked: tuple[Checked, ...]
    rejected: Mapping[str, int]  # by reason
    checked_by_author: Mapping[str, int]
    rejected_by_author: Mapping[str, int]
    seconds: Mapping[str, float]  # by defense
    blacklisted_now: tuple[str, ...] = ()


@dataclass(frozen=True)
class ScoredCompletion:
    author: str
    prompt: Prompt
    text: str
    reward: float


@dataclass(frozen=True)
class Scoring:
    """The score stage: every kept completion with the reward this node computed itself."""

    scored: tuple[ScoredCompletion, ...]
    seconds: float

    @property
    def mean_reward(self) -> float:
        return sum(s.reward for s in self.scored) / len(self.scored) if self.scored else 0.0

    def mean_reward_of(self, author: str) -> float:
        own = [s.reward for s in self.scored if s.author == author]
        return sum(own) / len(own) if own else 0.0


@dataclass(frozen=True)
class StageCpu:
    """CPU seconds of the consuming half by stage (``time.thread_time`` of the worker thread running it)."""

    admit: float = 0.0  # structural checks of every rollout of the round: grows with the traffic, per message
    draw: float = 0.0
    defend: float = 0.0
    score: float = 0.0
    update: float = 0.0

    @property
    def drawn_work(self) -> float:
        """What a node spends on the completions it drew besides training on them (draw, defend, score):
        bounded by J, not by the size of the network."""
        return self.draw + self.defend + self.score


@dataclass(frozen=True)
class RoundOutcome:
    """One node's round. ``step`` is None when nothing was trained on; ``defense`` when the node runs no
    chain. ``seconds``: the consuming half (admit to update); ``round_seconds`` and ``expected`` are filled
    by :func:`dgrpo.round.run.run_round` (the whole round, the peers it waited for, and those it stopped
    waiting for)."""

    peer_id: str
    round: int
    produced: Produced
    admission: Admission
    defense: DefenseOutcome | None
    scoring: Scoring
    step: StepStats | None
    seconds: float
    round_seconds: float = 0.0
    expected: tuple[str, ...] = ()
    departed: tuple[str, ...] = ()  # expected at the start, no longer waited for (stopped, silent, disconnected)
    at_deadline: bool = False  # closed because the deadline passed, not at quorum
    drawn: Drawn | None = None  # the draw stage (None: a round consumed before it existed, in tests)
    cpu: StageCpu = field(default_factory=StageCpu)
    # Async mode: peers' completions trained on, by staleness (this step's round minus the rollout's round).
    staleness: Mapping[int, int] = field(default_factory=dict)
    # Async mode with rollout.async_fill: the node's own completions generated to fill the step (never published).
    filled: int = 0

    @property
    def completions_trained(self) -> int:
        return len(self.scoring.scored)

    @property
    def authors(self) -> set[str]:
        return {s.author for s in self.scoring.scored}
