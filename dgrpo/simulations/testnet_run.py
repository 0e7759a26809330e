"""A ``dgrpo testnet up --out DIR`` folder read as one run, so that ``dgrpo report`` compares it with simulations.

The folder holds ``node-<i>/`` per daemon: ``rounds.jsonl`` (one row per round it finished,
:class:`dgrpo.daemon.observers.RoundLog`), ``settings.json`` (its configuration), ``status.json`` (its last
``/status``, written when it stops) and ``node.json`` (its peer id). From them:

- a :class:`~dgrpo.simulations.summary.RunSummary` (:func:`summarise_testnet`): mode ``testnet-homogeneous``,
  ``testnet-heterogeneous`` or ``testnet-federated``; per round the honest nodes' mean reward and, where the
  daemons evaluated it (``-s eval.every=K``), their mean held-out accuracy; the defense's totals from the
  honest nodes' ``status.json``;
- rows shaped like ``metrics.jsonl``'s (:func:`rows_of_testnet`), for the run page and the reward curve.

What a testnet does not measure, and its summary therefore leaves out: an attack success rate or completion
length (the daemons run no ASR evaluation), an accuracy before training (a daemon evaluates after its rounds:
without ``eval.every`` there is no accuracy at all, and ``initial_accuracy``/``final_accuracy`` are NaN, shown
as ``-``), and the defense per round. The daemons do not know which completions were poisoned: the stop rate
counts every completion a malicious node sent (by sender role), the false-positive rate every honest one.
"""

from __future__ import annotations

import json
import math
import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dgrpo.errors import ConfigError
from dgrpo.simulations.summary import SUMMARY_FILE, SUMMARY_FORMAT, DefenseSummary, RunSummary

ROUNDS_FILE = "rounds.jsonl"
_NODE = re.compile(r"^node-(\d{1,9})$")


def is_testnet(folder: Path) -> bool:
    """A testnet's output folder: ``node-<i>/rounds.jsonl`` below it and no ``summary.json`` of its own."""
    return folder.is_dir() and not (folder / SUMMARY_FILE).is_file() and any(folder.glob(f"node-*/{ROUNDS_FILE}"))


@dataclass(frozen=True)
class TestnetNode:
    index: int
    peer_id: str
    settings: Mapping[str, Any]
    status: Mapping[str, Any]
    rows: Sequence[Mapping[str, Any]]  # one per round, in round order (a redone round: its last row)

    @property
    def name(self) -> str:
        return f"node-{self.index}"

    @property
    def attack(self) -> str | None:
        adversary = _mapping(self.settings.get("adversary"))
        name = adversary.get("name")
        return str(name) if name else None


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) else None


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _counts(value: Any) -> Counter[str]:
    found = _mapping(value).items()
    return Counter({str(k): v for k, v in found if isinstance(v, int) and not isinstance(v, bool)})


def _json_file(path: Path) -> Mapping[str, Any]:
    """``path``'s JSON object; {} where the file is absent (a node that never started or is still running)."""
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text(errors="replace"))
    except ValueError as exc:
        raise ConfigError(f"{path}: not valid JSON ({exc})") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a JSON object")
    return data


def _rounds(path: Path) -> list[Mapping[str, Any]]:
    """The rows of ``rounds.jsonl`` by round (a line being written, or torn by a kill, is skipped)."""
    by_round: dict[int, Mapping[str, Any]] = {}
    for line in path.read_text(errors="replace").splitlines() if path.is_file() else []:
        try:
            row = json.loads(line)
        except ValueError:
            continue
        r = row.get("round") if isinstance(row, dict) else None
        if isinstance(r, int) and not isinstance(r, bool):
            by_round[r] = row
    return [by_round[r] for r in sorted(by_round)]


def read_nodes(folder: Path) -> list[TestnetNode]:
    """Every ``node-<i>`` of the testnet in ``folder``, by index."""
    nodes = []
    for sub in folder.iterdir() if folder.is_dir() else []:
        m = _NODE.match(sub.name)
        if m is None or not sub.is_dir():
            continue
        status = _json_file(sub / "status.json")
        peer = status.get("peer_id") or _json_file(sub / "node.json").get("peer_id") or sub.name
        settings = _json_file(sub / "settings.json")
        nodes.append(TestnetNode(int(m.group(1)), str(peer), settings, status, _rounds(sub / ROUNDS_FILE)))
    if not nodes:
        raise ConfigError(f"{folder}: no node-<i>/ folders (is it a `dgrpo testnet up --out` folder?)")
    return sorted(nodes, key=lambda n: n.index)


