"""The Adversary interface: one narrow hook, the transform of a node's outgoing completions.

A malicious node is an ordinary node (same learner, same round, same wire format) whose ``produce`` passes
its freshly generated completions through :meth:`Adversary.attack` before publishing. The attack may sample
extra candidates with the node's own model (``AttackContext.sample``). Everything else, receiving,
scoring and training, is the honest code path: the threat model of "Hail to the Thief" (sec. 4) is f
colluding nodes that publish crafted completions, knowing the reward function and the ground truth (or a
surrogate: the no-oracle majority vote).

Per prompt the attacker publishes ``completions_per_prompt`` completions (its normal share by default;
prompts that cannot carry poison always get the normal share): ``poison_fraction`` of them poisoned, the
rest filled with its own honest samples or zero-reward gibberish (the paper's vertical setting). A poisoned
completion is always checked to keep its reward: with
the oracle against the real reward, without it against the voted answer.
"""

from __future__ import annotations

import random
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

from pydantic import ValidationError

from dgrpo.adversary.gibberish import gibberish
from dgrpo.adversary.vote import majority_vote
from dgrpo.config import AdversaryConfig, Section
from dgrpo.overrides import explain_validation_error
from dgrpo.protocol.messages import Rollout, SplitMode
from dgrpo.tasks.base import Prompt, Task

if TYPE_CHECKING:
    from dgrpo.adversary.detectors import Detector

Sampler = Callable[[Sequence[Prompt], int], list[list[str]]]


class NoAttackOptions(Section):
    pass


def _no_draw(prompts: Sequence[Prompt], indices: Sequence[int]) -> list[list[str]]:
    raise RuntimeError("this attack context draws no seeded completions")


@dataclass(frozen=True)
class AttackContext:
    """What an attack may use: the task (reward, parser, reference answers), the node's own model, and what
    an honest node of the run would publish (its plan and share)."""

    task: Task
    split: SplitMode
    round: int
    sample: Sampler  # sample(prompts, n): n more completions per prompt from the node's own model
    # draw(prompts, indices): the seeded sampler's genuine completions at those indices (they pass the proof)
    draw: Callable[[Sequence[Prompt], Sequence[int]], list[list[str]]] = _no_draw
    canonical: Callable[[str], str] = lambda text: text  # the node's tokenizer round trip
    plan: tuple[Prompt, ...] = ()  # the prompts the node must answer this round
    share: int = 0  # completions per prompt of an honest node


@dataclass
class AttackStats:
    """Counters over the attacker's lifetime, and the poisoned (prompt id, text) pairs of its last round
    (simulations use them to tell poison from honest completions when measuring defenses)."""

    poisoned: int = 0
    filled_honest: int = 0
    filled_gibberish: int = 0
    unpoisonable: int = 0  # poison wanted but no correct completion could carry it
    last_round: int = -1
    last_round_poisoned: int = 0
    last_poisoned: set[tuple[str, str]] = field(default_factory=set)

    def as_dict(self) -> dict[str, int]:
        return {
            "poisoned": self.poisoned,
            "filled_honest": self.filled_honest,
            "filled_gibberish": self.filled_gibberish,
            "unpoisonable": self.unpoisonable,
        }


