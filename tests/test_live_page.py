"""The status server's live page (``/``): served whole and self-contained, read-only, and fed by a bounded
``/status`` (the per-peer rows and the reward history)."""

from __future__ import annotations

import json
import re
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry
from typer.testing import CliRunner

from dgrpo.cli import app
from dgrpo.daemon.history import HISTORY_ROUNDS, Point, RoundHistory
from dgrpo.daemon.live_page import page_bytes
from dgrpo.daemon.peer_view import PEER_ROWS, peer_rows, reachability
from dgrpo.daemon.settings import StatusSettings
from dgrpo.daemon.status import StatusServer
from dgrpo.net.p2p import PeerInfo

SVG_NAMESPACE = "http://www.w3.org/2000/svg"  # a name in createElementNS, never fetched


@pytest.fixture
def server() -> Iterator[StatusServer]:
    s = StatusServer("127.0.0.1", 0, lambda: {"peer_id": "12D3KooWme"}, CollectorRegistry()).start()
    yield s
    s.stop()


def _get(url: str) -> tuple[int, dict[str, str], bytes]:
    with urllib.request.urlopen(url, timeout=5) as resp:
        return resp.status, dict(resp.headers), resp.read()


def test_the_page_is_served_at_the_root_with_its_element_ids(server: StatusServer) -> None:
    for path in ("/", "/index.html", "/?refresh=1"):
        code, headers, body = _get(server.url + path)
        assert code == 200
        assert headers["Content-Type"] == "text/html; charset=utf-8"
        assert body == page_bytes()
    html = page_bytes().decode()
    for element in (
        '<table id="peers">',
        '<tbody id="peers-body">',
        '<svg id="reward-curve"',
        '<svg id="accuracy-curve"',
    ):
        assert element in html
    for element_id in ("node-peer-id", "node-state", "node-round", "node-mode", "errors", "connection"):
        assert f'id="{element_id}"' in html
    assert 'fetch("status"' in html  # relative: the node's own /status, wherever the page is served from
    assert server.page_url == server.url + "/"
    # /status and the others are still what they were; unknown paths still 404
    assert json.loads(_get(server.url + "/status")[2]) == {"peer_id": "12D3KooWme"}
    assert _get(server.url + "/healthz")[2] == b"ok\n"
    for path in ("/nope", "/index.htm", "/status/x", "/assets/live/index.html"):
        with pytest.raises(urllib.error.HTTPError) as err:
            _get(server.url + path)
        assert err.value.code == 404


def test_the_page_fetches_nothing_from_elsewhere_and_controls_nothing() -> None:
    html = page_bytes().decode()
    assert set(re.findall(r"https?://[^\s\"'<>)]+", html)) == {SVG_NAMESPACE}
    # no resource at all but the empty data: favicon: no src=, no stylesheet or script link, no @import
    assert re.findall(r"\b(?:src|href)\s*=\s*\"([^\"]*)\"", html) == ["data:,"]
    assert "@import" not in html and "url(" not in html
    # read-only: no form, no button, no method but GET
    for control in ("<form", "<button", "<input", "method", "POST", "XMLHttpRequest"):
        assert control not in html
    assert re.findall(r"fetch\(([^,)]*)", html) == ['"status"']
    # peer-provided strings never go in as markup
    for sink in ("innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval(", "new Function"):
        assert sink not in html


def test_the_page_goes_out_with_a_policy_that_runs_only_its_own_script(server: StatusServer) -> None:
    _, headers, _ = _get(server.url + "/")
    policy = headers["Content-Security-Policy"]
    assert "default-src 'none'" in policy and "connect-src 'self'" in policy
    assert "unsafe-inline" not in policy and "unsafe-eval" not in policy
    assert re.search(r"script-src 'sha256-[A-Za-z0-9+/=]{44}'(;|$)", policy)
    assert re.search(r"style-src 'sha256-[A-Za-z0-9+/=]{44}'(;|$)", policy)
    assert headers["X-Content-Type-Options"] == "nosniff"


