"""Defense metrics, measured the way "Hail to the Thief" reports its defenses (sec. 6), per round and overall:

- stop rate: poisoned completions rejected / poisoned completions received (by honest nodes; completions of a
  blacklisted attacker are received and stopped);
- false-positive rate: honest completions rejected / honest completions received. Each node checks only
  other nodes' completions, so in the homogeneous setting this is measured on completions the verifier did not
  make itself;
- overhead: defense seconds / generation seconds of the same completions, in the same run. The generation
  cost of a checked completion is the checking node's own cost per completion that round (same model, same
  machine); completions dropped unchecked (blacklisted) count in neither.

Poison is known exactly: each attacker records the (prompt id, text) pairs it poisoned this round. The
attacker's other completions (honest fill, gibberish) are counted apart, as ``attacker_other``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

from dgrpo.node.node import Node, RoundReport


class DefenseMeter:
    def __init__(self, nodes: Sequence[Node]) -> None:
        self.attackers = {n.peer_id: n for n in nodes if n.adversary is not None}
        self.honest = {n.peer_id for n in nodes if n.adversary is None}
        self.totals: Counter[str] = Counter()
        self.reasons: Counter[str] = Counter()
        self.defense_seconds = 0.0
        self.generation_seconds = 0.0
        self.blacklisted: dict[str, dict[str, int]] = {}  # checker -> {peer: round}

    def observe(self, round_idx: int, reports: Sequence[RoundReport]) -> dict[str, Any]:
        poisoned = {
            peer: node.adversary.stats.last_poisoned
            for peer, node in self.attackers.items()
            if node.adversary is not None
        }
        row: Counter[str] = Counter()
        defense_seconds = generation_seconds = 0.0
        for r in reports:
            if r.peer_id not in self.honest:
                continue
            per_completion = r.produce_seconds / r.completions_published if r.completions_published else 0.0
            for c in r.checked:
                if c.author in poisoned:
                    kind = "poison" if (c.prompt_id, c.text) in poisoned[c.author] else "attacker_other"
                elif c.author in self.honest:
                    kind = "honest"
                else:
                    continue
                row[f"{kind}_received"] += 1
                if not c.accepted:
                    row[f"{kind}_rejected"] += 1
                    self.reasons[c.reason] += 1
                if c.reason != "blacklisted":
                    generation_seconds += per_completion
            defense_seconds += sum(r.defense_seconds.values())
            for peer in r.blacklisted_now:
                self.blacklisted.setdefault(r.peer_id, {})[peer] = round_idx
        self.totals.update(row)
        self.defense_seconds += defense_seconds
        self.generation_seconds += generation_seconds
        return {
            **dict(row),
            "stop_rate": _rate(row, "poison"),
            "false_positive_rate": _rate(row, "honest"),
            "overhead_ratio": defense_seconds / generation_seconds if generation_seconds else None,
        }

    def summary(self, names: Sequence[str]) -> dict[str, Any]:
        return {
            "names": list(names),
            "stop_rate": _rate(self.totals, "poison"),
            "false_positive_rate": _rate(self.totals, "honest"),
            "overhead_ratio": self.defense_seconds / self.generation_seconds if self.generation_seconds else None,
            "counts": dict(self.totals),
            "rejected_by_reason": dict(self.reasons),
            "blacklisted": self.blacklisted,
            "defense_seconds": self.defense_seconds,
            "generation_seconds": self.generation_seconds,
        }


def _rate(counts: Counter[str], kind: str) -> float | None:
    received = counts[f"{kind}_received"]
    return counts[f"{kind}_rejected"] / received if received else None
