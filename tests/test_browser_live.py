"""The live page in a real browser, on a real 3-daemon testnet: node 0's page lists the two other peers and
draws its reward and held-out accuracy curves from ``/status`` as rounds close, with no console error (nor a
CSP violation)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from dgrpo.daemon.status import StatusServer
from dgrpo.daemon.testnet import start_testnet, stop_nodes
from tests.browser import browser

pytestmark = pytest.mark.slow  # real processes and a browser

FAST = ["rounds.deadline_seconds=20", "rounds.peer_timeout_seconds=6"]
EVAL = ["eval.every=1", "eval.prompts=8"]  # held-out accuracy every round: the page's second curve

READY = """() => {
  const rows = document.querySelectorAll('#peers-body tr[data-peer]');
  const points = Number(document.getElementById('reward-curve').getAttribute('data-points'));
  const evaluated = Number(document.getElementById('accuracy-curve').getAttribute('data-points'));
  return rows.length >= 2 && points >= 2 && evaluated >= 2;
}"""


@pytest.mark.timeout(240)
def test_node_pages_show_peers_and_the_reward_curve_of_a_live_testnet(tmp_path: Path) -> None:
    nodes = start_testnet(3, tmp_path, rounds=None, extra=[*FAST, *EVAL])
    try:
        url = nodes[0].page_url()
        assert url is not None and url.startswith("http://127.0.0.1:") and url.endswith("/")
        with browser() as b:
            b.page.goto(url)
            b.page.wait_for_function(READY, timeout=90_000, polling=500)
            shown = b.page.eval_on_selector_all("#peers-body tr[data-peer]", "rows => rows.map(r => r.dataset.peer)")
            assert set(shown) == {nodes[1].peer_id, nodes[2].peer_id}
            assert b.page.text_content("#node-peer-id") == nodes[0].peer_id
            assert b.page.text_content("#node-state") == "running"
            links = b.page.eval_on_selector_all(
                "#peers-body tr td:nth-child(5)", "cells => cells.map(c => c.textContent)"
            )
            assert links == ["direct", "direct"]
            assert b.page.locator("#reward-curve polyline").count() == 1
            assert b.page.locator("#accuracy-curve polyline").count() == 1
            b.screenshot("live-testnet")
            # another node's page, for a person to compare
            b.page.goto(nodes[2].page_url() or "")
            b.page.wait_for_function(READY, timeout=30_000, polling=500)
            b.screenshot("live-testnet-node-2")
            assert b.errors == []
    finally:
        stop_nodes(nodes)
    assert all(nd.process.poll() is not None for nd in nodes), "every daemon's process is gone"


HOSTILE = '<img src=x onerror="document.title=1">'


def _hostile_status() -> dict[str, Any]:
    """A /status whose peer-named strings are markup (a hostile peer id cannot be one, but an error line or a
    future field might carry what a peer sent): the page shows them as text."""
    row = {
        "peer_id": HOSTILE, "round": 4, "rounds_done": 3, "status": "running", "last_seen_seconds": 0.4,
        "active": True, "link": "relayed", "reachability": "relay only", "accepted": 5, "rejected": 3,
        "rejected_by_reason": {"wire:malformed": 2, f"round:{HOSTILE}": 1}, "blacklisted": False,
    }  # fmt: skip
    points = [
        {"round": r, "mean_reward": r / 10, "accuracy": r / 20 if r % 2 else None, "time": None} for r in (1, 2, 3)
    ]
    return {
        "peer_id": "12D3KooWme", "run_id": HOSTILE, "mode": "completions", "state": "running", "round": 4,
        "rounds_done": 3, "peers": [HOSTILE], "connected_peers": [HOSTILE], "network": None, "mean_reward": 0.3,
        "messages_accepted": 10, "messages_rejected": {"malformed": 2}, "completions_trained": 40,
        "blacklisted_peers": [], "last_errors": [f"round 3 closed without {HOSTILE}"],
        "peer_table": {"total": 1, "shown": 1, "peers": [row]}, "history": {"bound": 500, "points": points},
    }  # fmt: skip


@pytest.mark.timeout(120)
def test_peer_provided_strings_are_shown_as_text_never_run() -> None:
    server = StatusServer("127.0.0.1", 0, _hostile_status, CollectorRegistry()).start()
    try:
        with browser() as b:
            b.page.goto(server.page_url)
            b.page.wait_for_function(READY.replace(">= 2 &&", ">= 1 &&"), timeout=20_000, polling=200)
            assert b.page.locator("img").count() == 0
            assert b.page.get_attribute("#peers-body tr", "data-peer") == HOSTILE
            assert HOSTILE in (b.page.text_content("#peers-body") or "")
            assert b.page.text_content("#errors") == f"round 3 closed without {HOSTILE}"
            assert b.page.get_attribute("#accuracy-curve", "data-points") == "2"
            assert b.page.title().startswith("dgrpo ")
            b.screenshot("live-hostile-strings")
            assert b.errors == []
    finally:
        server.stop()