def test_favicon_is_no_content_not_a_404(server: StatusServer) -> None:
    code, _, body = _get(server.url + "/favicon.ico")
    assert (code, body) == (204, b"")
    assert '<link rel="icon" href="data:,">' in page_bytes().decode()  # a browser does not even ask


def test_the_status_server_binds_loopback_by_default() -> None:
    assert StatusSettings().host == "127.0.0.1"


# ----------------------------------------------------------------- the reward history


def test_history_keeps_the_newest_rounds_only() -> None:
    history = RoundHistory(bound=5)
    for r in range(1, 13):
        history.add(Point(r, r / 100))
    assert [p.round for p in history.points()] == [8, 9, 10, 11, 12]
    snap = history.snapshot()
    assert snap["bound"] == 5 and len(snap["points"]) == 5
    assert snap["points"][-1] == {"round": 12, "mean_reward": 0.12, "accuracy": None, "time": None}


def test_history_default_bound_holds_against_a_long_run() -> None:
    history = RoundHistory()
    for r in range(1, 3 * HISTORY_ROUNDS + 1):
        history.add_row({"round": r, "mean_reward": 0.5})
    points = history.points()
    assert len(points) == HISTORY_ROUNDS == 500
    assert (points[0].round, points[-1].round) == (2 * HISTORY_ROUNDS + 1, 3 * HISTORY_ROUNDS)


def test_history_never_runs_back_a_redone_round_replaces_the_later_ones() -> None:
    history = RoundHistory()
    for r in range(1, 8):
        history.add(Point(r, 0.1 * r))
    history.add(Point(5, 0.9))  # resumed from round 4's checkpoint: rounds 5 to 7 are redone
    assert [(p.round, p.mean_reward) for p in history.points()][-2:] == [(4, 0.4), (5, 0.9)]


def test_history_rows_of_both_modes_and_junk() -> None:
    history = RoundHistory()
    history.add_row({"round": 1, "mean_reward": 0.25, "time": 1700000000.5})
    history.add_row({"round": 2, "local_mean": 0.5, "mode": "federated"})  # federated mode's row
    history.add_row({"round": 3, "mean_reward": 0.75, "accuracy": 0.5})
    history.add_row({"round": "4", "mean_reward": 1.0})  # no round: skipped
    history.add_row({"round": 4, "mean_reward": float("nan"), "accuracy": True})  # kept, without the junk values
    assert history.points() == [
        Point(1, 0.25, None, 1700000000.5),
        Point(2, 0.5),
        Point(3, 0.75, 0.5),
        Point(4, None, None),
    ]
    json.dumps(history.snapshot(), allow_nan=False)  # valid JSON for the page


def test_history_reloads_the_newest_rows_of_rounds_jsonl(tmp_path: Path) -> None:
    path = tmp_path / "rounds.jsonl"
    lines = [json.dumps({"event": "round", "round": r, "mean_reward": r / 1000}) for r in range(1, 701)]
    path.write_text("\n".join(lines) + '\n{"event": "round", "rou')  # a line cut by a kill
    history = RoundHistory()
    assert history.load(path) == HISTORY_ROUNDS - 1  # the newest 500 lines, the torn one among them
    points = history.points()
    assert (points[0].round, points[-1].round, points[-1].mean_reward) == (202, 700, 0.7)
    assert RoundHistory().load(tmp_path / "missing.jsonl") == 0


def test_history_needs_a_bound() -> None:
    with pytest.raises(ValueError, match="at least one round"):
        RoundHistory(bound=0)


# ----------------------------------------------------------------- the per-peer rows


def _info(peer: str, round_: int, addrs: tuple[str, ...] = ("/ip4/127.0.0.1/tcp/4001",)) -> PeerInfo:
    return PeerInfo(peer, round_, round_ - 1, "running", 100.0, addrs)


