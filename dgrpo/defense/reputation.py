"""Reputation: each peer's rejection rate over a window of rounds; past a threshold, the peer is blacklisted.

A blacklisted peer's messages stop reaching the learner: the daemon drops them at the gossipsub layer (py-libp2p's
pubsub blacklist) and the round no longer waits for the peer. Blacklisting is for the rest of the run, which is
what a poisoner that keeps sending rejected completions earns; the window only keeps one bad round of an honest
peer (numeric noise, a truncated message) from counting forever against it.

The rate rule can be diluted: an attacker mixing one poisoned completion into several honest ones stays
under the threshold. Evidence cannot: a failed sampling proof or a rollout breaking the plan binding is
something an honest peer never produces (measured FPR 0), so ``max_evidence`` such events over the whole
run blacklist the peer however many honest completions it also sends.
"""

from __future__ import annotations

from collections import defaultdict, deque
from typing import Any

from dgrpo.config import ReputationConfig


class Reputation:
    def __init__(self, cfg: ReputationConfig) -> None:
        self.cfg = cfg
        self._history: dict[str, deque[tuple[int, int, int]]] = defaultdict(deque)  # (round, received, rejected)
        self.evidence: dict[str, int] = {}  # peer -> evidence over the whole run (never forgotten)
        self.blacklisted: dict[str, int] = {}  # peer -> round it was blacklisted in

    def record(self, round_idx: int, peer: str, received: int, rejected: int, evidence: int = 0) -> None:
        if evidence > 0:
            self.evidence[peer] = self.evidence.get(peer, 0) + evidence
        if received <= 0:
            return
        history = self._history[peer]
        history.append((round_idx, received, rejected))
        while history and history[0][0] <= round_idx - self.cfg.window:
            history.popleft()

    def rate(self, peer: str) -> tuple[float, int]:
        """(rejection rate, completions received) over the window."""
        history = self._history.get(peer, ())
        received = sum(h[1] for h in history)
        rejected = sum(h[2] for h in history)
        return (rejected / received if received else 0.0), received

    def update(self, round_idx: int) -> list[str]:
        """Blacklist the peers now past the threshold; returns the newly blacklisted ones."""
        if not self.cfg.enabled:
            return []
        new = []
        for peer in sorted(self._history):  # the rate rule
            if peer in self.blacklisted:
                continue
            rate, received = self.rate(peer)
            if received >= self.cfg.min_completions and rate >= self.cfg.threshold:
                self.blacklisted[peer] = round_idx
                new.append(peer)
        for peer in sorted(self.evidence):
            if peer not in self.blacklisted and self.evidence[peer] >= self.cfg.max_evidence:
                self.blacklisted[peer] = round_idx
                new.append(peer)
        return new

    def is_blacklisted(self, peer: str) -> bool:
        return peer in self.blacklisted

    def to_dict(self) -> dict[str, Any]:
        """The state a checkpoint keeps (a restarted node keeps its blacklist and the rates in progress)."""
        return {
            "history": {peer: [list(h) for h in history] for peer, history in self._history.items()},
            "blacklisted": dict(self.blacklisted),
            "evidence": dict(self.evidence),
        }

    def load(self, state: dict[str, Any]) -> None:
        """Restore :meth:`to_dict`'s state (unknown or malformed entries are skipped: a checkpoint is ours,
        but an old one may predate a field)."""
        for peer, history in dict(state.get("history", {})).items():
            self._history[str(peer)] = deque((int(r), int(n), int(k)) for r, n, k in history)
        self.blacklisted.update({str(p): int(r) for p, r in dict(state.get("blacklisted", {})).items()})
        self.evidence.update({str(p): int(n) for p, n in dict(state.get("evidence", {})).items()})

    def snapshot(self) -> dict[str, dict[str, float | int | bool]]:
        out: dict[str, dict[str, float | int | bool]] = {}
        for peer in sorted(set(self._history) | set(self.blacklisted) | set(self.evidence)):
            rate, received = self.rate(peer)
            out[peer] = {
                "rejection_rate": rate,
                "window_received": received,
                "evidence": self.evidence.get(peer, 0),
                "blacklisted": peer in self.blacklisted,
            }
        return out
