"""Defense metrics, measured the way "Hail to the Thief" reports its defenses (sec. 6), per round and overall:

- stop rate: poisoned completions rejected / poisoned completions received (by honest nodes; completions of a
  blacklisted attacker are received and stopped);
- false-positive rate: honest completions rejected / honest completions received. Each node checks only
  other nodes' completions, so in the homogeneous setting this is measured on completions the verifier did not
  make itself;
- overhead: defense seconds / generation seconds of the same completions, in the same run. The generation
  cost of a checked completion is the checking node's own cost per completion that round (same model, same
  machine); completions dropped unchecked (blacklisted) count in neither.

Rejections by the admit stage (plan binding, canonical text, a blacklisted author) count as stops like a
defense's: the poison never reaches the learner. Without a chain, the admit stage is the only filter.

Poison is known exactly: each attacker records the (prompt id, text) pairs it poisoned this round. The
attacker's other completions (honest fill, gibberish) are counted apart, as ``attacker_other``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

from dgrpo.round.observer import RoundObserver
from dgrpo.round.outcome import Checked, RoundOutcome


class DefenseMeter(RoundObserver):
    """Reads each round's outcomes: attackers' (their ``produced`` record names what they poisoned) and honest
    nodes' (what their defenses did). ``rows``: one per round, by round."""

    def __init__(self) -> None:
        self.totals: Counter[str] = Counter()
        self.reasons: Counter[str] = Counter()
        self.reasons_by_kind: Counter[tuple[str, str]] = Counter()  # (poison | attacker_other | honest, reason)
        self.defense_seconds = 0.0
        self.generation_seconds = 0.0
        self.blacklisted: dict[str, dict[str, int]] = {}  # checker -> {peer: round}
        self.rows: dict[int, dict[str, Any]] = {}
        self.honest_by_author: Counter[tuple[str, str]] = Counter()  # (author, received | rejected)

    def on_round(self, round_idx: int, outcomes: Sequence[RoundOutcome]) -> None:
        self.rows[round_idx] = self.observe(round_idx, outcomes)

    def observe(self, round_idx: int, outcomes: Sequence[RoundOutcome]) -> dict[str, Any]:
        poisoned = {o.peer_id: o.produced.poisoned for o in outcomes if o.produced.attack is not None}
        honest = {o.peer_id for o in outcomes if o.produced.attack is None}
        row: Counter[str] = Counter()
        defense_seconds = generation_seconds = 0.0
        for o in outcomes:
            if o.peer_id not in honest:
                continue
            produced = o.produced
            per_completion = produced.seconds / produced.completions if produced.completions else 0.0
            checked = [*o.admission.dropped, *(o.defense.checked if o.defense is not None else admitted(o))]
            for c in checked:
                if c.author in poisoned:
                    kind = "poison" if (c.prompt_id, c.text) in poisoned[c.author] else "attacker_other"
                elif c.author in honest:
                    kind = "honest"
                else:
                    continue
                row[f"{kind}_received"] += 1
                if kind == "honest":
                    self.honest_by_author[(c.author, "received")] += 1
                    self.honest_by_author[(c.author, "rejected")] += not c.accepted
                if not c.accepted:
                    row[f"{kind}_rejected"] += 1
                    self.reasons[c.reason] += 1
                    self.reasons_by_kind[(kind, c.reason)] += 1
                if c.reason != "blacklisted":
                    generation_seconds += per_completion
            if o.defense is not None:
                defense_seconds += sum(o.defense.seconds.values())
                for peer in o.defense.blacklisted_now:
                    self.blacklisted.setdefault(o.peer_id, {})[peer] = round_idx
        self.totals.update(row)
        self.defense_seconds += defense_seconds
        self.generation_seconds += generation_seconds
        return {
            **dict(row),
            "stop_rate": _rate(row, "poison"),
            "false_positive_rate": _rate(row, "honest"),
            "overhead_ratio": defense_seconds / generation_seconds if generation_seconds else None,
        }

    def summary(self, names: Sequence[str], models: Mapping[str, str] | None = None) -> dict[str, Any]:
        """``models``: each author's model, for the false-positive rate per honest model family (issue 28: a
        cross-model defense must hold for every family, not on average)."""
        by_model: Counter[tuple[str, str]] = Counter()
        for (author, what), n in self.honest_by_author.items():
            by_model[((models or {}).get(author, author), what)] += n
        per_model = {
            m: by_model[(m, "rejected")] / n for (m, what), n in sorted(by_model.items()) if what == "received" and n
        }
        return {
            "names": list(names),
            "stop_rate": _rate(self.totals, "poison"),
            "false_positive_rate": _rate(self.totals, "honest"),
            "false_positive_rate_by_model": per_model,
            "overhead_ratio": self.defense_seconds / self.generation_seconds if self.generation_seconds else None,
            "counts": dict(self.totals),
            "rejected_by_reason": dict(self.reasons),
            "rejected_by_kind": {  # what each defense cost honest nodes, apart from what it stopped
                kind: {r: n for (k, r), n in sorted(self.reasons_by_kind.items()) if k == kind}
                for kind in sorted({k for k, _ in self.reasons_by_kind})
            },
            "blacklisted": self.blacklisted,
            "defense_seconds": self.defense_seconds,
            "generation_seconds": self.generation_seconds,
        }


def admitted(o: RoundOutcome) -> list[Checked]:
    """A node without a chain accepts every peer completion the admit stage let through."""
    return [
        Checked(a.rollout.author, a.rollout.prompt_id, text, True, "")
        for a in o.admission.admitted
        if a.rollout.author != o.peer_id
        for text in a.rollout.completions
    ]


def _rate(counts: Counter[str], kind: str) -> float | None:
    received = counts[f"{kind}_received"]
    return counts[f"{kind}_rejected"] / received if received else None
