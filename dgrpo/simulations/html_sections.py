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
from dgrpo.simulations.html_run import RunData, column, counts, defense_column, mapping, number, points
from dgrpo.simulations.summary import DefenseSummary

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
    chain = s.defense.names if s.defense is not None else mapping(config.get("defense")).get("chain")
    rows: list[tuple[str, str]] = [
        ("scenario", _text(s.scenario)),
        ("run id", _text(config.get("run_id"))),
        ("mode", _text(s.mode)),
        ("task", _text(s.task)),
        ("model", _text(s.model)),
        ("rounds", _text(s.rounds)),
    ]
    if s.rounds_done is not None and s.rounds_done != s.rounds:
        rows.append(("rounds done", _text(s.rounds_done)))
    fed = run.federated
    if fed is None:
        rows += [
            ("nodes", _text(s.nodes)),
            ("malicious nodes", _text(s.malicious)),
            ("rollout split", _text(s.split)),
            ("attack", _text(s.attack or "none")),
            ("defense chain", _text(chain or "none")),
        ]
    else:
        rows += [
            ("federated method", fed.method),
            ("federated clients", _text(fed.clients)),
            ("federated partition", fed.partition),
            ("federated weighting", fed.weighting),
            ("federated aggregator", fed.aggregator),
            ("federated calibration", _text(fed.calibration)),
            ("federated budget", _text(fed.budget)),
            ("federated bound_stats", _text(fed.bound_stats)),
            ("federated attack", fed.attack or "none"),
        ]
    rows += [("seeds", _seeds(config)), ("run folder", str(run.folder))]
    dump = json.dumps(config, indent=2, sort_keys=True, default=str) if config else "(no scenario_config in summary)"
    return section(
        "config", "Configuration", table("config", ["setting", "value"], rows), details("full scenario config", dump)
    )


def results_section(run: RunData) -> Section:
    s = run.summary
    rows: list[tuple[str, object]] = [
        ("initial accuracy", number(s.initial_accuracy)),
        ("final accuracy", number(s.final_accuracy)),
    ]
    fed = run.federated
    if fed is None:
        defense = s.defense
        rows += [
            ("final honest reward", number(s.final_honest_reward)),
            (f"final {s.asr_metric or 'ASR'}", number(s.final_asr)),
            ("attackers' share of trained completions", number(s.attacker_share)),
            ("their fair share", number(s.fair_share) if s.malicious else None),
            ("defense stop rate", number(s.stop_rate)),
            ("defense false-positive rate", number(s.false_positive_rate)),
            ("defense overhead (x generation time)", number(defense.overhead_ratio) if defense else None),
        ]
    else:
        rows += [
            ("compression, entries (x fewer than dense)", number(fed.compression_entries)),
            ("compression, bytes (x fewer than dense)", number(fed.compression_bytes)),
            ("attacker weight share", number(fed.attacker_weight_share)),
            ("attacker influence", number(fed.attacker_influence)),
        ]
    rows.append(("wall seconds", number(s.wall_seconds)))
    return section("results", "Results", table("results", ["measure", "value"], rows))


def reward_keys(run: RunData) -> list[tuple[str, str]]:
    """The rows' reward columns of this kind of run, with their legend labels."""
    if run.federated is not None:
        return [("mean_reward", "honest clients' mean reward"), ("global_mean_reward", "global (aggregated) reward")]
    return [("honest_mean_reward", "honest nodes' mean reward"), ("honest_own_reward", "reward of own completions")]


def curves_section(run: RunData) -> Section:
    acc = points(run.summary.accuracy)
    parts = []
    if acc:
        svg = line_plot("accuracy", [Series("held-out accuracy", acc)], "accuracy", unit_range=True)
        parts.append(figure("accuracy", svg, "Held-out accuracy at each evaluation (round 0: before training)."))
    rewards = [Series(label, column(run.rows, key)) for key, label in reward_keys(run)]
    rewards = [r for r in rewards if r.points]
    if rewards:
        svg = line_plot("reward", rewards, "mean reward", unit_range=True)
        parts.append(figure("reward", svg, "Training reward per round (metrics.jsonl)."))
    if not parts:
        return absent("curves", "Curves", "no accuracy or reward points in this run")
    return section("curves", "Curves", '<div class="grid">', *parts, "</div>")


def attack_section(run: RunData) -> Section:
    s = run.summary
    attack = s.attack
    if not attack:
        return absent("attack", "Attack", "no attack in this run")
    unit = not s.length_metric
    label = f"{attack}: {'ASR' if unit else 'mean completion length'}"
    parts = [paragraph(f"Attack {attack}: {fmt(s.malicious)} malicious node(s).")]
    asr = points(s.asr)
    if asr:
        ylabel = "attack success rate" if unit else "mean completion length (chars)"
        svg = line_plot("asr", [Series(label, asr)], ylabel, unit_range=unit)
        parts.append(figure("asr", svg, f"{label} of the honest nodes at each evaluation."))
    else:
        parts.append(paragraph("No ASR points recorded."))
    stats = counts(s.attack_stats)
    if stats:
        parts.append(table("attack-stats", ["attacker counter", "count"], sorted(stats.items())))
    return section("attack", "Attack", *parts)


