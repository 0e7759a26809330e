"""One node's work in a round, as two halves around the network: ``produce`` and ``consume``.

The data path (DEVELOPERS.md): generate -> publish -> receive -> validate -> defense chain -> reward ->
advantages -> update. ``produce`` is the first step; the transport does publish/receive; ``consume`` does the
rest. The daemon and the simulations call exactly these methods (through :func:`dgrpo.node.round.run_round`).
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from dgrpo.adversary.base import Adversary, AttackContext
from dgrpo.defense.base import Candidate, DefenseContext, Verdict
from dgrpo.defense.chain import DefenseChain
from dgrpo.defense.reputation import Reputation
from dgrpo.node.config import RolloutConfig
from dgrpo.node.grpo import group_advantages
from dgrpo.node.learner import Learner, StepStats, TrainSample
from dgrpo.node.sampler import completion_seed
from dgrpo.protocol.messages import Rollout, SamplingParams
from dgrpo.tasks.base import Prompt, Task, stable_seed


@dataclass(frozen=True)
class ScoredCompletion:
    author: str
    prompt: Prompt
    text: str
    reward: float


@dataclass(frozen=True)
class Checked:
    """A peer's completion after the defense chain (simulations measure stop and false-positive rates)."""

    author: str
    prompt_id: str
    text: str
    accepted: bool
    reason: str


@dataclass(frozen=True)
class RoundReport:
    """What one node did in one round (a frozen snapshot, logged and aggregated by callers)."""

    peer_id: str
    round: int
    messages: int
    completions_published: int
    completions_received: int
    completions_accepted: int
    rejected: dict[str, int]
    mean_reward: float
    own_mean_reward: float
    step: StepStats | None
    produce_seconds: float
    consume_seconds: float
    reward_seconds: float = 0.0  # scoring every accepted completion (code tasks: the sandbox)
    scored: tuple[ScoredCompletion, ...] = field(repr=False, default=())
    # The defense chain (completion counts; ``rejected`` above counts whole messages):
    defense_rejected: dict[str, int] = field(default_factory=dict)  # by reason
    defense_checked_by_author: dict[str, int] = field(default_factory=dict)
    defense_rejected_by_author: dict[str, int] = field(default_factory=dict)
    defense_seconds: dict[str, float] = field(default_factory=dict)  # by defense
    blacklisted_now: tuple[str, ...] = ()
    checked: tuple[Checked, ...] = field(repr=False, default=())


def _outcome(v: Verdict | None) -> tuple[bool, str]:
    """(stopped or not, why) for metrics: a completion kept with its reward zeroed (the judge's reward mode)
    is stopped as surely as a rejected one."""
    if v is None:
        return True, ""
    if v.accept and v.reward_scale == 0.0:
        return False, v.reason or "reward_zeroed"
    return v.accept, v.reason


