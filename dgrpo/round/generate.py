"""The generate stage: this round's prompts, the node's completions, and the rollout messages carrying them.

Every seed derives from names every node knows (run, round, author, prompt, index), so no coordinator is
needed and a peer can recompute what an honest node's seeded sampler had to draw (``docs/protocol.md``).
A malicious node is the same node with an adversary transforming what it publishes, and nothing else.
"""

from __future__ import annotations

from collections.abc import Sequence

from dgrpo.adversary.base import Adversary, AttackContext
from dgrpo.config import RolloutConfig
from dgrpo.learner.learner import Learner
from dgrpo.learner.sampler import completion_seed
from dgrpo.protocol.messages import Rollout, SamplingParams
from dgrpo.seeds import stable_seed
from dgrpo.tasks.base import Prompt, Task


def plan(
    task: Task, rollout: RolloutConfig, run_id: str, peer_id: str, round_idx: int, adversary: Adversary | None = None
) -> list[Prompt]:
    """This round's prompts. Horizontal: the same global prompts on every node; vertical: the node's own
    (paper, sec. 3). An adversary may choose others (receivers only check that a prompt exists)."""
    key = f"{run_id}/{round_idx}"
    if rollout.split == "vertical":
        key += f"/{peer_id}"
    planned = task.sample_prompts(rollout.prompts_per_round, key)
    if adversary is not None:
        return adversary.choose_prompts(task, planned, rollout.split, key)
    return planned


def round_sampling(sampling: SamplingParams, run_id: str, peer_id: str, round_idx: int) -> SamplingParams:
    """The run's sampling with this node's seed for the round."""
    return sampling.model_copy(update={"seed": stable_seed(run_id, round_idx, peer_id, sampling.seed)})


def completion_seeds(run_id: str, peer_id: str, round_idx: int, prompts: Sequence[Prompt], n: int) -> list[list[int]]:
    """The seeded sampler's seed of each completion (what ``sampling-proof`` recomputes)."""
    return [[completion_seed(run_id, round_idx, peer_id, p.id, j) for j in range(n)] for p in prompts]


def attack_context(
    task: Task, learner: Learner, rollout: RolloutConfig, round_idx: int, sampling: SamplingParams
) -> AttackContext:
    """What an adversary may use: the task and its node's own model, sampling with a seed of its own."""
    extra = sampling.model_copy(update={"seed": stable_seed(sampling.seed, "attack")})

    def sample(prompts: Sequence[Prompt], n: int) -> list[list[str]]:
        return learner.generate([p.text for p in prompts], n, extra)

    return AttackContext(task, rollout.split, round_idx, sample)


def generate(
    task: Task,
    learner: Learner,
    rollout: RolloutConfig,
    sampling: SamplingParams,
    run_id: str,
    peer_id: str,
    round_idx: int,
    adversary: Adversary | None = None,
) -> list[Rollout]:
    """Generate this round's completions and wrap them as rollout messages (one per prompt)."""
    prompts = plan(task, rollout, run_id, peer_id, round_idx, adversary)
    params = round_sampling(sampling, run_id, peer_id, round_idx)
    n = rollout.completions_per_prompt
    seeds = completion_seeds(run_id, peer_id, round_idx, prompts, n) if rollout.sampler == "seeded" else None
    texts = learner.generate([p.text for p in prompts], n, params, seeds=seeds)
    if adversary is not None:
        texts = adversary.attack(attack_context(task, learner, rollout, round_idx, params), prompts, texts)
    return [
        Rollout(
            author=peer_id,
            round=round_idx,
            part=i,
            parts=len(prompts),
            prompt_id=p.id,
            prompt=p.text,
            completions=tuple(c),
            model_id=learner.model_id,
            sampling=params,
            split=rollout.split,
        )
        for i, (p, c) in enumerate(zip(prompts, texts, strict=True))
    ]
