"""Joining from behind NAT, as real daemons in network namespaces (``scripts/natlab.py``: a public node on a
simulated internet, two home routers doing NAT with nftables, a daemon in each home LAN).

The lab is joined only to itself (never to the host's interfaces) and torn down at the end; every daemon stops
after a bounded number of rounds. Where namespaces cannot be made (not root, no nftables) these tests FAIL with
the reason: they are the only test of NAT traversal, and a skip would pass without testing it.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("natlab", ROOT / "scripts" / "natlab.py")
assert _spec is not None and _spec.loader is not None
natlab = importlib.util.module_from_spec(_spec)
sys.modules["natlab"] = natlab
_spec.loader.exec_module(natlab)

ROUNDS = 1000  # an upper bound (rounds take ~1 s here): the tests stop the daemons once they have seen what they need
COMMON = [
    "--run-id",
    "natrun",
    "--max-rounds",
    str(ROUNDS),
    "--set",
    "rounds.min_peers=2",
    "--set",
    "rounds.heartbeat_seconds=0.5",
    "--set",
    "rounds.peer_timeout_seconds=6",
    "--set",
    "rounds.deadline_seconds=30",
    "--set",
    "status.port=0",
    "--set",
    "checkpoint.every=1",
]
PUBLIC = "/ip4/203.0.113.1/"


@pytest.fixture
def lab(request: Any) -> Iterator[Any]:
    why = natlab.unavailable()
    if why is not None:
        pytest.fail(f"cannot build the NAT lab here: {why}")
    lab = natlab.Lab(prefix=f"d{os.getpid() % 10000}", nat=request.param)
    natlab.up(lab)
    try:
        yield lab
    finally:
        natlab.down(lab)


# What a home node sets for itself: everything about the run comes from the relay's manifest (node join).
LOCAL = [
    "--set",
    "rounds.min_peers=2",
    "--set",
    "rounds.peer_timeout_seconds=6",
    "--set",
    "status.port=0",
    "--set",
    "checkpoint.every=1",
]


def home_listen(lab: Any, i: int) -> str:
    return f"/ip4/{lab.home_ip(i)}/tcp/4001"


def start_relay(lab: Any, tmp: Path, extra: list[str] | None = None) -> tuple[Any, str]:
    """The public relay/bootstrap node, the run's creator, and its public address."""
    args = ["--listen", f"{PUBLIC}tcp/4001", "--relay-service", *COMMON, *(extra or [])]
    relay = natlab.launch("relay", lab.inet, tmp / "R", args)
    natlab.wait_for(lambda: relay.node_file() is not None, 90, "the relay's node.json", [relay])
    return relay, relay.public_addr(PUBLIC)


def join_home(lab: Any, tmp: Path, i: int, name: str, bootstrap: list[str]) -> Any:
    args = [*bootstrap, "--listen", home_listen(lab, i), *LOCAL]
    return natlab.launch(name, lab.home(i), tmp / name, args, command="join")


def start(lab: Any, tmp: Path, relay_extra: list[str] | None = None) -> tuple[Any, Any, Any]:
    relay, boot = start_relay(lab, tmp, relay_extra)
    return relay, join_home(lab, tmp, 1, "A", [boot]), join_home(lab, tmp, 2, "B", [boot])


def keep_logs(nodes: list[Any]) -> None:
    """Copy the daemons' logs where a failed CI run can be read (pytest rotates its tmp folders)."""
    out = Path(os.environ.get("DGRPO_NAT_LOGS", "/tmp/dgrpo-nat-logs"))
    out.mkdir(parents=True, exist_ok=True)
    for n in nodes:
        log = n.state_dir / "node.log"
        if log.exists():
            (out / f"{n.name}.log").write_bytes(log.read_bytes())


def rounds(node: Any) -> list[dict[str, Any]]:
    path = node.state_dir / "rounds.jsonl"
    out = []
    for line in path.read_text().splitlines() if path.exists() else []:
        try:
            import json

            out.append(json.loads(line))
        except ValueError:
            continue
    return [r for r in out if r.get("event", "round") == "round"]