def _reward(row: Mapping[str, Any]) -> float | None:
    return _number(row.get("mean_reward", row.get("local_mean")))  # federated daemons log local_mean


def _mean(values: Iterable[float | None]) -> float | None:
    found = [v for v in values if v is not None]
    return sum(found) / len(found) if found else None


def _honest(nodes: Sequence[TestnetNode]) -> list[TestnetNode]:
    return [n for n in nodes if n.attack is None]


def rows_of_testnet(folder: Path, nodes: Sequence[TestnetNode] | None = None) -> list[dict[str, Any]]:
    """One row per round over the honest nodes, in ``metrics.jsonl``'s keys where they mean the same: their mean
    reward, held-out accuracy (rounds evaluated), loss, the completions they trained on, the attackers' share of
    those, the slowest node's seconds, rejections by reason, and per author what they trained on."""
    nodes = read_nodes(folder) if nodes is None else nodes
    honest = _honest(nodes)
    names = {n.peer_id: n.name for n in nodes}
    attackers = {n.peer_id for n in nodes if n.attack is not None}
    by_round: dict[int, list[Mapping[str, Any]]] = {}
    for node in honest:
        for row in node.rows:
            by_round.setdefault(int(row["round"]), []).append(row)
    out = []
    for r, rows in sorted(by_round.items()):
        trained: Counter[str] = Counter()
        rejected: Counter[str] = Counter()
        defense_rejected: Counter[str] = Counter()
        for row in rows:
            trained.update({names.get(a, a): n for a, n in _counts(row.get("completions_by_author")).items()})
            rejected.update(_counts(row.get("rejected")))
            defense_rejected.update(_counts(row.get("defense_rejected")))
        total = sum(trained.values())
        from_attackers = sum(n for a, n in trained.items() if a in {names.get(p, p) for p in attackers})
        row_out: dict[str, Any] = {
            "round": r,
            "nodes_reporting": len(rows),
            "honest_mean_reward": _mean(_reward(row) for row in rows),
            "loss": _mean(_number(row.get("loss")) for row in rows),
            "completions_accepted": sum(int(_number(row.get("completions")) or 0) for row in rows),
            "attacker_share": from_attackers / total if attackers and total else None,
            "seconds": max((_number(row.get("seconds")) or 0.0 for row in rows), default=0.0),
            "rejected": dict(rejected),
            "defense_rejected": dict(defense_rejected),
            "by_author": {author: {"trained": n} for author, n in sorted(trained.items())},
        }
        accuracy = _mean(_number(row.get("accuracy")) for row in rows)
        if accuracy is not None:
            row_out["accuracy"] = accuracy
        out.append(row_out)
    return out


def _defense(nodes: Sequence[TestnetNode]) -> DefenseSummary | None:
    """The honest nodes' chain verdicts, summed over them, by the sender's role (see the module docstring)."""
    honest = _honest(nodes)
    attackers = {n.peer_id for n in nodes if n.attack is not None}
    names = {n.peer_id: n.name for n in nodes}
    chain = [str(c) for c in _mapping(honest[0].settings.get("defense")).get("chain") or []] if honest else []
    if not chain and not attackers:
        return None
    counts: Counter[str] = Counter()
    reasons: Counter[str] = Counter()
    blacklisted: dict[str, dict[str, int]] = {}
    for node in honest:
        defense = _mapping(node.status.get("defense"))
        # Without a chain nothing is checked: every completion trained on was received, and none rejected.
        trained = node.status.get("completions_trained_by_author")
        checked = _counts(defense.get("checked_by_author") if defense else trained)
        rejected = _counts(defense.get("rejected_by_author"))
        for author, n in checked.items():
            kind = "poison" if author in attackers else "honest"
            counts[f"{kind}_received"] += n
            counts[f"{kind}_rejected"] += rejected.get(author, 0)
        reasons.update(_counts(defense.get("rejected_by_reason")))
        banned = {names.get(p, p): r for p, r in _counts(defense.get("blacklisted")).items()}
        if banned:
            blacklisted[node.name] = banned
    for kind in ("poison", "honest"):
        counts.setdefault(f"{kind}_received", 0)
        counts.setdefault(f"{kind}_rejected", 0)

    def rate(kind: str) -> float | None:
        received = counts[f"{kind}_received"]
        return counts[f"{kind}_rejected"] / received if received else None

    return DefenseSummary(
        names=chain,
        stop_rate=rate("poison") if attackers else None,
        false_positive_rate=rate("honest"),
        counts=dict(sorted(counts.items())),
        rejected_by_reason=dict(sorted(reasons.items())),
        blacklisted=blacklisted,
    )


