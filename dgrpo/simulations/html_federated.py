"""The sections of a federated run's page: compression of the clients' updates against a dense one, the
aggregation weight each client got per round, the attack on the weighting, and the per-round table.

Read from the ``federated`` object of ``summary.json``
(:func:`dgrpo.simulations.federated.federated_summary`) and the per-round rows of ``metrics.jsonl``, which
alone hold the weights.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from dgrpo.simulations.html_parts import Section, absent, figure, fmt, paragraph, section, table
from dgrpo.simulations.html_plots import Series, line_plot
from dgrpo.simulations.html_run import RunData, column, counts, mapping, number

PLOT_CLIENTS = 10  # more clients than this: the plots show the mean, least and most instead of one line each


def _by_client(rows: Sequence[Mapping[str, Any]], key: str) -> dict[str, list[tuple[float, float]]]:
    """``{client: [(round, value), ...]}`` from rows holding ``{client: value}`` under ``key``."""
    out: dict[str, list[tuple[float, float]]] = {}
    for row in rows:
        r = number(row.get("round"))
        if r is None:
            continue
        for client, value in counts(row.get(key)).items():
            out.setdefault(client, []).append((r, value))
    return out


def _attackers(run: RunData, clients: Sequence[str]) -> set[str]:
    """The last ``federated.attack.clients`` of ``client-0..client-{K-1}``, as the simulation picks them."""
    fed_config = mapping(run.config.get("federated"))
    k = number(mapping(fed_config.get("attack")).get("clients")) or 0
    n = number(fed_config.get("clients")) or len(clients)
    # Tested against the names present (never a range over the configured count, which the file could inflate).
    index = {c: re.fullmatch(r"client-([0-9]{1,9})", c) for c in clients}
    return {c for c, m in index.items() if m is not None and n - k <= int(m.group(1)) < n}


def _series(per_client: Mapping[str, list[tuple[float, float]]], attackers: set[str]) -> list[Series]:
    if len(per_client) <= PLOT_CLIENTS:
        return [Series(c, pts, dashed=c in attackers) for c, pts in sorted(per_client.items())]
    by_round: dict[float, list[float]] = {}
    for pts in per_client.values():
        for r, v in pts:
            by_round.setdefault(r, []).append(v)
    rounds = sorted(by_round)
    return [
        Series("mean over clients", [(r, sum(by_round[r]) / len(by_round[r])) for r in rounds]),
        Series("least", [(r, min(by_round[r])) for r in rounds], dashed=True),
        Series("most", [(r, max(by_round[r])) for r in rounds], dashed=True),
    ]


def compression_section(run: RunData) -> Section:
    fed = run.federated
    if fed is None:
        return absent("compression", "Compression", "not a federated run")
    per_round = [r.model_dump() for r in fed.per_round]
    sent = _by_client(per_round, "bytes_per_client")
    entries = _by_client(per_round, "entries_per_client")
    if not sent:
        return absent("compression", "Compression", f"no updates sent in this run (method {fmt(fed.method)})")
    size, dense = number(fed.parameters), number(fed.dense_bytes)
    parts = [
        paragraph(
            f"{fmt(size)} parameters: a dense float32 update is {fmt(dense)} bytes. Per client per round, on "
            f"average: {fmt(number(fed.entries_per_client_per_round))} entries "
            f"({fmt(number(fed.compression_entries))}x fewer), "
            f"{fmt(number(fed.bytes_per_client_per_round))} bytes "
            f"({fmt(number(fed.compression_bytes))}x smaller). Budget {fmt(fed.budget)}, "
            f"values {fmt(fed.value_dtype)}."
        ),
        '<div class="grid">',
        figure(
            "compression-bytes",
            line_plot(
                "bytes",
                _series(sent, set()),
                "bytes sent",
                log_y=True,
                reference=(dense, "dense update") if dense else None,
            ),
            "Bytes each client sent per round (encoded update, as on the wire), against a dense update.",
        ),
    ]
    if entries:
        svg = line_plot(
            "entries",
            _series(entries, set()),
            "entries sent",
            log_y=True,
            reference=(size, "all parameters") if size else None,
        )
        parts.append(figure("compression-entries", svg, "Entries each client sent per round, against all parameters."))
    parts.append("</div>")
    rows = []
    for row in per_round:
        r = number(row.get("round"))
        client_entries = counts(row.get("entries_per_client"))
        for client, b in sorted(counts(row.get("bytes_per_client")).items()):
            e = client_entries.get(client)
            rows.append(
                [r, client, e, b, e / size if e is not None and size else None, dense / b if dense and b else None]
            )
    headers = ["round", "client", "entries", "bytes", "fraction of entries", "x smaller than dense"]
    parts.append(table("compression", headers, rows, "Each client's update per round"))
    return section("compression", "Compression", *parts)


def weights_section(run: RunData) -> Section:
    weights = _by_client(run.rows, "weights")
    if not weights:
        return absent("weights", "Client weights", "no aggregation weights in this run (a baseline: no aggregator)")
    attackers = _attackers(run, sorted(weights))
    svg = line_plot("weights", _series(weights, attackers), "aggregation weight")
    parts = [figure("weights", svg, "Each client's aggregation weight per round (attackers dashed).")]
    rewards = _by_client(run.rows, "client_reward")
    signal = _by_client(run.rows, "client_signal")
    sent = _by_client(run.rows, "bytes_sent")
    clipped: dict[str, int] = {}
    for row in run.rows:
        for client in counts(row.get("clipped")):
            clipped[client] = clipped.get(client, 0) + 1
    rows = []
    for client, pts in sorted(weights.items()):
        rows.append(
            [
                client,
                "attacker" if client in attackers else "honest",
                _mean([v for _, v in pts]),
                pts[-1][1],
                _mean([v for _, v in rewards.get(client, [])]),
                _mean([v for _, v in signal.get(client, [])]),
                _mean([v for _, v in sent.get(client, [])]),
                clipped.get(client, 0),
            ]
        )
    headers = [
        "client",
        "role",
        "mean weight",
        "last weight",
        "mean reward",
        "mean signal (std)",
        "mean bytes/round",
        "rounds clipped",
    ]
    parts.append(table("clients", headers, rows, "Per client, over the run"))
    return section("weights", "Client weights", *parts)


def _mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None


def fed_attack_section(run: RunData) -> Section:
    fed = run.federated
    attack = fed.attack if fed is not None else None
    if fed is None or not attack:
        return absent("attack", "Attack", "no attack in this run")
    series = [
        Series(f"{attack}: {label}", column(run.rows, key))
        for key, label in (("attacker_weight_share", "weight share"), ("attacker_influence", "influence"))
    ]
    series = [s for s in series if s.points]
    parts = [
        paragraph(
            f"Attack {attack}: mean attacker weight share {fmt(number(fed.attacker_weight_share))}, "
            f"influence {fmt(number(fed.attacker_influence))}."
        )
    ]
    if series:
        clients = number(fed.clients)
        k = number(mapping(mapping(run.config.get("federated")).get("attack")).get("clients"))
        fair = (k / clients, "fair share") if k and clients else None
        svg = line_plot("fedattack", series, "share", unit_range=True, reference=fair)
        parts.append(figure("attack-share", svg, "The attackers' share of the aggregation weight per round."))
    return section("attack", "Attack", *parts)


def fed_rounds_section(run: RunData) -> Section:
    if not run.rows:
        return absent("rounds", "Rounds", "no metrics.jsonl in this run")
    headers = [
        "round",
        "mean reward",
        "global reward",
        "accuracy",
        "loss",
        "lr",
        "update norm",
        "mean KiB/client",
        "attacker weight share",
        "seconds",
    ]
    keys = ["round", "mean_reward", "global_mean_reward", "accuracy", "loss", "lr", "update_norm"]
    rows = []
    for row in run.rows:
        sent = list(counts(row.get("bytes_sent")).values())
        kib = sum(sent) / len(sent) / 1024 if sent else None
        rows.append(
            [
                *(number(row.get(k)) for k in keys),
                kib,
                number(row.get("attacker_weight_share")),
                number(row.get("seconds")),
            ]
        )
    return section("rounds", "Rounds", table("rounds", headers, rows, "One row per round"))