def status(node: Any) -> dict[str, Any]:
    """A node's /status, asked up to three times: one slow answer under CI load is not a dead node (a node that
    has exited or stopped serving fails all three)."""
    for _ in range(3):
        st = node.status()
        if st is not None:
            return dict(st)
        assert node.process.poll() is None, f"{node.name} exited ({node.process.poll()})"
        time.sleep(1.0)
    raise AssertionError(f"{node.name} does not answer /status")


def reachability(node: Any) -> str | None:
    st = node.status()
    return st["network"]["reachability"]["status"] if st else None


def done(node: Any) -> int:
    st = node.status()
    return int(st["rounds_done"]) if st else 0


def peer(node: Any) -> str:
    info = node.node_file()
    assert info is not None
    return str(info["peer_id"])


def full_rounds(node: Any, everyone: set[str]) -> list[int]:
    """The rounds in which ``node`` trained on rollouts of every author in ``everyone``."""
    return [r["round"] for r in rounds(node) if set(r.get("authors") or ()) >= everyone]


@pytest.mark.parametrize("lab", ["cone"], indirect=True)
def test_behind_cone_nats_join_via_relay_punch_holes_and_survive_a_relay_restart(lab: Any, tmp_path: Path) -> None:
    relay, a, b = start(lab, tmp_path)
    nodes = [relay, a, b]
    try:
        natlab.wait_for(lambda: all(done(n) >= 4 for n in nodes), 240, "4 rounds on every node", nodes)
        everyone = {peer(n) for n in nodes}
        # Row 1: knowing only the relay's address, both NATed daemons complete rounds with every author.
        for n in nodes:
            assert len(full_rounds(n, everyone)) >= 2, f"{n.name}: {[r.get('authors') for r in rounds(n)]}"
        # AutoNAT: each asks a directly connected peer to dial it back; a dial-back into a home LAN times out
        # (dial_back_timeout, 5 s), so a verdict takes some seconds after the first connection.
        natlab.wait_for(
            lambda: reachability(relay) == "public" and reachability(a) == reachability(b) == "private",
            60,
            "AutoNAT verdicts: the relay public, the homes private",
            nodes,
        )
        sa, sb = status(a), status(b)
        relay_manifest = status(relay)["manifest"]
        for st in (sa, sb):
            # they learnt the run from the relay, knowing only its address
            assert st["manifest"]["origin"] == "joined" and st["manifest"]["sha256"] == relay_manifest["sha256"]
            assert st["run_id"] == "natrun"
            assert st["network"]["relays"] == [peer(relay)]
            assert any("/p2p-circuit/" in addr for addr in st["listen_addrs"]), st["listen_addrs"]
        # Row 2: behind endpoint-independent NATs, DCUtR turned the relayed connection between the homes into
        # a direct one: not a star around the public node.
        natlab.wait_for(
            lambda: (
                status(a)["network"]["connections"].get(peer(b)) == "direct"
                and status(b)["network"]["connections"].get(peer(a)) == "direct"
            ),
            60,
            "a direct connection between the homes",
            nodes,
        )
        assert peer(b) in status(a)["network"]["hole_punched"] or peer(a) in status(b)["network"]["hole_punched"]
        # Row 4: the relay/bootstrap restarts mid-run; the others go on, and it rejoins.
        before = {n.name: done(n) for n in (a, b)}
        assert relay.stop() == 0
        natlab.wait_for(lambda: all(done(n) >= before[n.name] + 2 for n in (a, b)), 120, "rounds without relay", [a, b])
        relay = natlab.launch("relay", lab.inet, tmp_path / "R", ["--resume"])  # the rest comes from its state
        nodes = [relay, a, b]
        restarted = time.time()
        natlab.wait_for(lambda: relay.status() is not None, 90, "the restarted relay", nodes)
        mark = {n.name: done(n) for n in nodes}
        natlab.wait_for(lambda: all(done(n) >= mark[n.name] + 3 for n in nodes), 180, "3 more rounds each", nodes)
        for n in (a, b):
            st = status(n)
            assert st["network"]["connections"].get(peer(relay)) == "direct", st["network"]
            assert st["network"]["relays"] == [peer(relay)], "the slot is reserved again on the restarted relay"
            last = [r["round"] for r in rounds(n)]
            assert last == sorted(set(last)), f"{n.name} ran a round twice or out of order: {last}"
        assert full_rounds(relay, everyone), "after its restart the relay trains on every author again"
        print(f"\nrelay restart: back in every round within {time.time() - restarted:.0f} s")
    finally:
        for n in nodes:
            n.stop()
        keep_logs(nodes)


