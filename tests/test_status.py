"""The status endpoint serves the node's snapshot and Prometheus metrics over real HTTP."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import pytest

from dgrpo.node.status import NodeMetrics, StatusServer


def test_status_metrics_and_404() -> None:
    metrics = NodeMetrics()
    metrics.round.set(7)
    metrics.rejected.labels(reason="bad_signature").inc(3)
    state = {"peer_id": "12D3KooWtest", "round": 7, "rejected": {"bad_signature": 3}}
    server = StatusServer("127.0.0.1", 0, lambda: state, metrics.registry).start()
    try:
        with urllib.request.urlopen(server.url + "/status", timeout=5) as resp:
            assert json.loads(resp.read()) == state
        with urllib.request.urlopen(server.url + "/metrics", timeout=5) as resp:
            text = resp.read().decode()
        assert "dgrpo_round 7.0" in text
        assert 'dgrpo_messages_rejected_total{reason="bad_signature"} 3.0' in text
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(server.url + "/nope", timeout=5)
        assert err.value.code == 404
    finally:
        server.stop()
