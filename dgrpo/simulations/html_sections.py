"""The sections of a run page that every run has (configuration, results, curves) and those of a
decentralised run (attack, defense, peers, rounds). Each is a function of the run returning HTML; a section
the run has no data for says so in one line.

The defense numbers are the defense meter's (:mod:`dgrpo.simulations.defense_metrics`): completions counted
by their sender's role (honest, or an attacker's poisoned and other completions), not by peer.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from dgrpo.simulations.html_parts import Cell, Section, absent, details, figure, fmt, paragraph, section, table
from dgrpo.simulations.html_plots import Series, line_plot
from dgrpo.simulations.html_run import RunData, column, counts, mapping, number, points

MAX_PEERS = 1000  # rows of the peer table: a hostile node count must not make a page of millions


def _text(value: Any) -> str:
    if isinstance(value, list):
        return ", ".join(str(v) for v in value)
    return fmt(value)


def _seeds(config: Mapping[str, Any]) -> str:
    seeds = [(part, mapping(config.get(part)).get("seed")) for part in ("learner", "sampling", "eval", "adversary")]
    return ", ".join(f"{part} {seed}" for part, seed in seeds if seed is not None) or "-"


def config_section(run: RunData) -> Section:
    s, config = run.summary, run.config
    defense = mapping(s.get("defense")).get("names", mapping(config.get("defense")).get("chain"))
    rows: list[tuple[str, str]] = [
        ("scenario", _text(s.get("scenario"))),
        ("run id", _text(config.get("run_id"))),
        ("mode", _text(s.get("mode"))),
        ("task", _text(s.get("task"))),
        ("model", _text(s.get("model"))),
        ("rounds", _text(s.get("rounds"))),
    ]
    if run.federated is None:
        rows += [
            ("nodes", _text(s.get("nodes"))),
            ("malicious nodes", _text(s.get("malicious"))),
            ("rollout split", _text(s.get("split"))),
            ("attack", _text(s.get("attack") or "none")),
            ("defense chain", _text(defense or "none")),
        ]
    else:
        fed = run.federated
        keys = ("method", "clients", "partition", "weighting", "aggregator", "calibration", "budget", "bound_stats")
        rows += [(f"federated {key}", _text(fed.get(key))) for key in keys]
        rows.append(("federated attack", _text(fed.get("attack") or "none")))
    rows += [("seeds", _seeds(config)), ("run folder", str(run.folder))]
    dump = json.dumps(config, indent=2, sort_keys=True, default=str) if config else "(no scenario_config in summary)"
    return section(
        "config", "Configuration", table("config", ["setting", "value"], rows), details("full scenario config", dump)
    )


def results_section(run: RunData) -> Section:
    s = run.summary
    rows: list[tuple[str, object]] = [
        ("initial accuracy", number(s.get("initial_accuracy"))),
        ("final accuracy", number(s.get("final_accuracy"))),
    ]
    if run.federated is None:
        defense = mapping(s.get("defense"))
        rows += [
            ("final honest reward", number(s.get("final_honest_reward"))),
            (f"final {s.get('asr_metric') or 'ASR'}", number(s.get("final_asr"))),
            ("attackers' share of trained completions", number(s.get("attacker_share"))),
            ("their fair share", number(s.get("fair_share")) if s.get("malicious") else None),
            ("defense stop rate", number(defense.get("stop_rate"))),
            ("defense false-positive rate", number(defense.get("false_positive_rate"))),
            ("defense overhead (x generation time)", number(defense.get("overhead_ratio"))),
        ]
    else:
        fed = run.federated
        rows += [
            ("compression, entries (x fewer than dense)", number(fed.get("compression_entries"))),
            ("compression, bytes (x fewer than dense)", number(fed.get("compression_bytes"))),
            ("attacker weight share", number(fed.get("attacker_weight_share"))),
            ("attacker influence", number(fed.get("attacker_influence"))),
        ]
    rows.append(("wall seconds", number(s.get("wall_seconds"))))
    return section("results", "Results", table("results", ["measure", "value"], rows))


def curves_section(run: RunData) -> Section:
    acc = points(run.summary.get("accuracy"))
    parts = []
    if acc:
        svg = line_plot("accuracy", [Series("held-out accuracy", acc)], "accuracy", unit_range=True)
        parts.append(figure("accuracy", svg, "Held-out accuracy at each evaluation (round 0: before training)."))
    keys = [("mean_reward", "honest clients' mean reward"), ("global_mean_reward", "global (aggregated) reward")]
    if run.federated is None:
        keys = [("honest_mean_reward", "honest nodes' mean reward"), ("honest_own_reward", "reward of own completions")]
    rewards = [Series(label, column(run.rows, key)) for key, label in keys]
    rewards = [r for r in rewards if r.points]
    if rewards:
        svg = line_plot("reward", rewards, "mean reward", unit_range=True)
        parts.append(figure("reward", svg, "Training reward per round (metrics.jsonl)."))
    if not parts:
        return absent("curves", "Curves", "no accuracy or reward points in this run")
    return section("curves", "Curves", '<div class="grid">', *parts, "</div>")


def attack_section(run: RunData) -> Section:
    s = run.summary
    attack = s.get("attack")
    if not attack:
        return absent("attack", "Attack", "no attack in this run")
    metric = s.get("asr_metric") or "asr"
    unit = metric == "asr"
    label = f"{attack}: {'ASR' if unit else 'mean completion length'}"
    parts = [paragraph(f"Attack {attack}: {fmt(s.get('malicious'))} malicious node(s).")]
    asr = points(s.get("asr"))
    if asr:
        ylabel = "attack success rate" if unit else "mean completion length (chars)"
        svg = line_plot("asr", [Series(label, asr)], ylabel, unit_range=unit)
        parts.append(figure("asr", svg, f"{label} of the honest nodes at each evaluation."))
    else:
        parts.append(paragraph("No ASR points recorded."))
    stats = counts(s.get("attack_stats"))
    if stats:
        parts.append(table("attack-stats", ["attacker counter", "count"], sorted(stats.items())))
    return section("attack", "Attack", *parts)


def _kind_row(label: str, received: float, rejected: float, rate: float | None, rate_name: str) -> list[object]:
    shown = f"{rate_name} {fmt(rate)}" if rate is not None else "-"
    return [label, rejected, received - rejected, received, Cell(shown, rate)]


def _confusion(defense: Mapping[str, Any]) -> str:
    c = counts(defense.get("counts"))
    rows = []
    kinds = [
        ("malicious: poisoned", "poison", "stop rate", defense.get("stop_rate")),
        ("malicious: other (fill)", "attacker_other", "stop rate", None),
        ("honest", "honest", "FPR", defense.get("false_positive_rate")),
    ]
    for label, kind, rate_name, given in kinds:
        received, rejected = c.get(f"{kind}_received", 0.0), c.get(f"{kind}_rejected", 0.0)
        if not received and kind == "attacker_other":
            continue
        rate = number(given) if given is not None else (rejected / received if received else None)
        rows.append(_kind_row(label, received, rejected, rate, rate_name))
    headers = ["completions from", "stopped", "passed", "received", "rate"]
    return table("confusion", headers, rows, "Defense verdicts on peers' completions, by the sender's role")


def defense_section(run: RunData) -> Section:
    defense = mapping(run.summary.get("defense"))
    if not defense:
        return absent("defense", "Defense", "no defense in this run (no chain and no attacker to measure)")
    names = defense.get("names")
    chain = ", ".join(str(n) for n in names) if isinstance(names, list) and names else "none (the admit stage only)"
    overhead = number(defense.get("overhead_ratio"))
    parts = [
        paragraph(f"Chain: {chain}. Overhead: {fmt(overhead)} x the generation time of the checked completions."),
        _confusion(defense),
    ]
    series = [
        Series(label, _defense_column(run, key))
        for key, label in (("stop_rate", "stop rate"), ("false_positive_rate", "FPR"))
    ]
    series = [s for s in series if s.points]
    if series:
        svg = line_plot("defense", series, "rate", unit_range=True)
        caption = "Stop rate and false-positive rate per round (a round without that kind of completion: no point)."
        parts.append(figure("defense", svg, caption))
    parts.append(paragraph("Rejections by reason, at every stage: in Peers."))
    banned = [
        [str(checker), str(peer), number(rnd)]
        for checker, peers in mapping(defense.get("blacklisted")).items()
        for peer, rnd in mapping(peers).items()
    ]
    if banned:
        parts.append(table("blacklisted", ["checker", "peer blacklisted", "round"], banned))
    return section("defense", "Defense", *parts)


def _defense_column(run: RunData, key: str) -> list[tuple[float, float]]:
    out = []
    for row in run.rows:
        r, v = number(row.get("round")), number(mapping(row.get("defense")).get(key))
        if r is not None and v is not None:
            out.append((r, v))
    return out


def _peer_names(run: RunData) -> list[tuple[str, str]]:
    s = run.summary
    n = int(min(number(s.get("nodes")) or 0, MAX_PEERS))
    m = int(min(number(s.get("malicious")) or 0, n))
    peers = [(f"node-{i}", "malicious" if i >= n - m else "honest") for i in range(n)]
    known = {p for p, _ in peers}
    for blocked in mapping(mapping(s.get("defense")).get("blacklisted")).values():
        peers += [(str(p), "unknown") for p in mapping(blocked) if str(p) not in known and len(peers) < MAX_PEERS]
        known |= {str(p) for p in mapping(blocked)}
    return peers


def _per_author(run: RunData) -> dict[str, dict[str, float]]:
    """``by_author`` summed over the rounds (runs written before it existed have none)."""
    out: dict[str, dict[str, float]] = {}
    for row in run.rows:
        for author, c in mapping(row.get("by_author")).items():
            if len(out) >= MAX_PEERS and str(author) not in out:
                continue
            into = out.setdefault(str(author), {})
            for key, value in counts(c).items():
                into[key] = into.get(key, 0) + (int(value) if float(value).is_integer() else value)
    return out


def peers_section(run: RunData) -> Section:
    """Each peer's role and who blacklisted it, the verdicts by sender role, and every rejection by reason."""
    defense = mapping(run.summary.get("defense"))
    blocked: dict[str, list[float]] = {}
    for peers in mapping(defense.get("blacklisted")).values():
        for peer, rnd in mapping(peers).items():
            blocked.setdefault(str(peer), []).append(number(rnd) or 0.0)
    names = _peer_names(run)
    per_author = _per_author(run)
    rows = [[p, role, len(blocked.get(p, [])), min(blocked[p]) if p in blocked else None] for p, role in names]
    parts = [table("peers", ["peer", "role", "blacklisted by (nodes)", "first blacklisted (round)"], rows)]
    if per_author:
        roles = dict(names)
        keys = ("trained", "defense_checked", "defense_rejected", "admission_rejected")
        peer_rows = [
            [peer, roles.get(peer, "unknown"), *(c.get(k, 0) for k in keys),
             (c.get("defense_checked", 0) - c.get("defense_rejected", 0)) / c["defense_checked"]
             if c.get("defense_checked") else None]
            for peer, c in sorted(per_author.items())
        ]  # fmt: skip
        headers = ["peer", "role", "trained on", "checked", "rejected (defense)", "rejected (admission, msgs)",
                   "acceptance rate"]  # fmt: skip
        caption = "Per peer, summed over the honest nodes and rounds (metrics.jsonl by_author)"
        parts.append(table("per-peer", headers, peer_rows, caption))
    c = counts(defense.get("counts"))
    honest = ", ".join(p for p, role in names if role == "honest")
    malicious = ", ".join(p for p, role in names if role == "malicious")
    acceptance = []
    for label, who, kind in (
        ("honest", honest, "honest"),
        ("malicious: poisoned", malicious, "poison"),
        ("malicious: other", malicious, "attacker_other"),
    ):
        received, rejected = c.get(f"{kind}_received", 0.0), c.get(f"{kind}_rejected", 0.0)
        if received:
            acceptance.append([label, who, received - rejected, rejected, received, (received - rejected) / received])
    if acceptance:
        headers = ["sender", "peers", "accepted", "rejected", "received", "acceptance rate"]
        caption = "Peers' completions accepted by honest nodes (counted by sender role; one attacker: its own row)"
        parts.append(table("acceptance", headers, acceptance, caption))
    else:
        parts.append(paragraph("Verdicts per sender are measured with a defense chain or an attacker only."))
    wire = mapping(run.summary.get("wire"))
    stages = [
        ("defense", defense.get("rejected_by_reason")),
        ("admission", wire.get("admission_rejected")),
        ("validator", wire.get("messages_rejected")),
        ("dropped", wire.get("dropped")),
    ]
    reasons = [[stage, reason, count] for stage, found in stages for reason, count in sorted(counts(found).items())]
    if reasons:
        parts.append(table("reasons", ["stage", "reason", "count"], reasons, "Rejections by reason"))
    else:
        parts.append(paragraph("Nothing was rejected."))
    accepted = number(wire.get("messages_accepted"))
    if accepted is not None:
        parts.append(paragraph(f"Messages accepted by the nodes' validators: {fmt(accepted)}."))
    return section("peers", "Peers: acceptance", *parts)


def rounds_section(run: RunData) -> Section:
    if not run.rows:
        return absent("rounds", "Rounds", "no metrics.jsonl in this run")
    headers = [
        "round",
        "honest reward",
        "own reward",
        "accuracy",
        run.summary.get("asr_metric") or "asr",
        "loss",
        "exchanged",
        "accepted",
        "poison published",
        "attacker share",
        "stop rate",
        "FPR",
        "seconds",
    ]
    keys = [
        "round",
        "honest_mean_reward",
        "honest_own_reward",
        "accuracy",
        "asr",
        "loss",
        "completions_exchanged",
        "completions_accepted",
        "poison_published",
        "attacker_share",
    ]
    rows = []
    for row in run.rows:
        defense = mapping(row.get("defense"))
        values = [number(row.get(k)) for k in keys]
        if run.summary.get("asr_metric") == "mean_length":
            values[4] = number(row.get("mean_length"))
        values += [
            number(defense.get("stop_rate")),
            number(defense.get("false_positive_rate")),
            number(row.get("seconds")),
        ]
        rows.append(values)
    return section("rounds", "Rounds", table("rounds", [str(h) for h in headers], rows, "One row per round"))