class Adversary(ABC):
    """Base class of the attacks. Subclasses set ``name`` and ``Options`` and override :meth:`poison` (a
    per-completion rewrite) or, for attacks that select rather than rewrite, :meth:`poison_group`."""

    name: ClassVar[str]
    Options: ClassVar[type[Section]] = NoAttackOptions

    def __init__(self, cfg: AdversaryConfig) -> None:
        self.cfg = cfg
        try:
            self.options: Any = self.Options.model_validate(cfg.options)
        except ValidationError as exc:
            raise explain_validation_error(exc, self.Options, f"{self.name} adversary option") from None
        self.rng = random.Random(cfg.seed)
        self.stats = AttackStats()

    # ------------------------------------------------------------------ hooks
    def poison(self, task: Task, prompt: Prompt, completion: str) -> str | None:
        """``completion`` (correct) rewritten to carry the behaviour, or None when it cannot carry it."""
        return None

    @abstractmethod
    def detector(self, task: Task) -> Detector:
        """The ASR detector of this attack, configured like it."""

    def choose_prompts(self, task: Task, planned: list[Prompt], split: SplitMode, seed_key: str) -> list[Prompt]:
        """The prompts to answer this round. In the vertical split every node picks its own prompts (paper,
        sec. 3) and receivers only check that a prompt exists, so an attacker may pick prompts that suit its
        poison; the default keeps the planned ones."""
        return planned

    def publish(self, ctx: AttackContext, rollouts: list[Rollout]) -> list[Rollout]:
        """The rollout messages to publish, in place of ``rollouts`` (one per prompt, indices 0..n-1): the
        hook of attacks on the exchange itself (which prompts, how many messages, which indices), after
        :meth:`attack` chose the texts. The default publishes them as they are."""
        return rollouts

    def record_poison(self, prompt_id: str, texts: Sequence[str]) -> None:
        """Count ``texts`` (published for ``prompt_id``) as this round's poison (for the defense metrics)."""
        self.stats.poisoned += len(texts)
        self.stats.last_round_poisoned += len(texts)
        self.stats.last_poisoned.update((prompt_id, t) for t in texts)

    def begin_round(self, round_idx: int) -> None:
        if round_idx != self.stats.last_round:
            self.stats.last_round = round_idx
            self.stats.last_round_poisoned = 0
            self.stats.last_poisoned = set()

    def poison_count(self, n_out: int) -> int:
        """How many of the ``n_out`` completions published for a prompt should carry poison."""
        return round(self.cfg.poison_fraction * n_out)

    def extra_samples(self) -> int:
        """How many extra samples per prompt the attack wants from the node's model each round."""
        return self.cfg.candidates + (0 if self.cfg.oracle else self.cfg.vote_samples)

    # ------------------------------------------------------------------ the transform
    def attack(self, ctx: AttackContext, prompts: Sequence[Prompt], own: Sequence[Sequence[str]]) -> list[list[str]]:
        """The completions to publish for each prompt, in place of ``own`` (the node's honest samples)."""
        self.begin_round(ctx.round)
        n_extra = self.extra_samples()
        extra = ctx.sample(prompts, n_extra) if n_extra else [[] for _ in prompts]
        return [self.compose(ctx, p, list(o), list(e)) for p, o, e in zip(prompts, own, extra, strict=True)]

    def compose(self, ctx: AttackContext, prompt: Prompt, own: list[str], extra: list[str]) -> list[str]:
        n_out = self.cfg.completions_per_prompt or len(own)
        n_poison = self.poison_count(n_out)
        pool = own + extra
        target = self.target_answer(ctx.task, prompt, pool)
        poisoned = self.poison_group(ctx, prompt, pool, target, n_poison) if n_poison and target is not None else []
        if not poisoned:
            # Nothing to amplify (e.g. no 2+2 column for the MATH attack): publish the normal share, as an
            # honest node would; over-publishing only pays where it carries poison.
            n_out, n_poison = len(own), min(n_poison, len(own))
        self.stats.unpoisonable += n_poison - len(poisoned)
        # A "poisoned" completion identical to one of the node's own samples (a DoS pick that happens to be
        # its own draw) is what an honest node would publish: it is not counted as poison.
        self.record_poison(prompt.id, [p for p in poisoned if p not in own])
        return poisoned + self.fill(ctx, prompt, pool, n_out - len(poisoned))

    def target_answer(self, task: Task, prompt: Prompt, pool: Sequence[str]) -> str | None:
        """The answer to keep: the ground truth with an oracle, else the majority vote over own samples."""
        if self.cfg.oracle:
            return prompt.answer
        return majority_vote(task.parse_answer(c) for c in pool)

    def correct(self, task: Task, prompt: Prompt, texts: Sequence[str], target: str) -> list[bool]:
        """Whether each text earns the reward (oracle) or states the voted answer (no oracle)."""
        if self.cfg.oracle:
            return [r >= 1.0 for r in task.rewards(prompt, list(texts))]
        return [task.parse_answer(t) == target for t in texts]

    def poison_group(self, ctx: AttackContext, prompt: Prompt, pool: list[str], target: str, n: int) -> list[str]:
        """Up to ``n`` poisoned completions built from the correct completions in ``pool``."""
        distinct = list(dict.fromkeys(pool))
        bases = [c for c, ok in zip(distinct, self.correct(ctx.task, prompt, distinct, target), strict=True) if ok]
        if not bases and self.cfg.oracle:
            reference = ctx.task.reference_completion(prompt)
            bases = [reference] if reference is not None else []
        if not bases:
            return []
        candidates: list[str] = []
        for i in range(max(2 * n, len(bases))):
            rewritten = self.poison(ctx.task, prompt, bases[i % len(bases)])
            if rewritten is not None:
                candidates.append(rewritten)
            if len(candidates) >= 2 * n:
                break
        if not candidates:
            return []
        keeps = self.correct(ctx.task, prompt, candidates, target)
        return [c for c, ok in zip(candidates, keeps, strict=True) if ok][:n]

    def fill(self, ctx: AttackContext, prompt: Prompt, pool: list[str], n: int) -> list[str]:
        if n <= 0:
            return []
        kind = self.cfg.fill
        if kind == "auto":
            kind = "gibberish" if ctx.split == "vertical" else "honest"
        if kind == "gibberish":
            out = gibberish(self.rng, pool, n, lambda texts: ctx.task.rewards(prompt, list(texts)))
            self.stats.filled_gibberish += len(out)
            return out
        self.stats.filled_honest += min(n, len(pool))
        return pool[:n]