def test_peer_rows_gather_every_stage_per_peer() -> None:
    out = peer_rows(
        "me",
        heard=[_info("a", 7), _info("b", 6, ("/ip4/1.2.3.4/tcp/1/p2p/r/p2p-circuit",)), _info("me", 7)],
        active={"a", "b"},
        connections={"a": "direct", "b": "relayed"},
        blacklisted={"x"},
        trained_by_author={"me": 96, "a": 32, "b": 16},
        wire_rejected={"x": {"malformed": 2}, "b": {"oversize_rpc": 1}},
        round_rejected={"b": {"closed_round": 3}},
        defense_rejected={"b": 4},
        now=102.34,
    )
    assert out["total"] == 3 and out["shown"] == 3
    assert out["peers"] == [
        {
            "peer_id": "a", "round": 7, "rounds_done": 6, "status": "running", "last_seen_seconds": 2.3,
            "active": True, "link": "direct", "reachability": "direct", "accepted": 32, "rejected": 0,
            "rejected_by_reason": {}, "blacklisted": False,
        },
        {
            "peer_id": "b", "round": 6, "rounds_done": 5, "status": "running", "last_seen_seconds": 2.3,
            "active": True, "link": "relayed", "reachability": "relay only", "accepted": 16, "rejected": 8,
            "rejected_by_reason": {"wire:oversize_rpc": 1, "round:closed_round": 3, "defense": 4},
            "blacklisted": False,
        },
        {
            "peer_id": "x", "round": None, "rounds_done": None, "status": None, "last_seen_seconds": None,
            "active": False, "link": None, "reachability": None, "accepted": 0, "rejected": 2,
            "rejected_by_reason": {"wire:malformed": 2}, "blacklisted": True,
        },
    ]  # fmt: skip


def test_peer_rows_are_bounded_and_a_sybil_crowd_does_not_push_off_the_working_peers() -> None:
    sybils = {f"sybil-{i:04d}": {"malformed": 1 + i % 3} for i in range(3 * PEER_ROWS)}
    out = peer_rows(
        "me", [_info("a", 3), _info("b", 3)], {"a", "b"}, {"a": "direct", "b": "direct"}, set(), {}, sybils, {}, {}
    )
    assert out["total"] == 3 * PEER_ROWS + 2 and out["shown"] == len(out["peers"]) == PEER_ROWS == 200
    assert [r["peer_id"] for r in out["peers"][:2]] == ["a", "b"]
    assert all(r["rejected"] == 3 for r in out["peers"][2:])  # then the busiest of the others


def test_reachability_from_announced_addresses() -> None:
    assert reachability([]) is None
    assert reachability(["/ip4/10.0.0.2/tcp/4001"]) == "direct"
    assert reachability(["/ip4/5.6.7.8/tcp/4001/p2p/R/p2p-circuit", "/ip4/10.0.0.2/tcp/4001"]) == "direct"
    assert reachability(["/ip4/5.6.7.8/tcp/4001/p2p/R/p2p-circuit"]) == "relay only"


# ----------------------------------------------------------------- where an operator finds the page


@pytest.mark.slow  # real processes
@pytest.mark.timeout(180)
def test_testnet_up_prints_each_page_and_each_daemon_logs_its_own(tmp_path: Path) -> None:
    out = tmp_path / "net"
    fast = ["rounds.deadline_seconds=20", "rounds.peer_timeout_seconds=6"]
    args = ["testnet", "up", "-n", "2", "--rounds", "1", "--out", str(out), *(x for f in fast for x in ("-s", f))]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    pages = re.findall(r"node-(\d) live page: (http://127\.0\.0\.1:\d+/)", result.output)
    assert [i for i, _ in pages] == ["0", "1"] and "open a live page in a browser" in result.output
    for i, url in pages:
        log = (out / f"node-{i}" / "node.log").read_text()
        assert f"live page {url} (open it in a browser" in log
        status = json.loads((out / f"node-{i}" / "status.json").read_text())
        assert status["status_url"] + "/" == url
        assert [p["round"] for p in status["history"]["points"]] == [1]
        other = json.loads((out / f"node-{1 - int(i)}" / "status.json").read_text())["peer_id"]
        [row] = status["peer_table"]["peers"]
        assert row["peer_id"] == other and row["round"] is not None and row["accepted"] > 0
