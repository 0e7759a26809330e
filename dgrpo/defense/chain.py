"""A configured chain of defenses, run cheapest first; each sees only what the earlier ones accepted.

The first rejection is the verdict (its reason names the defense). A defense that raises is a bug or a
resource failure, not a reason to crash the node or to let a completion through unchecked: its candidates
are rejected with reason ``<name>:error`` and the exception is logged.
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


class DefenseChain:
    def __init__(self, defenses: Sequence[Defense]) -> None:
        self.defenses = sorted(defenses, key=lambda d: d.cost)  # stable: equal costs keep the given order

    @classmethod
    def from_config(cls, cfg: DefenseConfig) -> DefenseChain:
        unknown = set(cfg.options) - set(cfg.chain)
        if unknown:
            raise ValueError(f"defense options for {sorted(unknown)} which are not in the chain {cfg.chain}")
        return cls([DEFENSES.get(name)(cfg.options.get(name)) for name in cfg.chain])

    @property
    def names(self) -> list[str]:
        return [d.name for d in self.defenses]

    @property
    def needs_model(self) -> bool:
        return any(d.needs_model for d in self.defenses)

    def run(self, ctx: DefenseContext, candidates: Sequence[Candidate]) -> ChainResult:
        verdicts: list[Verdict] = [ACCEPT] * len(candidates)
        scale = [1.0] * len(candidates)
        result = ChainResult(verdicts)
        pending = list(range(len(candidates)))
        for defense in self.defenses:
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
        return result
