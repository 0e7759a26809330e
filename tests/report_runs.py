"""Run folders for the HTML report tests, written by hand in the format ``dgrpo simulate`` writes (the keys and
shapes of a real 3-round text-horizontal run with a length,repetition chain, and of a 3-round fed-std-attack
run; the numbers are rounder). A test changes what it needs through ``update``."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

CONFIG = {
    "name": "text-horizontal",
    "run_id": "text-horizontal",
    "rounds": 3,
    "learner": {"lr": 0.0005, "seed": 0},
    "sampling": {"seed": 0},
    "eval": {"every": 1, "seed": 1234},
    "adversary": {"name": "text", "seed": 0},
    "defense": {"chain": ["length", "repetition"]},
    "federated": None,
}

ATTACKED: dict[str, Any] = {
    "scenario": "text-horizontal",
    "task": "arith",
    "model": "dgrpo:tiny-arith-text",
    "nodes": 4,
    "mode": "homogeneous",
    "split": "horizontal",
    "rounds": 3,
    "initial_accuracy": 0.5,
    "final_accuracy": 0.25,
    "accuracy": [[0, 0.5], [1, 0.375], [2, 0.25], [3, 0.25]],
    "final_honest_reward": 0.125,
    "attack": "text",
    "malicious": 1,
    "attacker_share": 0.0,
    "fair_share": 0.25,
    "asr_metric": "asr",
    "asr": [[0, 0.0], [1, 0.125], [2, 0.5], [3, 0.75]],
    "final_asr": 0.75,
    "honest_final_accuracy": 0.25,
    "mean_length": [[0, 32.8], [1, 35.8], [2, 36.5], [3, 36.5]],
    "final_mean_length": 36.5,
    "attack_stats": {"poisoned": 24, "filled_honest": 0, "filled_gibberish": 0, "unpoisonable": 0},
    "defense": {
        "names": ["length", "repetition"],
        "stop_rate": 0.75,
        "false_positive_rate": 0.05555555555555555,
        "overhead_ratio": 0.0003,
        "counts": {"honest_received": 144, "honest_rejected": 8, "poison_received": 24, "poison_rejected": 18},
        "rejected_by_reason": {"repetition:repeated_span": 18, "length:group_outlier": 8},
        "blacklisted": {"node-0": {"node-3": 2}, "node-1": {"node-3": 1}},
        "defense_seconds": 0.002,
        "generation_seconds": 6.9,
    },
    "wire": {
        "messages_accepted": 144,
        "messages_rejected": {},
        "dropped": {},
        "admission_rejected": {"closed_round": 24},
    },
    "wall_seconds": 7.9,
    "training_reward_seconds": 0.0007,
    "scenario_config": CONFIG,
}


def attacked_rows() -> list[dict[str, Any]]:
    rewards = [0.25, 0.5, 0.125]  # not monotone: sorting the column changes the order
    stops = [1.0, 0.5, None]
    return [
        {
            "round": r,
            "honest_mean_reward": rewards[r - 1],
            "honest_own_reward": rewards[r - 1],
            "completions_exchanged": 32,
            "completions_accepted": 104 - r,
            "rejected": {},
            "loss": -0.01 * r,
            "seconds": 2.0 + r,
            "reward_seconds": 0.0002,
            "poison_published": 8,
            "attacker_share": 0.0,
            "defense": {
                "honest_received": 48,
                "poison_received": 8,
                "stop_rate": stops[r - 1],
                "false_positive_rate": 0.0625 * (r - 1),
                "overhead_ratio": 0.0002,
            },
            "accuracy": ATTACKED["accuracy"][r][1],
            "mean_length": 35.0,
            "asr": ATTACKED["asr"][r][1],
        }
        for r in (1, 2, 3)
    ]


def honest_summary() -> dict[str, Any]:
    """The same run with no attacker and no chain: the runner writes no defense meter then."""
    s = json.loads(json.dumps(ATTACKED))
    s.update(
        scenario="default",
        attack=None,
        malicious=0,
        attacker_share=None,
        fair_share=0.0,
        asr_metric=None,
        asr=[],
        final_asr=None,
        attack_stats={},
        defense=None,
        wire={"messages_accepted": 144, "messages_rejected": {}, "dropped": {}, "admission_rejected": {}},
    )
    s["scenario_config"] = {**CONFIG, "adversary": None, "defense": {"chain": []}}
    return s


def honest_rows() -> list[dict[str, Any]]:
    rows = attacked_rows()
    for row in rows:
        for key in ("defense", "asr"):
            row.pop(key)
        row["poison_published"] = 0
        row["attacker_share"] = None
    return rows


CLIENTS = [f"client-{i}" for i in range(5)]
BYTES = [[249514] * 5, [186186, 277602, 190770, 255922, 278314], [185642, 262302, 157282, 276814, 228506]]
ENTRIES = [[31188] * 5, [23272, 38210, 23845, 32790, 38388], [23204, 34385, 19659, 38013, 28562]]
WEIGHTS = [[0.14, 0.19, 0.15, 0.23, 0.29], [0.15, 0.23, 0.15, 0.20, 0.27], [0.15, 0.22, 0.13, 0.23, 0.27]]


def federated_rows(clients: list[str] = CLIENTS) -> list[dict[str, Any]]:
    return [
        {
            "round": r + 1,
            "client_reward": dict(zip(clients, [0.4, 0.6, 0.4, 0.6, 0.5], strict=True)),
            "client_signal": dict(zip(clients, [0.2, 0.3, 0.3, 0.4, 0.5], strict=True)),
            "loss": 0.002,
            "lr": 0.02,
            "weights": dict(zip(clients, WEIGHTS[r], strict=True)),
            "clipped": {},
            "bytes_sent": dict(zip(clients, BYTES[r], strict=True)),
            "entries_sent": dict(zip(clients, ENTRIES[r], strict=True)),
            "global_mean_reward": 0.5,
            "global_signal": 0.35,
            "update_norm": 0.008,
            "attacker_weight_share": WEIGHTS[r][4],
            "attacker_influence": WEIGHTS[r][4],
            "mean_reward": 0.5,
            "seconds": 2.0,
            **({"accuracy": 0.5} if r == 2 else {}),
        }
        for r in range(3)
    ]


def federated_summary(clients: list[str] = CLIENTS) -> dict[str, Any]:
    rows = federated_rows(clients)
    return {
        "scenario": "fed-std-attack",
        "task": "arith",
        "model": "dgrpo:tiny-arith",
        "mode": "federated",
        "rounds": 3,
        "initial_accuracy": 0.5625,
        "final_accuracy": 0.5,
        "accuracy": [[0, 0.5625], [3, 0.5]],
        "federated": {
            "method": "federated",
            "clients": 5,
            "partition": "arith-carries",
            "weighting": "signal",
            "aggregator": "mean",
            "calibration": True,
            "budget": 0.03125,
            "value_dtype": "float32",
            "bound_stats": False,
            "attack": "std-inflate",
            "parameters": 998016,
            "accuracy": [[0, 0.5625], [3, 0.5]],
            "final_accuracy": 0.5,
            "bytes_per_client_per_round": 236460.7,
            "entries_per_client_per_round": 30417.9,
            "dense_bytes": 3992064,
            "compression_entries": 32.81,
            "compression_bytes": 16.88,
            "attacker_weight_share": 0.2767,
            "attacker_influence": 0.2767,
            "per_round": [
                {
                    "round": row["round"],
                    "accuracy": row.get("accuracy"),
                    "bytes_per_client": row["bytes_sent"],
                    "entries_per_client": row["entries_sent"],
                    "attacker_weight_share": row["attacker_weight_share"],
                    "attacker_influence": row["attacker_influence"],
                }
                for row in rows
            ],
            "global_weights_digest": "94d2",
        },
        "wall_seconds": 9.1,
        "scenario_config": {
            "name": "fed-std-attack",
            "run_id": "fed",
            "learner": {"seed": 0},
            "sampling": {"seed": 0},
            "eval": {"seed": 1234},
            "adversary": None,
            "federated": {"clients": 5, "method": "federated", "attack": {"name": "std-inflate", "clients": 1}},
        },
    }


def write_run(folder: Path, summary: Mapping[str, Any], rows: list[dict[str, Any]] | None) -> Path:
    """``summary.json`` and (unless ``rows`` is None) ``metrics.jsonl`` in ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "summary.json").write_text(json.dumps(summary, indent=2))
    if rows is not None:
        (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return folder


def attacked_run(folder: Path) -> Path:
    return write_run(folder, ATTACKED, attacked_rows())


def honest_run(folder: Path) -> Path:
    return write_run(folder, honest_summary(), honest_rows())


def federated_run(folder: Path, clients: list[str] = CLIENTS) -> Path:
    return write_run(folder, federated_summary(clients), federated_rows(clients))


def seed_variant(seed: int) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The attacked run with seed ``seed``: accuracy, ASR and rewards shifted, so that seeds spread."""
    s = json.loads(json.dumps(ATTACKED))
    shift = 0.125 * seed
    s["accuracy"] = [[r, min(1.0, a + shift)] for r, a in ATTACKED["accuracy"]]
    s["asr"] = [[r, max(0.0, a - shift)] for r, a in ATTACKED["asr"]]
    s.update(final_accuracy=s["accuracy"][-1][1], honest_final_accuracy=s["accuracy"][-1][1], final_asr=s["asr"][-1][1])
    s["scenario_config"] = {**CONFIG, "run_id": f"text-horizontal-s{seed}", "learner": {"lr": 0.0005, "seed": seed}}
    rows = attacked_rows()
    for row in rows:
        row["honest_mean_reward"] += shift
        row["accuracy"] = s["accuracy"][row["round"]][1]
        row["asr"] = s["asr"][row["round"]][1]
    return s, rows


def write_study(root: Path) -> Path:
    """A sweep's layout (``<scenario>/<defense>/seed<k>/``): text-horizontal x length,repetition x seeds 0, 1."""
    for seed in (0, 1):
        write_run(root / "text-horizontal" / "length,repetition" / f"seed{seed}", *seed_variant(seed))
    return root


DOS_LENGTHS = [[0, 32.0], [1, 48.0], [2, 70.0], [3, 90.0]]


def dos_run(folder: Path) -> Path:
    """A DoS run: its attack is measured by the honest nodes' mean completion length, not a success rate."""
    s = json.loads(json.dumps(ATTACKED))
    s.update(
        scenario="dos-horizontal",
        attack="dos",
        asr_metric="mean_length",
        asr=DOS_LENGTHS,
        final_asr=90.0,
        mean_length=DOS_LENGTHS,
        final_mean_length=90.0,
    )
    s["defense"] = {**s["defense"], "names": ["length"], "stop_rate": 0.5, "false_positive_rate": 0.0,
                    "counts": {"honest_received": 144, "honest_rejected": 0, "poison_received": 24,
                               "poison_rejected": 12}}  # fmt: skip
    s["scenario_config"] = {**CONFIG, "name": "dos-horizontal", "adversary": {"name": "dos", "seed": 0}}
    rows = attacked_rows()
    for row in rows:
        row.pop("asr")
        row["mean_length"] = DOS_LENGTHS[row["round"]][1]
    return write_run(folder, s, rows)


def honest_dos_baseline(folder: Path) -> Path:
    s = honest_summary()
    s.update(mean_length=[[0, 32.0], [1, 33.0], [2, 35.0], [3, 36.0]], final_mean_length=36.0)
    return write_run(folder, s, honest_rows())


# A 3-node testnet's files (`dgrpo testnet up -n 3 --rounds 2 --adversary text:1 --defense repetition
# -s eval.every=1 -s eval.prompts=8`): the rounds' rows and the status figures as the daemons wrote them, peer ids
# shortened and the keys the report does not read left out.
PEERS = ["12D3KooWnode0", "12D3KooWnode1", "12D3KooWnode2"]
TESTNET_ROWS = [
    [(1, 1796665291.42, 1.58, 32, {"repetition:repeated_span": 16}, 0.6562, 0.0, 1.0, {1: 16, 0: 16}),
     (2, 1796665292.542, 0.77, 32, {}, 0.625, 0.002697, 1.0, {1: 16, 0: 16})],
    [(1, 1796665291.41, 1.44, 32, {"repetition:repeated_span": 16}, 0.6562, 0.0, 1.0, {1: 16, 0: 16}),
     (2, 1796665292.715, 0.9, 32, {}, 0.625, 0.002697, 1.0, {1: 16, 0: 16})],
    [(1, 1796665291.995, 2.01, 48, {}, 0.7708, -0.075776, 0.875, {2: 16, 1: 16, 0: 16}),
     (2, 1796665295.26, 3.03, 16, {}, 1.0, 0.0, 0.875, {2: 16})],
]  # fmt: skip


def write_testnet(folder: Path, evaluated: bool = True) -> Path:
    """``folder/node-<i>/`` as the testnet above left them (``evaluated=False``: run without ``eval.every``)."""
    for i, peer in enumerate(PEERS):
        node = folder / f"node-{i}"
        node.mkdir(parents=True, exist_ok=True)
        attacker = i == 2
        settings = {
            "run_id": "testnet",
            "mode": "completions",
            "task": {"name": "arith", "options": {}},
            "model": {"name": "dgrpo:tiny-arith"},
            "rollout": {"split": "horizontal"},
            "rounds": {"max_rounds": 2},
            "defense": {"chain": ["repetition"]},
            "adversary": {"name": "text", "poison_fraction": 1.0} if attacker else None,
            "learner": {"seed": 0},
            "eval": {"every": 1 if evaluated else 0, "prompts": 8},
        }
        checked = {PEERS[2]: 16, PEERS[1 - i]: 32} if not attacker else {PEERS[0]: 16, PEERS[1]: 16}
        rejected = {PEERS[2]: 16} if not attacker else {}
        status = {
            "peer_id": peer,
            "run_id": "testnet",
            "state": "stopped",
            "rounds_done": 2,
            "messages_accepted": [67, 72, 36][i],
            "messages_rejected": {},
            "messages_dropped": {},
            "round_rejections": {},
            "completions_trained_by_author": {PEERS[0]: 32, PEERS[1]: 32} if not attacker else {},
            "adversary": {"name": "text", "poisoned": 32, "filled_honest": 0} if attacker else None,
            "defense": {
                "chain": ["repetition"],
                "checked_by_author": checked,
                "rejected_by_author": rejected,
                "rejected_by_reason": {"repetition:repeated_span": 16} if rejected else {},
                "blacklisted": {PEERS[2]: 1} if rejected else {},
            },
        }
        rows = []
        for r, t, sec, done, def_rej, reward, loss, acc, by_author in TESTNET_ROWS[i]:
            row = {"event": "round", "time": t, "peer": peer, "round": r, "seconds": sec, "completions": done,
                   "rejected": {}, "defense_rejected": def_rej, "mean_reward": reward, "loss": loss,
                   "completions_by_author": {PEERS[a]: n for a, n in by_author.items()}}  # fmt: skip
            if evaluated:
                row["accuracy"] = acc
            rows.append(json.dumps(row))
        (node / "rounds.jsonl").write_text("\n".join(rows) + "\n")
        (node / "settings.json").write_text(json.dumps(settings))
        (node / "status.json").write_text(json.dumps(status))
        (node / "node.json").write_text(json.dumps({"peer_id": peer, "listen_addrs": [], "status_url": None}))
    return folder
