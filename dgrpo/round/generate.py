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
from dgrpo.round.binding import plan_key, planned_prompts
from dgrpo.seeds import stable_seed
from dgrpo.tasks.base import Prompt, Task


def plan(
    task: Task, rollout: RolloutConfig, run_id: str, peer_id: str, round_idx: int, adversary: Adversary | None = None
) -> list[Prompt]:
    """This round's prompts (:mod:`dgrpo.round.binding`). Horizontal: the same global prompts on every node;
    vertical: the node's own (paper, sec. 3). An adversary may answer others (receivers reject them as
    ``off_plan``)."""
    planned = planned_prompts(task, rollout, run_id, peer_id, round_idx)
    if adversary is not None:
        key = plan_key(run_id, round_idx, peer_id, rollout.split)
        return adversary.choose_prompts(task, planned, rollout.split, key)
    return planned


def round_sampling(sampling: SamplingParams, run_id: str, peer_id: str, round_idx: int) -> SamplingParams:
    """The run's sampling with this node's seed for the round."""
    return sampling.model_copy(update={"seed": stable_seed(run_id, round_idx, peer_id, sampling.seed)})


def completion_seeds(run_id: str, peer_id: str, round_idx: int, prompts: Sequence[Prompt], n: int) -> list[list[int]]:
    """The seeded sampler's seed of each completion (what ``sampling-proof`` recomputes)."""
    return [[completion_seed(run_id, round_idx, peer_id, p.id, j) for j in range(n)] for p in prompts]


def attack_context(
    task: Task, learner: Learner, rollout: RolloutConfig, run_id: str, peer_id: str, round_idx: int,
    sampling: SamplingParams,
) -> AttackContext:  # fmt: skip
    """What an adversary may use: the task and its node's own model, sampling with a seed of its own or
    drawing genuine seeded-sampler completions at any index (what the sampling proof accepts)."""
    extra = sampling.model_copy(update={"seed": stable_seed(sampling.seed, "attack")})

    def sample(prompts: Sequence[Prompt], n: int) -> list[list[str]]:
        return learner.generate([p.text for p in prompts], n, extra)

    def draw(prompts: Sequence[Prompt], indices: Sequence[int]) -> list[list[str]]:
        seeds = [[completion_seed(run_id, round_idx, peer_id, p.id, j) for j in indices] for p in prompts]
        return learner.generate([p.text for p in prompts], len(indices), sampling, seeds=seeds)

    def canonical(text: str) -> str:
        return learner.canonical_text(text)

    return AttackContext(
        task, rollout.split, round_idx, sample,
        draw=draw, canonical=canonical, plan=tuple(planned_prompts(task, rollout, run_id, peer_id, round_idx)),
        share=rollout.completions_per_prompt,
    )  # fmt: skip


def generate(
    task: Task,
    learner: Learner,
    rollout: RolloutConfig,
    sampling: SamplingParams,
    run_id: str,
    peer_id: str,
    round_idx: int,
    adversary: Adversary | None = None,
    weights: str = "",
) -> list[Rollout]:
    """Generate this round's completions and wrap them as rollout messages: one per prompt, completion ``j``
    at index ``j``. ``weights``: the SHA-256 of the weights sampled with (announced, see
    :class:`~dgrpo.protocol.messages.Rollout`)."""
    prompts = plan(task, rollout, run_id, peer_id, round_idx, adversary)
    params = round_sampling(sampling, run_id, peer_id, round_idx)
    n = rollout.completions_per_prompt
    seeds = completion_seeds(run_id, peer_id, round_idx, prompts, n) if rollout.sampler == "seeded" else None
    sampled = learner.sample([p.text for p in prompts], n, params, seeds=seeds)
    texts = [[text for text, _ in per] for per in sampled]
    # With the seeded sampler, each completion's tokens go along (docs/protocol.md, "Sampled tokens"): the
    # sampling proof then checks exactly those, in one teacher-forced pass.
    tokens = [tuple(ids for _, ids in per) for per in sampled] if seeds is not None else [() for _ in prompts]
    ctx = attack_context(task, learner, rollout, run_id, peer_id, round_idx, params) if adversary else None
    if adversary is not None and ctx is not None:
        attacked = adversary.attack(ctx, prompts, texts)
        # tokens stay only with a prompt's completions the attack left as sampled
        tokens = [t if a == o else () for t, a, o in zip(tokens, attacked, texts, strict=True)]
        texts = attacked
    rollouts = [
        Rollout(
            author=peer_id,
            round=round_idx,
            part=i,
            parts=len(prompts),
            prompt_id=p.id,
            prompt=p.text,
            completions=tuple(c),
            indices=tuple(range(len(c))),
            model_id=learner.model_id,
            weights=weights,
            sampling=params,
            split=rollout.split,
            tokens=t,
        )
        for i, (p, c, t) in enumerate(zip(prompts, texts, tokens, strict=True))
    ]
    if adversary is not None and ctx is not None:
        return adversary.publish(ctx, rollouts)
    return rollouts