def _wire(nodes: Sequence[TestnetNode]) -> dict[str, Any]:
    rejected: Counter[str] = Counter()
    dropped: Counter[str] = Counter()
    admission: Counter[str] = Counter()
    accepted = 0
    for node in nodes:
        accepted += int(_number(node.status.get("messages_accepted")) or 0)
        rejected.update(_counts(node.status.get("messages_rejected")))
        dropped.update(_counts(node.status.get("messages_dropped")))
        admission.update(_counts(node.status.get("round_rejections")))
    return {
        "messages_accepted": accepted,
        "messages_rejected": dict(rejected),
        "dropped": dict(dropped),
        "admission_rejected": dict(admission),
    }


def _attacker_share(nodes: Sequence[TestnetNode]) -> float | None:
    attackers = {n.peer_id for n in nodes if n.attack is not None}
    trained: Counter[str] = Counter()
    for node in _honest(nodes):
        trained.update(_counts(node.status.get("completions_trained_by_author")))
    total = sum(trained.values())
    return sum(n for a, n in trained.items() if a in attackers) / total if attackers and total else None


def _wall_seconds(nodes: Sequence[TestnetNode]) -> float:
    starts = [(_number(r.get("time")) or 0.0) - (_number(r.get("seconds")) or 0.0) for n in nodes for r in n.rows]
    ends = [_number(r.get("time")) or 0.0 for n in nodes for r in n.rows]
    return max(ends) - min(starts) if ends else 0.0


def summarise_testnet(folder: Path) -> RunSummary:
    """The testnet in ``folder`` as a run summary (see the module docstring for what it holds)."""
    return read_testnet(folder)[0]


def read_testnet(folder: Path) -> tuple[RunSummary, list[dict[str, Any]]]:
    """The testnet in ``folder``: its summary and its rows (:func:`rows_of_testnet`), its files read once."""
    nodes = read_nodes(folder)
    honest = _honest(nodes)
    if not honest:
        raise ConfigError(f"{folder}: every node of this testnet is an attacker; nothing to report")
    first = honest[0].settings
    rows = rows_of_testnet(folder, nodes)
    accuracy = [(float(r["round"]), float(r["accuracy"])) for r in rows if "accuracy" in r]
    models = list(dict.fromkeys(str(_mapping(n.settings.get("model")).get("name", "?")) for n in nodes))
    kind = str(first.get("mode") or "completions")
    mix = "heterogeneous" if len(models) > 1 else "homogeneous"
    mode = "testnet-federated" if kind == "federated" else f"testnet-{mix}"
    attackers = [n for n in nodes if n.attack is not None]
    asked = _number(_mapping(first.get("rounds")).get("max_rounds"))
    done = int(rows[-1]["round"]) if rows else 0
    rounds = int(asked) if asked is not None else done
    stats: Counter[str] = Counter()
    for node in attackers:
        stats.update(_counts(node.status.get("adversary")))
    nan = float("nan")
    summary = RunSummary(
        format=SUMMARY_FORMAT,
        scenario=str(first.get("run_id") or folder.name),
        task=str(_mapping(first.get("task")).get("name", "?")),
        model=models[0] if len(models) == 1 else models,
        mode=mode,
        nodes=len(nodes),
        split=_mapping(first.get("rollout")).get("split"),
        rounds=rounds,
        rounds_done=done,
        complete=all(n.rows and int(n.rows[-1]["round"]) >= rounds for n in honest),
        initial_accuracy=accuracy[0][1] if accuracy else nan,
        final_accuracy=accuracy[-1][1] if accuracy else nan,
        honest_final_accuracy=accuracy[-1][1] if accuracy else nan,
        accuracy=accuracy,
        final_honest_reward=rows[-1]["honest_mean_reward"] if rows else None,
        attack=attackers[0].attack if attackers else None,
        malicious=len(attackers),
        attacker_share=_attacker_share(nodes),
        fair_share=len(attackers) / len(nodes),
        attack_stats=dict(stats),
        defense=_defense(nodes),
        wire=_wire(nodes),
        wall_seconds=_wall_seconds(nodes),
        engine="testnet",
        scenario_config={**first, "testnet_nodes": [n.name for n in nodes]},
    )
    return summary, rows