@pytest.mark.parametrize("lab", ["symmetric"], indirect=True)
def test_behind_symmetric_nats_peers_stay_relayed_and_complete_rounds(lab: Any, tmp_path: Path) -> None:
    # The relay cuts every circuit after 20 s (its duration limit): the homes dial a new one and go on.
    relay, a, b = start(lab, tmp_path, ["--set", "network.traversal.relay_limits.duration_seconds=20"])
    nodes = [relay, a, b]
    try:
        natlab.wait_for(lambda: all(done(n) >= 6 for n in nodes), 240, "6 rounds on every node", nodes)
        everyone = {peer(n) for n in nodes}
        for n in nodes:
            assert len(full_rounds(n, everyone)) >= 4, f"{n.name}: {[r.get('authors') for r in rounds(n)]}"
        natlab.wait_for(
            lambda: (
                status(a)["network"]["connections"].get(peer(b)) is not None
                and status(b)["network"]["connections"].get(peer(a)) is not None
            ),
            60,
            "a connection between the homes (peer exchange)",
            nodes,
        )
        sa, sb = status(a), status(b)
        # Row 3: a hole punch cannot work through a NAT that picks a random port per connection: the homes
        # reach each other through the relay and stay so.
        assert sa["network"]["connections"].get(peer(b)) == "relayed", sa["network"]
        assert sb["network"]["connections"].get(peer(a)) == "relayed", sb["network"]
        assert not sa["network"]["hole_punched"] and not sb["network"]["hole_punched"]
        relay_status = status(relay)["network"]
        assert relay_status["relay_service_reservations"] == 2
        assert relay_status["relay_service_bytes"] > 0, "the homes' rounds went through the relay"

        # Row 3 within the relay's limits: a circuit cut at its duration limit is dialled again, rounds go on.
        def relayed_dials() -> int:
            return sum(status(n)["network"]["dials"].get("relayed_ok", 0) for n in (a, b))

        first = relayed_dials()  # 1, or 2 when both homes dialled each other at once
        natlab.wait_for(
            lambda: relayed_dials() > first,
            90,
            "a second relayed dial between the homes after the relay cut the first circuit",
            nodes,
        )
        mark = {n.name: len(full_rounds(n, everyone)) for n in (a, b)}
        natlab.wait_for(
            lambda: all(len(full_rounds(n, everyone)) >= mark[n.name] + 3 for n in (a, b)),
            120,
            "3 more rounds with every author after the new circuit",
            nodes,
        )
    finally:
        for n in nodes:
            n.stop()
        keep_logs(nodes)


