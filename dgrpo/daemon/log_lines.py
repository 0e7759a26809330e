"""One short human line per round, from the round's record (the dict ``rounds.jsonl`` keeps): what an operator
reads in ``node.log``, as ``dgrpo simulate`` prints its rounds. Pure functions, so the exact text is tested."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

SHORT_PEER = 8  # peer ids are shown by their last characters, as the status table shows them


def round_text(record: Mapping[str, Any]) -> str:
    """``round  12  peers 3  accepted 36  rejected 2 (defense: logit:outside_top_k)  reward 0.412  3.1s``.

    ``record`` is :func:`dgrpo.daemon.observers.round_line`'s dict (plus ``accuracy`` in rounds evaluated)."""
    parts = [
        f"round {record['round']:>3}",
        f"peers {record['expected_peers']}",
        f"accepted {record['completions']}",
        _rejected(record.get("rejected") or {}, record.get("defense_rejected") or {}),
        f"reward {record['mean_reward']:.3f}",
    ]
    if record.get("accuracy") is not None:
        parts.append(f"accuracy {record['accuracy']:.3f}")
    if record.get("departed"):
        parts.append(f"departed {_peers(record['departed'])}")
    parts.append(f"{record['seconds']:.1f}s")
    return "  ".join(parts)


def federated_round_text(row: Mapping[str, Any]) -> str:
    """``round  12  federated aggregator  clients 3  reward 0.412  3.1s``, and what went wrong where anything did
    (updates missing at the deadline or computed against other weights, no global update applied, divergence).

    ``row`` is the federated daemon's per-round record (``rounds.jsonl``)."""
    parts = [
        f"round {row['round']:>3}",
        f"federated {row.get('role', '?')}",
        f"clients {len(row.get('clients') or ())}",
        f"reward {row['local_mean']:.3f}",
    ]
    if row.get("accuracy") is not None:
        parts.append(f"accuracy {row['accuracy']:.3f}")
    if row.get("missing"):
        parts.append(f"missing {_peers(row['missing'])}")
    if row.get("stale"):
        parts.append(f"stale {_peers(row['stale'])}")
    if not row.get("applied", True):
        parts.append("no global update")
    if row.get("diverged"):
        parts.append("diverged")
    parts.append(f"{row['seconds']:.1f}s")
    return "  ".join(parts)


def _rejected(admission: Mapping[str, int], defense: Mapping[str, int]) -> str:
    """``rejected 0``; ``rejected 2 (defense: logit:outside_top_k)``; with several reasons each its count:
    ``rejected 5 (admission: stale_round 3; defense: length 2)``."""
    given = [("admission", admission), ("defense", defense)]
    groups = [(name, {r: n for r, n in reasons.items() if n}) for name, reasons in given]
    total = sum(n for _, reasons in groups for n in reasons.values())
    if total == 0:
        return "rejected 0"
    several = sum(len(reasons) for _, reasons in groups) > 1  # one reason: its count is the total, said once
    said = []
    for name, reasons in groups:
        if reasons:
            ranked = sorted(reasons.items(), key=lambda item: (-item[1], item[0]))
            said.append(f"{name}: " + ", ".join(f"{r} {n}" if several else r for r, n in ranked))
    return f"rejected {total} ({'; '.join(said)})"


def _peers(peers: Sequence[str]) -> str:
    return ",".join(str(p)[-SHORT_PEER:] for p in peers)