class Node:
    """A GRPO node: its task, learner and rollout settings. It never trusts a peer's reward or prompt."""

    def __init__(
        self,
        peer_id: str,
        run_id: str,
        task: Task,
        learner: Learner,
        rollout: RolloutConfig,
        sampling: SamplingParams,
        adversary: Adversary | None = None,
        defense: DefenseChain | None = None,
        reputation: Reputation | None = None,
    ) -> None:
        self.peer_id = peer_id
        self.run_id = run_id
        self.task = task
        self.learner = learner
        self.rollout = rollout
        self.sampling = sampling
        # A malicious node is this same node with an adversary transforming what it publishes (and nothing
        # else: it receives, scores and trains like any other).
        self.adversary = adversary
        # Filters between receive and learn (paper, sec. 6), and the policy that blacklists peers they keep
        # rejecting. Our own completions are filtered by the same chain (see _defend), never blacklisted.
        self.defense = defense
        self.reputation = reputation
        self._last_produce_seconds = 0.0

    # ------------------------------------------------------------------ generate
    def plan(self, round_idx: int) -> list[Prompt]:
        """This round's prompts. Horizontal: the same global prompts on every node; vertical: the node's own
        (paper, sec. 3). Both derive from a seed every node can compute, so no coordinator is needed."""
        key = f"{self.run_id}/{round_idx}"
        if self.rollout.split == "vertical":
            key += f"/{self.peer_id}"
        planned = self.task.sample_prompts(self.rollout.prompts_per_round, key)
        if self.adversary is not None:
            return self.adversary.choose_prompts(self.task, planned, self.rollout.split, key)
        return planned

    def sampling_for(self, round_idx: int) -> SamplingParams:
        seed = stable_seed(self.run_id, round_idx, self.peer_id, self.sampling.seed)
        return self.sampling.model_copy(update={"seed": seed})

    def produce(self, round_idx: int) -> list[Rollout]:
        """Generate this round's completions and wrap them as rollout messages (one per prompt)."""
        t0 = time.perf_counter()
        prompts = self.plan(round_idx)
        sampling = self.sampling_for(round_idx)
        n = self.rollout.completions_per_prompt
        seeds = None
        if self.rollout.sampler == "seeded":
            seeds = [
                [completion_seed(self.run_id, round_idx, self.peer_id, p.id, j) for j in range(n)] for p in prompts
            ]
        texts = self.learner.generate([p.text for p in prompts], n, sampling, seeds=seeds)
        if self.adversary is not None:
            texts = self.adversary.attack(self._attack_context(round_idx, sampling), prompts, texts)
        rollouts = [
            Rollout(
                author=self.peer_id,
                round=round_idx,
                part=i,
                parts=len(prompts),
                prompt_id=p.id,
                prompt=p.text,
                completions=tuple(c),
                model_id=self.learner.model_id,
                sampling=sampling,
                split=self.rollout.split,
            )
            for i, (p, c) in enumerate(zip(prompts, texts, strict=True))
        ]
        self._last_produce_seconds = time.perf_counter() - t0
        return rollouts

    def _attack_context(self, round_idx: int, sampling: SamplingParams) -> AttackContext:
        extra = sampling.model_copy(update={"seed": stable_seed(sampling.seed, "attack")})

        def sample(prompts: Sequence[Prompt], n: int) -> list[list[str]]:
            return self.learner.generate([p.text for p in prompts], n, extra)

        return AttackContext(self.task, self.rollout.split, round_idx, sample)

    # ------------------------------------------------------------------ validate
    def check(self, rollout: Rollout, round_idx: int) -> tuple[Prompt | None, str | None]:
        """A verdict on a received rollout body: (prompt, None) to accept, (None, reason) to reject."""
        if rollout.round != round_idx:
            return None, "wrong_round"
        if rollout.split != self.rollout.split:
            return None, "wrong_split"
        if len(rollout.completions) > self.rollout.max_completions_per_message:
            return None, "too_many_completions"
        if any(len(c) > self.rollout.max_completion_chars for c in rollout.completions):
            return None, "completion_too_long"
        prompt = self.task.prompt_by_id(rollout.prompt_id)
        if prompt is None:
            return None, "unknown_prompt"
        if prompt.text != rollout.prompt:
            return None, "prompt_mismatch"
        return prompt, None

    # ------------------------------------------------------------------ learn
    def consume(self, round_idx: int, rollouts: Sequence[Rollout]) -> RoundReport:
        """Validate, run the defense chain, score every accepted completion ourselves, compute group
        advantages and update the model."""
        t0 = time.perf_counter()
        rejected: Counter[str] = Counter()
        # A canonical order: nodes holding the same weights and receiving the same strings make the same update.
        ordered = sorted(rollouts, key=lambda r: (r.prompt_id, r.author, r.part))
        valid: list[tuple[Rollout, Prompt]] = []
        dropped: list[Checked] = []  # completions of blacklisted peers (they never reach the learner)
        seen: set[tuple[str, int]] = set()
        received = 0
        for r in ordered:
            received += len(r.completions)
            if self.reputation is not None and r.author != self.peer_id and self.reputation.is_blacklisted(r.author):
                rejected["blacklisted"] += 1
                dropped.extend(Checked(r.author, r.prompt_id, text, False, "blacklisted") for text in r.completions)
                continue
            if (r.author, r.part) in seen:
                rejected["duplicate_part"] += 1
                continue
            seen.add((r.author, r.part))
            prompt, reason = self.check(r, round_idx)
            if prompt is None:
                rejected[reason or "invalid"] += 1
                continue
            valid.append((r, prompt))
        verdicts, defense = self._defend(round_idx, valid)
        checked: list[Checked] = []
        groups: list[tuple[Rollout, Prompt, list[tuple[str, Verdict | None]]]] = []
        for r, prompt in valid:
            kept = [(text, verdicts.get((id(r), i))) for i, text in enumerate(r.completions)]
            if r.author != self.peer_id and self.defense is not None:
                checked.extend(Checked(r.author, prompt.id, text, *_outcome(v)) for text, v in kept)
            kept = [(text, v) for text, v in kept if v is None or v.accept]
            if kept:
                groups.append((r, prompt, kept))
        # One call scores the whole round (a code task runs it as one sandbox batch).
        t_reward = time.perf_counter()
        rewards = self.task.rewards_batch([(prompt, [text for text, _ in kept]) for _, prompt, kept in groups])
        reward_seconds = time.perf_counter() - t_reward
        scored = [
            ScoredCompletion(r.author, prompt, text, reward * (v.reward_scale if v is not None else 1.0))
            for (r, prompt, kept), group_rewards in zip(groups, rewards, strict=True)
            for (text, v), reward in zip(kept, group_rewards, strict=True)
        ]
        step = self._update(scored)
        own = [s.reward for s in scored if s.author == self.peer_id]
        return RoundReport(
            peer_id=self.peer_id,
            round=round_idx,
            messages=len(rollouts),
            completions_published=sum(len(r.completions) for r in rollouts if r.author == self.peer_id),
            completions_received=received,
            completions_accepted=len(scored),
            rejected=dict(rejected),
            mean_reward=sum(s.reward for s in scored) / len(scored) if scored else 0.0,
            own_mean_reward=sum(own) / len(own) if own else 0.0,
            step=step,
            produce_seconds=self._last_produce_seconds,
            consume_seconds=time.perf_counter() - t0,
            reward_seconds=reward_seconds,
            scored=tuple(scored),
            checked=tuple(dropped + checked),
            **defense,
        )

    def _defend(
        self, round_idx: int, valid: Sequence[tuple[Rollout, Prompt]]
    ) -> tuple[dict[tuple[int, int], Verdict], dict[str, Any]]:
        """The chain's verdict on every completion, our own included (keyed by (id(rollout), index)), the
        per-peer counts, and the reputation update (who is blacklisted from now on)."""
        if self.defense is None:
            return {}, {}
        keys: list[tuple[int, int]] = []
        candidates: list[Candidate] = []
        # Our own completions go through the chain too: in a homogeneous network every node must train on
        # the same completions, or the weights drift apart (a node keeping its own false-claim completion that
        # the others reject); and group-based filters (length) must see the same whole group everywhere.
        for r, prompt in valid:
            for i, text in enumerate(r.completions):
                keys.append((id(r), i))
                candidates.append(Candidate(r.author, prompt, text, i, r.sampling, r.model_id))
        ctx = DefenseContext(self.task, self.learner, self.sampling, self.run_id, round_idx)
        result = self.defense.run(ctx, candidates)
        by_reason: Counter[str] = Counter()
        checked_by: Counter[str] = Counter()
        rejected_by: Counter[str] = Counter()
        for c, v in zip(candidates, result.verdicts, strict=True):
            if c.author == self.peer_id:
                continue  # per-peer counts and reputation are about peers
            checked_by[c.author] += 1
            if not v.accept:
                by_reason[v.reason] += 1
                rejected_by[c.author] += 1
        new_blacklisted: list[str] = []
        if self.reputation is not None:
            for author, n in checked_by.items():
                self.reputation.record(round_idx, author, n, rejected_by[author])
            new_blacklisted = self.reputation.update(round_idx)
        counts = {
            "defense_rejected": dict(by_reason),
            "defense_checked_by_author": dict(checked_by),
            "defense_rejected_by_author": dict(rejected_by),
            "defense_seconds": dict(result.seconds),
            "blacklisted_now": tuple(new_blacklisted),
        }
        return dict(zip(keys, result.verdicts, strict=True)), counts

    def _update(self, scored: Sequence[ScoredCompletion]) -> StepStats | None:
        if not scored:
            return None
        cfg = self.learner.cfg
        advantages = group_advantages(
            [s.reward for s in scored],
            [s.prompt.id for s in scored],
            eps=cfg.advantage_eps,
            scale=cfg.scale_rewards,
        )
        max_new = self.sampling.max_new_tokens
        prompt_ids: dict[str, tuple[int, ...]] = {}
        samples = []
        for s, a in zip(scored, advantages, strict=True):
            if s.prompt.id not in prompt_ids:
                prompt_ids[s.prompt.id] = self.learner.encode_prompt(s.prompt.text)
            samples.append(TrainSample(prompt_ids[s.prompt.id], self.learner.encode_completion(s.text, max_new), a))
        return self.learner.train_step(samples, self.sampling.temperature, max_new)

    # ------------------------------------------------------------------ evaluate
    def eval_completions(self, prompts: Sequence[Prompt], greedy: bool = False, seed: int = 0) -> list[str]:
        """One completion per held-out prompt, sampled with the node's sampling and a fixed seed."""
        sampling = self.sampling.model_copy(update={"seed": seed})
        return [c[0] for c in self.learner.generate([p.text for p in prompts], 1, sampling, greedy=greedy)]