@pytest.mark.parametrize("lab", ["cone"], indirect=True)
def test_a_hostile_bootstrap_forging_the_manifest_and_listing_sybils_cannot_capture_a_joiner(
    lab: Any, tmp_path: Path
) -> None:
    """Row 5: a public bootstrap that serves the run's manifest re-signed by its own key, keeps 8 idle Sybil
    identities in the run and forwards nothing honest. A joiner given it and the honest relay, with nothing
    pinned, refuses to pick one (the two serve different manifests); pinned to the creator's manifest it joins,
    connects to both, reaches the honest peers through the honest one and trains with them every round, and
    dials at most ``max_per_subnet`` Sybils. Everyone that asks the forger for its manifest counts it."""
    import json
    import subprocess
    import sys

    relay, boot = start_relay(lab, tmp_path)
    b = join_home(lab, tmp_path, 2, "B", [boot])
    nodes = [relay, b]
    hostile_out = tmp_path / "hostile.json"
    manifest = str(tmp_path / "R" / "manifest.json")
    hostile = subprocess.Popen(
        ["ip", "netns", "exec", lab.inet, sys.executable, str(ROOT / "tests" / "hostile_node.py"), "--ip",
         lab.public_ip, "--port", "4002", "--bootstrap", boot, "--manifest", manifest, "--forge", "--sybils", "8",
         "--out", str(hostile_out), "--seconds", "400"],
        stdout=(tmp_path / "hostile.log").open("wb"), stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:
        natlab.wait_for(lambda: all(done(n) >= 2 for n in nodes), 180, "2 rounds on the relay and B", nodes)
        natlab.wait_for(lambda: hostile_out.exists() or hostile.poll() is not None, 90, "the hostile node", nodes)
        assert hostile.poll() is None, (tmp_path / "hostile.log").read_text()[-3000:]
        h = json.loads(hostile_out.read_text())
        creator = status(relay)["manifest"]["sha256"]
        assert h["manifest_sha256"] != creator

        # Nothing pinned: the two bootstraps disagree, so the joiner refuses, naming both.
        refused = subprocess.run(
            ["ip", "netns", "exec", lab.home(1), sys.executable, "-m", "dgrpo", "node", "join", h["address"], boot,
             "--state-dir", str(tmp_path / "J"), "--listen", home_listen(lab, 1)],
            capture_output=True, text=True, timeout=180,
        )  # fmt: skip
        said = " ".join((refused.stdout + refused.stderr).split())
        packed = "".join(said.split())  # rich wraps long lines, inside addresses too
        assert refused.returncode == 2, said[-2000:]
        assert "servedifferentrunmanifests" in packed and h["address"] in packed and boot in packed, said[-2000:]

        # Pinned to the creator's manifest: joins through both.
        a = join_home(lab, tmp_path, 1, "A", [h["address"], boot, "--manifest-sha256", creator])
        nodes.append(a)
        honest = {peer(relay), peer(b)}
        natlab.wait_for(
            lambda: len([r for r in rounds(a) if set(r.get("authors") or ()) >= honest | {peer(a)}]) >= 3,
            240,
            "3 rounds in which the joiner trained on every honest author",
            nodes,
        )
        st = status(a)
        connections = st["network"]["connections"]
        assert peer(relay) in connections and h["peer_id"] in connections, connections
        sybils_dialled = [p for p in connections if p in set(h["sybils"])]
        assert len(sybils_dialled) <= 2, f"at most max_per_subnet Sybils of one /24: {sybils_dialled}"
        assert st["manifest"]["sha256"] == creator and st["manifest"]["origin"] == "joined"
        # Counted where it was refused: by the joiner when it joined (pinned by sha256: conflicting_manifest),
        # by the relay when it checked its new peer (another key signed its run: wrong_creator).
        assert status(a)["manifest"]["rejected_by_peer"].get(h["peer_id"]) == {"conflicting_manifest": 1}
        natlab.wait_for(
            lambda: "wrong_creator" in status(relay)["manifest"]["rejected_by_peer"].get(h["peer_id"], {}),
            60,
            "the relay to count the forged manifest",
            nodes,
        )
        # The Sybils' heartbeats reached the honest nodes (the hostile node is in the run), and changed nothing.
        assert set(h["sybils"]) & set(status(relay)["peers"]), "the relay heard the Sybils"
        assert [r["round"] for r in rounds(a)] == sorted({r["round"] for r in rounds(a)})
    finally:
        hostile.terminate()
        hostile.wait(timeout=30)
        for n in nodes:
            n.stop()
        keep_logs(nodes)


def test_the_joining_guide(tmp_path: Path) -> None:
    """docs/joining.md's walk-through, its commands run as written (as root, with the lab's name, this checkout's
    interpreter and a temporary folder put in): a public testnet in the lab's internet, a home behind NAT joins it
    with the one command the testnet printed, and trains with it."""
    import re
    import shlex
    import subprocess

    text = (ROOT / "docs" / "joining.md").read_text()
    match = re.search(r"<!-- walkthrough -->\n```bash\n(.*?)```", text, re.S)
    assert match, "docs/joining.md has the walk-through block"
    lines = [line for line in match.group(1).splitlines() if line.strip()]
    prefix = f"g{os.getpid() % 10000}"
    why = natlab.unavailable()
    if why is not None:
        pytest.fail(f"cannot build the NAT lab here: {why}")

    def command(line: str, **values: str) -> list[str]:
        line = line.removeprefix("sudo ")
        for key, value in values.items():
            line = line.replace(key, value)
        line = line.replace("scripts/natlab.py", f"{sys.executable} {ROOT / 'scripts' / 'natlab.py'}")
        line = line.replace(".venv/bin/dgrpo", f"{sys.executable} -m dgrpo").replace("runs/", f"{tmp_path}/")
        line = line.replace("--prefix nl", f"--prefix {prefix}").replace(" nl-", f" {prefix}-")
        return shlex.split(line)

    env = {**os.environ, "COLUMNS": "400", "PYTHONUNBUFFERED": "1"}

    def run(line: str, **values: str) -> str:
        done = subprocess.run(command(line, **values), capture_output=True, text=True, timeout=300, env=env)
        assert done.returncode == 0, f"{line}\n{done.stdout}\n{done.stderr}"
        return done.stdout

    up, testnet, join, status_line, down, lab_down = lines
    joiner: Any = None
    try:
        run(up)
        printed = run(testnet)
        found = re.search(
            r"another machine joins with: dgrpo node join (\S+) --manifest-sha256 ([0-9a-f]{64})", printed
        )
        assert found, printed
        address, sha = found.groups()
        assert address.startswith(f"/ip4/{natlab.PUBLIC_NET}.1/tcp/"), "the testnet's public address, not loopback"
        cmd = command(join, JOIN_ADDRESS=address, JOIN_SHA256=sha)
        state = tmp_path / "home1"
        state.mkdir()
        log = (state / "node.log").open("wb")
        joiner = natlab.NsNode("home1", f"{prefix}-h1", state, subprocess.Popen(cmd, stdout=log, stderr=log, env=env))
        natlab.wait_for(
            lambda: (
                len([r for r in rounds(joiner) if len(r.get("authors") or ()) == 3]) >= 2
                and reachability(joiner) == "private"
            ),
            240,
            "the home node to train with both public nodes, knowing it is private",
            [joiner],
        )
        st = status(joiner)
        assert st["manifest"]["origin"] == "joined" and st["manifest"]["sha256"] == sha
        assert st["network"]["relays"] and st["listen_addrs"][0].count("/p2p-circuit/") == 1
        shown = " ".join(run(status_line).split())
        assert "reachability: private" in shown and "relay slots on" in shown, shown
        assert all((tmp_path / "public" / f"node-{i}" / "node.json").exists() for i in range(2))
        run(down)
    finally:
        if joiner is not None:
            joiner.stop()
            keep_logs([joiner])
        subprocess.run(command(lab_down), capture_output=True, timeout=60)


def test_mdns_finds_a_peer_on_the_lan_without_any_bootstrap(tmp_path: Path) -> None:
    """Discovery on a LAN (opt-in, ``network.traversal.mdns``): two daemons on one bridge, neither given a
    bootstrap address, find each other by mDNS (py-libp2p's, through zeroconf) and train together."""
    why = natlab.unavailable()
    if why is not None:
        pytest.fail(f"cannot build the LAN here: {why}")
    lan = natlab.Lan(prefix=f"m{os.getpid() % 10000}")
    natlab.lan_up(lan)
    nodes: list[Any] = []
    try:
        for i in (1, 2):
            args = [
                "--listen", f"/ip4/{lan.host_ip(i)}/tcp/4001", "--run-id", "lanrun", "--max-rounds", "20",
                "--set", "network.traversal.mdns=true", "--set", "rounds.min_peers=1", "--set", "status.port=0",
                "--set", "rounds.heartbeat_seconds=0.5", "--set", "rounds.deadline_seconds=30",
            ]  # fmt: skip
            nodes.append(natlab.launch(f"M{i}", lan.host(i), tmp_path / f"M{i}", args))
        m1, m2 = nodes
        natlab.wait_for(lambda: all(n.status() is not None for n in nodes), 120, "both LAN nodes up", nodes)
        natlab.wait_for(
            lambda: all(peer(other) in (status(n).get("connected_peers") or []) for n, other in ((m1, m2), (m2, m1))),
            90,
            "the two LAN nodes to find each other by mDNS",
            nodes,
        )
        natlab.wait_for(
            lambda: all(len(full_rounds(n, {peer(m1), peer(m2)})) >= 2 for n in nodes),
            180,
            "2 rounds in which each trained on both",
            nodes,
        )
        assert status(m1)["gossip"]["bootstrap_attempts"] == 0, "no bootstrap was given"
    finally:
        for n in nodes:
            n.stop()
        keep_logs(nodes)
        natlab.lan_down(lan)
