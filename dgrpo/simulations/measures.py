"""What a study's table can show of a run: measures, registered by name (``columns = [...]`` in a study).

A measure has a number (what the CSV holds, what is averaged over seeds: mean and standard error) and, for a
single run, may have a richer text (``stop``: ``0.948 (23/24)``). A measure with only a text (the reasons
behind the rejections) shows seed 0's where a cell has several seeds. Adding one is a function here.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from dgrpo.registry import Registry
from dgrpo.simulations.study import Holds
from dgrpo.simulations.summary import RunSummary

SHORT_MODEL = {
    "dgrpo:tiny-arith": "arith",
    "dgrpo:tiny-arith-llama": "llama",
    "dgrpo:tiny-arith-text": "text",
    "dgrpo:tiny-arith-code-text": "code-text",
}


@dataclass(frozen=True)
class Context:
    """What a table adds to a run: the baseline run (DoS lengths), the target of ``holds``."""

    baseline: RunSummary | None = None
    holds: Holds | None = None


Number = Callable[[RunSummary, Context], float | None]
Text = Callable[[RunSummary, Context], str]


@dataclass(frozen=True)
class Measure:
    header: str
    number: Number | None = None
    text: Text | None = None
    digits: int = 3
    whole: bool = False  # a count: printed as an integer

    def show(self, runs: Sequence[RunSummary], ctx: Context) -> str:
        """One table cell: the run's text or number; over several seeds, mean ± standard error."""
        if not runs:
            return "-"
        if len(runs) == 1 or self.number is None:
            if self.text is not None:
                return self.text(runs[0], ctx)
            return self.format(self.number(runs[0], ctx) if self.number is not None else None)
        values = [v for r in runs if (v := self.number(r, ctx)) is not None]
        if not values:
            return "-"
        mean, se = mean_se(values)
        return self.format(mean) + ("" if se is None else f" ± {se:.{self.digits}f}")

    def format(self, value: float | None) -> str:
        if value is None:
            return "-"
        if self.whole and float(value).is_integer():
            return str(int(value))
        return f"{value:.{self.digits}f}"


def mean_se(values: Sequence[float]) -> tuple[float, float | None]:
    """The mean and its standard error (sample standard deviation / sqrt(n); None for one value)."""
    mean = sum(values) / len(values)
    if len(values) < 2:
        return mean, None
    return mean, math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1) / len(values))


MEASURES: Registry[Measure] = Registry("measure")


def measure(
    name: str, header: str, number: Number | None = None, text: Text | None = None, digits: int = 3, whole: bool = False
) -> None:
    MEASURES.register(name)(Measure(header, number, text, digits, whole))


def _ratio(s: RunSummary, kind: str) -> str:
    if s.defense is None:
        return ""
    rejected, received = s.defense.ratio(kind)
    return f" ({rejected}/{received})" if received else ""


def _rate_text(value: float | None, s: RunSummary, kind: str) -> str:
    return "-" if value is None else f"{value:.3f}{_ratio(s, kind)}"


def _families(s: RunSummary) -> dict[str, float]:
    by_model = s.defense.false_positive_rate_by_model if s.defense is not None else {}
    return {SHORT_MODEL.get(m, m): r for m, r in by_model.items()}


def _worst_family(s: RunSummary, ctx: Context) -> float | None:
    families = _families(s)
    return max(families.values()) if families else (s.false_positive_rate if s.defense is not None else None)


def _holds(s: RunSummary, ctx: Context) -> float | None:
    target = ctx.holds or Holds()
    stop, fpr, worst = s.stop_rate, s.false_positive_rate, _worst_family(s, ctx)
    ok = (
        (target.stop_min is None or (stop is not None and stop >= target.stop_min))
        and (target.fpr_max is None or (fpr or 0.0) <= target.fpr_max)
        and (target.family_fpr_max is None or (worst or 0.0) <= target.family_fpr_max)
    )
    return 1.0 if ok else 0.0


def _top(reasons: dict[str, int], n: int | None = 3) -> str:
    return ", ".join(f"{k} {v}" for k, v in Counter(reasons).most_common(n)) or "-"


def _asr_text(s: RunSummary, ctx: Context) -> str:
    if s.final_asr is None:
        return "-"
    return f"{s.final_asr:.1f} chars" if s.length_metric else f"{s.final_asr:.3f}"


def _length_vs(s: RunSummary, ctx: Context) -> float | None:
    base = ctx.baseline.final_mean_length if ctx.baseline is not None else None
    return s.final_mean_length / base if s.final_mean_length is not None and base else None


measure("seeds", "seeds", lambda s, c: 1.0, whole=True)  # counted by the table, not averaged
measure("rounds", "rounds", lambda s, c: float(s.rounds_done if s.rounds_done is not None else s.rounds), whole=True)
measure("initial_accuracy", "initial accuracy", lambda s, c: s.initial_accuracy)
measure("final_accuracy", "honest accuracy", lambda s, c: s.honest_accuracy)
measure(
    "accuracy",
    "honest accuracy",
    lambda s, c: s.honest_accuracy,
    lambda s, c: f"{s.initial_accuracy:.3f} -> {s.honest_accuracy:.3f}",
)
measure("reward", "final honest reward", lambda s, c: s.final_honest_reward)
measure("asr", "final ASR (metric)", lambda s, c: s.final_asr, _asr_text)
measure("asr_rate", "final ASR", lambda s, c: s.final_rate)
measure("max_asr", "max ASR", lambda s, c: None if s.length_metric else s.max_asr)
measure("length", "final mean length", lambda s, c: s.final_mean_length, digits=1)
measure("length_vs_baseline", "length / baseline", _length_vs, digits=2)
measure(
    "stop", "stop rate (stopped/poisoned)", lambda s, c: s.stop_rate, lambda s, c: _rate_text(s.stop_rate, s, "poison")
)
measure(
    "fpr",
    "FPR (honest rejected/received)",
    lambda s, c: s.false_positive_rate,
    lambda s, c: _rate_text(s.false_positive_rate, s, "honest"),
)
measure(
    "fpr_by_family",
    "FPR per honest family",
    text=lambda s, c: " ".join(f"{m} {r:.3f}" for m, r in sorted(_families(s).items())) or "-",
)
measure("worst_family_fpr", "worst", _worst_family)
measure("holds", "holds", _holds, lambda s, c: "yes" if _holds(s, c) else "**no**", whole=True)
measure("attacker_share", "attacker share", lambda s, c: s.attacker_share)
measure("fair_share", "fair share", lambda s, c: s.fair_share if s.malicious else None)
measure(
    "reasons",
    "most frequent reasons",
    text=lambda s, c: _top(s.defense.rejected_by_reason) if s.defense is not None else "-",
)
measure(
    "honest_reasons",
    "honest completions rejected by",
    text=lambda s, c: _top((s.defense.rejected_by_kind.get("honest") or {}), None) if s.defense is not None else "-",
)
measure("overhead", "overhead ratio", lambda s, c: s.defense.overhead_ratio if s.defense is not None else None)
measure("chain", "defense", text=lambda s, c: s.chain)
measure("attack", "attack", text=lambda s, c: s.attack or "none")
measure("split", "split", text=lambda s, c: s.split or "-")
measure("malicious", "malicious", lambda s, c: float(s.malicious), whole=True)
measure("metric", "metric", text=lambda s, c: s.asr_metric or "-")
measure("wall_seconds", "seconds", lambda s, c: s.wall_seconds, digits=0)
