"""The receiver's own samples of a model another author announces: a fair null for that author's patterns.

A cross-model defense that judges an author by comparing its completions with "what others write" must
compare like with like: a digits-only model's lengths or wording say nothing about an English-writing one's.
Where too few other authors run the author's model, the receiver samples the model itself, as published (the
announcement names it): the base model, not the author's current weights, which honest training moves only
slowly. Only models the receiver may load are sampled: the embedded ``dgrpo:`` ones and those a defense lists
(an announcement is the author's word, and must not make the receiver fetch anything it names).

Samples are kept per (run, round, receiver, model), so that the defenses of one node share them, and drawn
with the run's sampling under a seed of their own.
"""

from __future__ import annotations

import functools
import logging
import threading
from collections import OrderedDict, deque
from collections.abc import Sequence
from typing import Annotated, Protocol, TypeVar

from pydantic import Field

from dgrpo.config import LearnerConfig, ModelConfig, Section
from dgrpo.defense.base import DefenseContext
from dgrpo.learner.learner import TORCH_LOCK, Learner
from dgrpo.seeds import stable_seed
from dgrpo.tasks.base import Prompt

log = logging.getLogger(__name__)

_LOCK = threading.Lock()
_CACHE: OrderedDict[tuple[str, int, str, str], list[tuple[Prompt, str]]] = OrderedDict()
_CACHE_SIZE = 256


@functools.cache
def _learner(model_id: str) -> tuple[Learner, threading.Lock]:
    with TORCH_LOCK:
        return Learner(ModelConfig(name=model_id), LearnerConfig()), threading.Lock()


def loadable(model_id: str, allowed: Sequence[str]) -> bool:
    return model_id.startswith("dgrpo:") or model_id in allowed


def reference_completions(
    ctx: DefenseContext, model_id: str, prompts: Sequence[Prompt], n: int, allowed: Sequence[str] = ()
) -> list[tuple[Prompt, str]]:
    """About ``n`` completions of ``model_id`` for the round's ``prompts`` (an even share each); empty when the
    model may not or cannot be loaded."""
    if n <= 0 or not prompts or not loadable(model_id, allowed):
        return []
    key = (ctx.run_id, ctx.round, ctx.self_id, model_id)
    with _LOCK:
        if key in _CACHE:
            return _CACHE[key]
    try:
        with _LOCK:
            learner, lock = _learner(model_id)
    except Exception as exc:  # a model that cannot be loaded judges nothing; it never fails the chain
        log.warning("cannot load %s for a reference: %s", model_id, exc)
        return []
    distinct = list({p.id: p for p in prompts}.values())
    per_prompt = max(1, -(-n // len(distinct)))
    seed = stable_seed("dgrpo/reference-samples/1", ctx.run_id, ctx.round, ctx.self_id, model_id)
    with lock:
        texts = learner.generate([p.text for p in distinct], per_prompt, ctx.sampling.model_copy(update={"seed": seed}))
    out = [(p, t) for p, ts in zip(distinct, texts, strict=True) for t in ts]
    with _LOCK:
        _CACHE[key] = out
        while len(_CACHE) > _CACHE_SIZE:
            _CACHE.popitem(last=False)
    return out


class PatternOptions(Section):
    """Options every defense judging an author's pattern against its model shares."""

    memory_rounds: Annotated[int, Field(ge=0, description="earlier rounds remembered")] = 4
    reference_samples: Annotated[
        int, Field(ge=0, description="own samples of a model too few others run, per round (0: never sample)")
    ] = 32
    reference_models: Annotated[
        list[str], Field(description="models the receiver may load to sample a reference (dgrpo: ones always)")
    ] = Field(default_factory=list)


class ReferenceDraws:
    """One defense's reference samples: each (round, model)'s drawn on first need and handed out once (the
    defense keeps what it makes of them)."""

    def __init__(self) -> None:
        self.done: set[tuple[int, str]] = set()

    def new(
        self, ctx: DefenseContext, model_id: str, prompts: Sequence[Prompt], options: PatternOptions
    ) -> list[tuple[Prompt, str]]:
        if (ctx.round, model_id) in self.done:
            return []
        self.done = {key for key in self.done if key[0] >= ctx.round} | {(ctx.round, model_id)}
        return reference_completions(ctx, model_id, prompts, options.reference_samples, options.reference_models)


class _Dated(Protocol):
    @property
    def round(self) -> int: ...


D = TypeVar("D", bound=_Dated)


def forget(memory: deque[D], round_idx: int, memory_rounds: int) -> None:
    """Drop from the left of ``memory`` (oldest first) what is older than the remembered rounds."""
    while memory and memory[0].round < round_idx - memory_rounds:
        memory.popleft()
