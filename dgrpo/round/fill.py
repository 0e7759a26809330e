"""Local batch fill (async mode, ``rollout.async_fill``): keep every step's batch the size of a full one.

An async node trains each step on what has arrived (docs/scale.md). Beside a straggler, its peers deliver fewer
completions a step than a sync round holds (34 against 48 with one peer 3x slower on the default scenario), and
at equal steps it fell 3.8 points behind sync. AReaL (Fu et al., 2025, arXiv 2505.24298) keeps the batch fixed:
its trainer updates once B samples are in, whichever generator wrote them. Here a node does not wait for B: where
its peers delivered D fewer completions this step than a full step's (:class:`FillTracker`), it
writes D more of its own for the step's prompts with the weights it is about to update (so on-policy) and trains
on them too. They are never published: the plan binds what a node publishes, and these are its own business, as
a larger local batch would be. A node with all its peers on time fills nothing.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Mapping

from dgrpo.config import RolloutConfig
from dgrpo.learner.learner import Learner
from dgrpo.learner.sampler import completion_seed
from dgrpo.protocol.messages import Rollout, SamplingParams
from dgrpo.round.generate import plan, round_sampling
from dgrpo.round.outcome import Admitted
from dgrpo.seeds import stable_seed
from dgrpo.tasks.base import Task

WINDOW = 10  # steps over which a peer counts as taking part (a 3x straggler's rounds arrive every few steps)


class FillTracker:
    """What a full step's peers' share is: a round's completions (``share``, the plan's: every node of a run
    publishes as many) from every peer heard in the last ``window`` steps. Not the most ever delivered: peers'
    rounds bunch (two rounds of one peer in one step, none in the next), and a full step is their average."""

    def __init__(self, window: int = WINDOW) -> None:
        self._recent: deque[frozenset[str]] = deque(maxlen=window)

    def deficit(self, delivered: Mapping[str, int], share: int) -> int:
        """Record this step's peers' completions by author; how many fewer they are than a full step's."""
        self._recent.append(frozenset(delivered))
        peers = frozenset().union(*self._recent)
        return max(0, share * len(peers) - sum(delivered.values()))


def fill(
    task: Task,
    learner: Learner,
    rollout: RolloutConfig,
    sampling: SamplingParams,
    run_id: str,
    peer_id: str,
    round_idx: int,
    deficit: int,
    weights: str = "",
) -> list[Admitted]:
    """``deficit`` more completions (rounded up to whole prompts' worth) for this round's prompts, as the node's
    own, at indices past those it published, each with its own seed (the seeded sampler's for its index, or the
    round's seed mixed with ``"fill"``), so they are new samples, not copies of the published ones."""
    prompts = plan(task, rollout, run_id, peer_id, round_idx)
    if deficit <= 0 or not prompts:
        return []
    per = math.ceil(deficit / len(prompts))
    first = rollout.completions_per_prompt
    params = round_sampling(sampling, run_id, peer_id, round_idx)
    params = params.model_copy(update={"seed": stable_seed(params.seed, "fill")})
    seeds = None
    if rollout.sampler == "seeded":
        seeds = [[completion_seed(run_id, round_idx, peer_id, p.id, first + j) for j in range(per)] for p in prompts]
    texts = learner.generate([p.text for p in prompts], per, params, seeds=seeds)
    out = []
    for i, (p, c) in enumerate(zip(prompts, texts, strict=True)):
        r = Rollout(
            author=peer_id, round=round_idx, part=i, parts=len(prompts), prompt_id=p.id, prompt=p.text,
            completions=tuple(c), indices=tuple(range(first, first + len(c))), model_id=learner.model_id,
            weights=weights, sampling=params, split=rollout.split,
        )  # fmt: skip
        out.append(Admitted(r, p))
    return out
