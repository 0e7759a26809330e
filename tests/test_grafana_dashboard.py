"""deploy/grafana/dgrpo-dashboard.json may only query metrics a node's /metrics really exposes."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from dgrpo.daemon.status import NodeMetrics, WireCollector
from dgrpo.net.transport import TransportStatistics
from dgrpo.round.admit import AdmissionStatistics

DASHBOARD = Path(__file__).resolve().parents[1] / "deploy" / "grafana" / "dgrpo-dashboard.json"
# PromQL words that look like metric names: functions, aggregations, modifiers, Grafana's variables.
PROMQL_WORDS = {
    "rate",
    "increase",
    "sum",
    "topk",
    "by",
    "without",
    "avg",
    "max",
    "min",
    "count",
    "irate",
    "delta",
    "on",
}


def exposed_samples() -> set[str]:
    """Every sample name a daemon's registry exposes, with labelled families filled in."""
    metrics = NodeMetrics()
    metrics.registry.register(
        WireCollector(
            lambda: TransportStatistics(
                accepted=3,
                rejected_by_reason={"schema": 1},
                rejected_by_peer={"p": 1},
                rejected_by_peer_reason={"p": {"schema": 1}},
                dropped={"inbound_full": 1},
            ),
            lambda: AdmissionStatistics({"closed_round": 2}, {"p": 2}, {"p": {"closed_round": 2}}),
        )
    )
    metrics.reward_events.labels(event="sandbox_ok").inc()
    metrics.defense_checked.labels(peer="p").inc()
    metrics.defense_rejected.labels(reason="length:over_cap").inc()
    metrics.flagged.labels(detector="text").inc()
    text = generate_latest(metrics.registry).decode()
    return {s.name for family in text_string_to_metric_families(text) for s in family.samples}


def panel_exprs(dashboard: dict[str, Any]) -> list[str]:
    panels = list(dashboard["panels"])
    for panel in list(panels):
        panels.extend(panel.get("panels", []))  # rows
    return [t["expr"] for p in panels for t in p.get("targets", []) if "expr" in t]


def metric_names(expr: str) -> set[str]:
    stripped = re.sub(r"\{[^}]*\}|\[[^]]*\]|\"[^\"]*\"", "", expr)  # label matchers, ranges, strings
    stripped = re.sub(r"\b(by|without|on)\s*\([^)]*\)", "", stripped)  # grouping labels
    return {w for w in re.findall(r"[A-Za-z_:][A-Za-z0-9_:]*", stripped) if w not in PROMQL_WORDS}


def test_dashboard_queries_only_exposed_metrics() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    exposed = exposed_samples()
    used: set[str] = set()
    for expr in panel_exprs(dashboard):
        names = metric_names(expr)
        assert names, f"no metric in {expr!r}"
        assert names <= exposed, f"{expr!r} uses {sorted(names - exposed)}, not exposed by a node"
        used |= names
    # the panels the dashboard promises
    for name in (
        "dgrpo_round", "dgrpo_round_seconds", "dgrpo_mean_reward", "dgrpo_completions_trained_total",
        "dgrpo_peers", "dgrpo_active_peers", "dgrpo_blacklisted_peers", "dgrpo_messages_accepted_total",
        "dgrpo_messages_rejected_total", "dgrpo_messages_dropped_total", "dgrpo_admission_rejected_total",
        "dgrpo_defense_checked_total", "dgrpo_defense_rejected_total", "dgrpo_flagged_completions_trained_total",
        "dgrpo_reward_events_total",
    ):  # fmt: skip
        assert name in used, name


def test_dashboard_imports_anywhere() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    assert 36 <= dashboard["schemaVersion"] <= 41
    assert [i["name"] for i in dashboard["__inputs"]] == ["DS_PROMETHEUS"]
    assert [v["name"] for v in dashboard["templating"]["list"]] == ["instance"]
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    for panel in dashboard["panels"]:
        assert panel["datasource"]["uid"] == "${DS_PROMETHEUS}"
        for target in panel["targets"]:
            assert 'instance=~"$instance"' in target["expr"], target["expr"]


def test_metric_names_parser() -> None:
    expr = 'sum by (reason) (rate(dgrpo_x_total{instance=~"$instance", reason="a b"}[$__rate_interval]))'
    assert metric_names(expr) == {"dgrpo_x_total"}
    assert "dgrpo_round" not in metric_names("dgrpo_rounds")
