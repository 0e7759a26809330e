"""A federated client: local GRPO rounds on its private prompts, then what it sends.

Each local step is the HTTT node's round without the network: the client samples ``prompts_per_step`` of its
own prompts (seeded by run, round, client and step), generates G completions each, scores them itself, takes
group-relative advantages (times the calibration weights when calibration is on) and one GRPO step through
:func:`dgrpo.round.update.update`. The update it shares is ``theta_local - theta_global``, passed through its
attack (if any), then sparsified with error feedback at its budget.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from dgrpo.config.federated import FederatedConfig
from dgrpo.federated.attacks.base import UpdateAttack
from dgrpo.federated.calibration import calibrate
from dgrpo.federated.params import assign_parameters, flat_parameters
from dgrpo.federated.sparse import ErrorFeedback, SparseUpdate, budget_entries
from dgrpo.federated.stats import ClientStats, reward_stats
from dgrpo.learner.grpo import group_advantages
from dgrpo.learner.learner import Learner
from dgrpo.protocol.messages import SamplingParams
from dgrpo.round.outcome import ScoredCompletion
from dgrpo.round.update import update
from dgrpo.seeds import stable_seed
from dgrpo.tasks.base import Prompt, Task


@dataclass(frozen=True)
class GlobalStats:
    """What the aggregator broadcasts with the global update: the federation's mean reward and mean signal."""

    mean: float
    std: float


@dataclass(frozen=True)
class LocalResult:
    stats: ClientStats  # the true statistics of the local round
    delta: torch.Tensor  # theta_local - theta_global
    losses: tuple[float, ...]
    lr: float  # the learning rate of the round's local steps (learner.lr_schedule)


@dataclass(frozen=True)
class Submission:
    """What a client sends for a round: its reported statistics and its (sparse) update."""

    client: str
    round: int
    stats: ClientStats
    update: SparseUpdate


def step_prompts(
    prompts: Sequence[Prompt], n: int, run_id: str, client: str, round_idx: int, step: int
) -> list[Prompt]:
    rng = random.Random(stable_seed(run_id, "federated", client, round_idx, step))
    return rng.sample(list(prompts), min(n, len(prompts)))


class FedClient:
    """``sources``: (name, prompts) pairs whose step batches the client trains on together: one for a client,
    every client's for the centralized baseline (the union of their batches: same prompts and steps)."""

    def __init__(
        self,
        name: str,
        run_id: str,
        task: Task,
        learner: Learner,
        sources: Sequence[tuple[str, Sequence[Prompt]]],
        cfg: FederatedConfig,
        sampling: SamplingParams,
        attack: UpdateAttack | None = None,
    ) -> None:
        self.name = name
        self.run_id = run_id
        self.task = task
        self.learner = learner
        self.sources = [(n, list(p)) for n, p in sources]
        self.cfg = cfg
        self.sampling = sampling
        self.attack = attack
        self.size = flat_parameters(learner.model).numel()
        self.feedback = ErrorFeedback(self.size)

    def local_round(self, round_idx: int, global_stats: GlobalStats | None) -> LocalResult:
        """``local_steps`` GRPO steps from the current weights; the delta is against where they started."""
        lr = self.learner.begin_round(round_idx)
        start = flat_parameters(self.learner.model)
        groups: list[list[float]] = []
        losses: list[float] = []
        cfg = self.cfg
        for step in range(cfg.local_steps):
            prompts = [
                p
                for source, pool in self.sources
                for p in step_prompts(pool, cfg.prompts_per_step, self.run_id, source, round_idx, step)
            ]
            seed = stable_seed(self.run_id, round_idx, self.name, step, self.sampling.seed)
            params = self.sampling.model_copy(update={"seed": seed})
            texts = self.learner.generate([p.text for p in prompts], cfg.completions_per_prompt, params)
            rewards = self.task.rewards_batch(list(zip(prompts, texts, strict=True)))
            scored = [
                ScoredCompletion(self.name, p, t, r)
                for p, ts, rs in zip(prompts, texts, rewards, strict=True)
                for t, r in zip(ts, rs, strict=True)
            ]
            groups.extend(rewards)
            lcfg = self.learner.cfg
            labels = [s.prompt.id for s in scored]
            flat_rewards = [s.reward for s in scored]
            adv = group_advantages(flat_rewards, labels, eps=lcfg.advantage_eps, scale=lcfg.scale_rewards)
            calib = cfg.calibration
            if calib.enabled and global_stats is not None:
                adv = calibrate(adv, labels, flat_rewards, global_stats.mean, calib.strength, calib.low, calib.high)
            stats = update(self.learner, scored, adv, self.sampling)
            if stats is not None:
                losses.append(stats.loss)
        delta = flat_parameters(self.learner.model) - start
        return LocalResult(reward_stats(groups), delta, tuple(losses), lr)

    def submission(self, round_idx: int, result: LocalResult, global_stats: GlobalStats | None) -> Submission:
        """What the client sends: its statistics and update through its attack, sparsified at its budget."""
        stats, delta = result.stats, result.delta
        if self.attack is not None:
            stats, delta = self.attack.report(stats), self.attack.update(delta)
        sp = self.cfg.sparsity
        signal = result.stats.std if sp.signal_scaled else None
        mean_signal = global_stats.std if sp.signal_scaled and global_stats is not None else None
        k = budget_entries(self.size, sp.budget, signal, mean_signal, sp.scale_low, sp.scale_high)
        return Submission(self.name, round_idx, stats, self.feedback.compress(delta, k, sp.values))

    def load_global(self, flat: torch.Tensor) -> None:
        assign_parameters(self.learner.model, flat)
