"""A configured chain of defenses, run cheapest first; each sees only what the earlier ones accepted.

The first rejection is the verdict (its reason names the defense). A defense that raises is a bug or a
resource failure, not a reason to crash the node or to let a completion through unchecked: its candidates
are rejected with reason ``<name>:error`` and the exception is logged.

Routing by author: a same-model check (``logit``, ``sampling-proof``) compares a completion with the
receiver's own logits, which says something only when the author sampled from the same weights. Each
completion's author announces its model and weights digest; those announcing the receiver's go through the
chain, the others through the foreign chain (``defense.foreign``), which holds no same-model check. Without
one, a chain with same-model checks rejects them (``route:foreign_model``): in a homogeneous network every
honest peer holds the receiver's weights, and an author claiming others would otherwise escape the proof.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

from dgrpo.config import DefenseConfig
from dgrpo.defense.base import ACCEPT, Candidate, Defense, DefenseContext, Verdict
from dgrpo.defense.registry import DEFENSES

log = logging.getLogger(__name__)


@dataclass
class ChainResult:
    verdicts: list[Verdict]
    seconds: dict[str, float] = field(default_factory=dict)  # per defense
    rejected_by: Counter[str] = field(default_factory=Counter)  # per defense

    @property
    def total_seconds(self) -> float:
        return sum(self.seconds.values())


FOREIGN_MODEL = Verdict(False, "route:foreign_model")


class DefenseChain:
    """``defenses`` for authors with the receiver's model and weights; ``foreign`` for the others (None: the
    same chain when it has no same-model check, else they are rejected)."""

    def __init__(self, defenses: Sequence[Defense], foreign: Sequence[Defense] | None = None) -> None:
        self.defenses = sorted(defenses, key=lambda d: d.cost)  # stable: equal costs keep the given order
        bad = [d.name for d in foreign or () if d.same_model]
        if bad:
            raise ValueError(f"the foreign chain holds same-model checks {bad}")
        if foreign is not None:
            self.foreign: list[Defense] | None = sorted(foreign, key=lambda d: d.cost)
        else:
            self.foreign = None if any(d.same_model for d in self.defenses) else self.defenses

    @classmethod
    def from_config(cls, cfg: DefenseConfig) -> DefenseChain:
        names = set(cfg.chain) | set(cfg.foreign or ())
        unknown = set(cfg.options) - names
        if unknown:
            raise ValueError(f"defense options for {sorted(unknown)} which are not in the chains {sorted(names)}")
        built = {
            name: DEFENSES.get(name)(cfg.options.get(name))
            for name in dict.fromkeys([*cfg.chain, *(cfg.foreign or ())])
        }
        foreign = [built[name] for name in cfg.foreign] if cfg.foreign is not None else None
        return cls([built[name] for name in cfg.chain], foreign)

    @property
    def names(self) -> list[str]:
        foreign = [f"foreign:{d.name}" for d in self.foreign or () if self.foreign is not self.defenses]
        return [d.name for d in self.defenses] + foreign

    @property
    def needs_model(self) -> bool:
        return any(d.needs_model for d in [*self.defenses, *(self.foreign or ())])

    def proof_names(self) -> frozenset[str]:
        """Names of the defenses whose rejections are proof (:attr:`Defense.proof`)."""
        return frozenset(d.name for d in [*self.defenses, *(self.foreign or ())] if d.proof)

    def run(self, ctx: DefenseContext, candidates: Sequence[Candidate]) -> ChainResult:
        result = ChainResult([ACCEPT] * len(candidates))
        if self.foreign is self.defenses:
            self._run(self.defenses, ctx, candidates, list(range(len(candidates))), result)
            return result
        same = [i for i, c in enumerate(candidates) if ctx.same_model(c)]
        other = [i for i, c in enumerate(candidates) if not ctx.same_model(c)]
        self._run(self.defenses, ctx, candidates, same, result)
        if self.foreign is None:
            for i in other:
                result.verdicts[i] = FOREIGN_MODEL
            if other:
                result.rejected_by["route"] += len(other)
        else:
            self._run(self.foreign, ctx, candidates, other, result)
        return result

    def _run(
        self,
        defenses: Sequence[Defense],
        ctx: DefenseContext,
        candidates: Sequence[Candidate],
        pending: list[int],
        result: ChainResult,
    ) -> None:
        verdicts = result.verdicts
        scale = {i: 1.0 for i in pending}
        for defense in defenses:
            if not pending:
                break
            t0 = time.perf_counter()
            try:
                out = defense.check(ctx, [candidates[i] for i in pending])
                if len(out) != len(pending):
                    raise RuntimeError(f"returned {len(out)} verdicts for {len(pending)} completions")
            except Exception:
                log.exception(
                    "defense %s failed; rejecting the %d completions it was checking", defense.name, len(pending)
                )
                out = [defense.reject("error")] * len(pending)
            result.seconds[defense.name] = result.seconds.get(defense.name, 0.0) + time.perf_counter() - t0
            kept = []
            for i, verdict in zip(pending, out, strict=True):
                if verdict.accept:
                    scale[i] *= verdict.reward_scale
                    kept.append(i)
                else:
                    verdicts[i] = verdict
                    result.rejected_by[defense.name] += 1
            pending = kept
        for i in pending:
            if scale[i] != 1.0:
                verdicts[i] = Verdict(True, reward_scale=scale[i])
