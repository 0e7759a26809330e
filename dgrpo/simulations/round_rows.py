"""``metrics.jsonl``'s rows: one per round over all of a simulation's nodes (an observer of the round's typed
outcomes, after the defense meter and the evaluator, whose numbers for that round it includes)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

from dgrpo.round.observer import RoundObserver
from dgrpo.round.outcome import RoundOutcome
from dgrpo.simulations.defense_metrics import DefenseMeter
from dgrpo.simulations.evaluation import EvalPoint, Evaluator


class RoundRows(RoundObserver):
    """``metrics.jsonl``: one row per round over all nodes (rewards and loss of the honest ones), with the
    defense meter's and the evaluator's numbers for that round (they observe first)."""

    def __init__(self, meter: DefenseMeter | None, evaluator: Evaluator) -> None:
        self.meter = meter
        self.evaluator = evaluator
        self.rows: list[dict[str, Any]] = []
        self.trained = self.trained_from_attackers = 0  # completions honest nodes trained on, over the run

    def attacker_share(self) -> float | None:
        """The attackers' share of every completion the honest nodes trained on (their fair share is
        ``malicious / count``: each node contributes the same share of every round)."""
        return self.trained_from_attackers / self.trained if self.trained else None

    def on_round(self, round_idx: int, outcomes: Sequence[RoundOutcome]) -> None:
        honest = [o for o in outcomes if o.produced.attack is None]
        attackers = {o.peer_id for o in outcomes if o.produced.attack is not None}
        trained = sum(o.completions_trained for o in honest)
        from_attackers = sum(1 for o in honest for s in o.scoring.scored if s.author in attackers)
        self.trained += trained
        self.trained_from_attackers += from_attackers
        rejected: Counter[str] = Counter()
        for o in outcomes:
            rejected.update(o.admission.rejected)
        losses = [o.step.loss for o in honest if o.step is not None]
        row: dict[str, Any] = {
            "round": round_idx,
            "honest_mean_reward": sum(o.scoring.mean_reward for o in honest) / max(len(honest), 1),
            "honest_own_reward": sum(o.scoring.mean_reward_of(o.peer_id) for o in honest) / max(len(honest), 1),
            "completions_exchanged": sum(o.produced.completions for o in outcomes),
            "completions_accepted": sum(o.completions_trained for o in outcomes),
            "rejected": dict(rejected),
            "loss": sum(losses) / len(losses) if losses else None,
            "seconds": max((o.round_seconds for o in outcomes), default=0.0),
            "reward_seconds": sum(o.scoring.seconds for o in outcomes),
            "poison_published": sum(o.produced.poisoned_count for o in outcomes),
            "attacker_share": from_attackers / trained if trained and attackers else None,
        }
        row["by_author"] = _by_author(honest)
        if self.meter is not None:
            row["defense"] = self.meter.rows[round_idx]
        point = self.evaluator.point_at(round_idx)
        if point is not None:
            row.update(eval_fields(point))
        self.rows.append(row)


def _by_author(honest: Sequence[RoundOutcome]) -> dict[str, dict[str, int]]:
    """Per author, over the honest nodes' round: completions trained on (scored), peers' completions the
    defenses checked and rejected, and messages the admit stage rejected (the HTML report's peer table)."""
    table: dict[str, Counter[str]] = {}

    def add(author: str, key: str, n: int) -> None:
        table.setdefault(author, Counter())[key] += n

    for o in honest:
        for s in o.scoring.scored:
            if s.author != o.peer_id:
                add(s.author, "trained", 1)
        for author, n in o.admission.rejected_by_author.items():
            add(author, "admission_rejected", n)
        if o.defense is not None:
            for author, n in o.defense.checked_by_author.items():
                add(author, "defense_checked", n)
            for author, n in o.defense.rejected_by_author.items():
                add(author, "defense_rejected", n)
    return {author: dict(sorted(c.items())) for author, c in sorted(table.items())}


def eval_fields(point: EvalPoint) -> dict[str, Any]:
    row: dict[str, Any] = {"accuracy": point.accuracy, "mean_length": point.mean_length}
    if point.asr is not None:
        row["asr"] = point.asr
    return row