def _kind_row(label: str, received: float, rejected: float, rate: float | None, rate_name: str) -> list[object]:
    shown = f"{rate_name} {fmt(rate)}" if rate is not None else "-"
    return [label, rejected, received - rejected, received, Cell(shown, rate)]


def _confusion(defense: DefenseSummary) -> str:
    c = counts(defense.counts)
    rows = []
    kinds = [
        ("malicious: poisoned", "poison", "stop rate", defense.stop_rate),
        ("malicious: other (fill)", "attacker_other", "stop rate", None),
        ("honest", "honest", "FPR", defense.false_positive_rate),
    ]
    for label, kind, rate_name, given in kinds:
        received, rejected = c.get(f"{kind}_received", 0), c.get(f"{kind}_rejected", 0)
        if not received and kind == "attacker_other":
            continue
        rate = number(given) if given is not None else (rejected / received if received else None)
        rows.append(_kind_row(label, received, rejected, rate, rate_name))
    headers = ["completions from", "stopped", "passed", "received", "rate"]
    return table("confusion", headers, rows, "Defense verdicts on peers' completions, by the sender's role")


def defense_section(run: RunData) -> Section:
    defense = run.summary.defense
    if defense is None:
        return absent("defense", "Defense", "no defense in this run (no chain and no attacker to measure)")
    chain = ", ".join(defense.names) if defense.names else "none (the admit stage only)"
    overhead = number(defense.overhead_ratio)
    parts = [
        paragraph(f"Chain: {chain}. Overhead: {fmt(overhead)} x the generation time of the checked completions."),
        _confusion(defense),
    ]
    series = [
        Series(label, defense_column(run.rows, key))
        for key, label in (("stop_rate", "stop rate"), ("false_positive_rate", "FPR"))
    ]
    series = [s for s in series if s.points]
    if series:
        svg = line_plot("defense", series, "rate", unit_range=True)
        caption = "Stop rate and false-positive rate per round (a round without that kind of completion: no point)."
        parts.append(figure("defense", svg, caption))
    parts.append(paragraph("Rejections by reason, at every stage: in Peers."))
    banned = [[checker, peer, rnd] for checker, peers in defense.blacklisted.items() for peer, rnd in peers.items()]
    if banned:
        parts.append(table("blacklisted", ["checker", "peer blacklisted", "round"], banned))
    return section("defense", "Defense", *parts)


def _blacklisted(run: RunData) -> dict[str, dict[str, int]]:
    return run.summary.defense.blacklisted if run.summary.defense is not None else {}


def _peer_names(run: RunData) -> list[tuple[str, str]]:
    s = run.summary
    n = max(0, min(s.nodes or 0, MAX_PEERS))
    m = max(0, min(s.malicious, n))
    peers = [(f"node-{i}", "malicious" if i >= n - m else "honest") for i in range(n)]
    known = {p for p, _ in peers}
    for blocked in _blacklisted(run).values():
        peers += [(p, "unknown") for p in blocked if p not in known and len(peers) < MAX_PEERS]
        known |= set(blocked)
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
    defense = run.summary.defense
    blocked: dict[str, list[int]] = {}
    for peers in _blacklisted(run).values():
        for peer, rnd in peers.items():
            blocked.setdefault(peer, []).append(rnd)
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
    c = counts(defense.counts if defense is not None else {})
    honest = ", ".join(p for p, role in names if role == "honest")
    malicious = ", ".join(p for p, role in names if role == "malicious")
    acceptance = []
    for label, who, kind in (
        ("honest", honest, "honest"),
        ("malicious: poisoned", malicious, "poison"),
        ("malicious: other", malicious, "attacker_other"),
    ):
        received, rejected = c.get(f"{kind}_received", 0), c.get(f"{kind}_rejected", 0)
        if received:
            acceptance.append([label, who, received - rejected, rejected, received, (received - rejected) / received])
    if acceptance:
        headers = ["sender", "peers", "accepted", "rejected", "received", "acceptance rate"]
        caption = "Peers' completions accepted by honest nodes (counted by sender role; one attacker: its own row)"
        parts.append(table("acceptance", headers, acceptance, caption))
    else:
        parts.append(paragraph("Verdicts per sender are measured with a defense chain or an attacker only."))
    wire = mapping(run.summary.wire)
    stages = [
        ("defense", defense.rejected_by_reason if defense is not None else {}),
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
        run.summary.asr_metric or "asr",
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
        if run.summary.length_metric:
            values[4] = number(row.get("mean_length"))
        values += [
            number(defense.get("stop_rate")),
            number(defense.get("false_positive_rate")),
            number(row.get("seconds")),
        ]
        rows.append(values)
    return section("rounds", "Rounds", table("rounds", [str(h) for h in headers], rows, "One row per round"))
