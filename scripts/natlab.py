#!/usr/bin/env python3
"""A home-router NAT lab from network namespaces (root; iproute2 and nftables; standard library only).

The topology of libp2p's own hole-punch interop tests (libp2p/test-plans, ``hole-punch-interop``):

    <p>-inet   the "internet": a bridge 203.0.113.0/24 (TEST-NET-3); the public node runs here at .1
    <p>-r1     home router 1: WAN 203.0.113.11, LAN 10.0.1.1/24, NAT (nftables masquerade)
    <p>-h1     home 1: 10.0.1.2, default route via its router
    <p>-r2     home router 2: WAN 203.0.113.12, LAN 10.0.2.1/24
    <p>-h2     home 2: 10.0.2.2

``--nat cone`` (default) is ``masquerade``: Linux keeps the source port where it can, an endpoint-independent
mapping, so TCP hole punching works. ``--nat symmetric`` is ``masquerade fully-random``: every connection gets
a random port, so a hole punch cannot succeed. Either way a router drops unsolicited inbound connections into
its LAN (``ct state new drop``), as a home router does.

Nothing here touches the host's interfaces: the namespaces are joined only to each other, and ``down`` deletes
them. Usage::

    sudo scripts/natlab.py up [--prefix nl] [--nat cone|symmetric]
    sudo ip netns exec nl-h1 <command>      # run something in home 1
    sudo scripts/natlab.py down [--prefix nl]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

PUBLIC_NET = "203.0.113"


@dataclass(frozen=True)
class Lab:
    prefix: str = "nl"
    nat: str = "cone"  # cone (port-preserving masquerade) or symmetric (masquerade fully-random)
    homes: int = 2

    @property
    def inet(self) -> str:
        return f"{self.prefix}-inet"

    def router(self, i: int) -> str:
        return f"{self.prefix}-r{i}"

    def home(self, i: int) -> str:
        return f"{self.prefix}-h{i}"

    @property
    def public_ip(self) -> str:
        return f"{PUBLIC_NET}.1"

    def wan_ip(self, i: int) -> str:
        return f"{PUBLIC_NET}.{10 + i}"

    def home_ip(self, i: int) -> str:
        return f"10.0.{i}.2"

    def namespaces(self) -> list[str]:
        homes = range(1, self.homes + 1)
        return [self.inet, *(self.router(i) for i in homes), *(self.home(i) for i in homes)]


def _run(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(args), check=check, capture_output=True, text=True)


def _ns(ns: str, *args: str) -> None:
    _run("ip", "netns", "exec", ns, *args)


def unavailable() -> str | None:
    """Why the lab cannot be built here, or None."""
    import os

    if os.geteuid() != 0:
        return "network namespaces need root"
    for tool in ("ip", "nft"):
        if shutil.which(tool) is None:
            return f"{tool!r} is not installed (apt-get install iproute2 nftables; scripts/install.sh does)"
    probe = "dgrpo-probe-ns"
    made = _run("ip", "netns", "add", probe, check=False)
    if made.returncode != 0:
        return f"cannot create a network namespace: {made.stderr.strip()}"
    _run("ip", "netns", "del", probe, check=False)
    return None


def up(lab: Lab) -> None:
    down(lab)
    for ns in lab.namespaces():
        _run("ip", "netns", "add", ns)
        _ns(ns, "ip", "link", "set", "lo", "up")
    p = lab.prefix
    _ns(lab.inet, "ip", "link", "add", "br0", "type", "bridge")
    _ns(lab.inet, "ip", "addr", "add", f"{lab.public_ip}/24", "dev", "br0")
    _ns(lab.inet, "ip", "link", "set", "br0", "up")
    masquerade = "masquerade fully-random" if lab.nat == "symmetric" else "masquerade"
    for i in range(1, lab.homes + 1):
        router, home = lab.router(i), lab.home(i)
        # WAN: router <-> the internet's bridge. Interface names are made in the router and moved, so two labs
        # with different prefixes never collide in the root namespace (nothing stays there).
        _run("ip", "-n", router, "link", "add", "wan", "type", "veth", "peer", "name", f"{p}w{i}")
        _run("ip", "-n", router, "link", "set", f"{p}w{i}", "netns", lab.inet)
        _ns(lab.inet, "ip", "link", "set", f"{p}w{i}", "master", "br0")
        _ns(lab.inet, "ip", "link", "set", f"{p}w{i}", "up")
        _ns(router, "ip", "addr", "add", f"{lab.wan_ip(i)}/24", "dev", "wan")
        _ns(router, "ip", "link", "set", "wan", "up")
        # LAN: router <-> home.
        _run("ip", "-n", router, "link", "add", "lan", "type", "veth", "peer", "name", "eth0")
        _run("ip", "-n", router, "link", "set", "eth0", "netns", home)
        _ns(router, "ip", "addr", "add", f"10.0.{i}.1/24", "dev", "lan")
        _ns(router, "ip", "link", "set", "lan", "up")
        _ns(home, "ip", "addr", "add", f"{lab.home_ip(i)}/24", "dev", "eth0")
        _ns(home, "ip", "link", "set", "eth0", "up")
        _ns(home, "ip", "route", "add", "default", "via", f"10.0.{i}.1")
        _ns(router, "sysctl", "-q", "-w", "net.ipv4.ip_forward=1")
        rules = f"""
table ip nat {{
    chain post {{ type nat hook postrouting priority 100; oifname "wan" {masquerade}; }}
}}
table ip filter {{
    chain forwarding {{
        type filter hook forward priority 0; policy accept;
        ct state established,related accept
        iifname "wan" ct state new drop
    }}
    chain inbound {{
        type filter hook input priority 0; policy accept;
        ct state established,related accept
        iifname "wan" ct state new drop
    }}
}}
"""
        subprocess.run(["ip", "netns", "exec", router, "nft", "-f", "-"], input=rules, check=True, text=True)


def down(lab: Lab) -> None:
    existing = _run("ip", "netns", "list", check=False).stdout.split()
    for ns in lab.namespaces():
        if ns in existing:
            _run("ip", "netns", "del", ns, check=False)


@dataclass(frozen=True)
class Lan:
    """A local network without a router: ``hosts`` namespaces on one bridge, ``10.9.0.<i+1>/24``, with a
    route for multicast (mDNS) and none to anywhere else."""

    prefix: str = "nl"
    hosts: int = 2

    @property
    def switch(self) -> str:
        return f"{self.prefix}-lan"

    def host(self, i: int) -> str:
        return f"{self.prefix}-m{i}"

    def host_ip(self, i: int) -> str:
        return f"10.9.0.{i + 1}"

    def namespaces(self) -> list[str]:
        return [self.switch, *(self.host(i) for i in range(1, self.hosts + 1))]


def lan_up(lan: Lan) -> None:
    lan_down(lan)
    for ns in lan.namespaces():
        _run("ip", "netns", "add", ns)
        _ns(ns, "ip", "link", "set", "lo", "up")
    _ns(lan.switch, "ip", "link", "add", "br0", "type", "bridge")
    _ns(lan.switch, "ip", "link", "set", "br0", "up")
    for i in range(1, lan.hosts + 1):
        host = lan.host(i)
        _run("ip", "-n", host, "link", "add", "eth0", "type", "veth", "peer", "name", f"{lan.prefix}p{i}")
        _run("ip", "-n", host, "link", "set", f"{lan.prefix}p{i}", "netns", lan.switch)
        _ns(lan.switch, "ip", "link", "set", f"{lan.prefix}p{i}", "master", "br0")
        _ns(lan.switch, "ip", "link", "set", f"{lan.prefix}p{i}", "up")
        _ns(host, "ip", "addr", "add", f"{lan.host_ip(i)}/24", "dev", "eth0")
        _ns(host, "ip", "link", "set", "eth0", "up")
        _ns(host, "ip", "route", "add", "224.0.0.0/4", "dev", "eth0")


def lan_down(lan: Lan) -> None:
    existing = _run("ip", "netns", "list", check=False).stdout.split()
    for ns in lan.namespaces():
        if ns in existing:
            _run("ip", "netns", "del", ns, check=False)


@dataclass
class NsNode:
    """A ``dgrpo node run`` daemon inside one namespace of the lab."""

    name: str
    ns: str
    state_dir: Path
    process: subprocess.Popen[bytes]

    def node_file(self) -> dict[str, Any] | None:
        try:
            data: dict[str, Any] = json.loads((self.state_dir / "node.json").read_text())
            return data
        except (OSError, ValueError):
            return None

    def status(self, timeout: float = 15.0) -> dict[str, Any] | None:
        """Its ``/status``, fetched from inside its namespace (the status server listens on its 127.0.0.1).
        ``timeout`` is generous: on a 2-core machine running three daemons' training steps an answer can take
        seconds."""
        info = self.node_file()
        if not info or not info.get("status_url"):
            return None
        # (the standard library, not curl: a bare machine may not have it)
        fetch = (
            "import sys, urllib.request as u; "
            f"sys.stdout.write(u.urlopen(sys.argv[1], timeout={timeout}).read().decode())"
        )
        got = _run(
            "ip", "netns", "exec", self.ns, sys.executable, "-c", fetch, info["status_url"] + "/status", check=False
        )
        try:
            data: dict[str, Any] = json.loads(got.stdout)
            return data
        except ValueError:
            return None

    def public_addr(self, prefix: str) -> str:
        """Its announced address that starts with ``prefix`` (e.g. ``/ip4/203.0.113.1/``)."""
        info = self.node_file() or {}
        return next(a for a in info.get("listen_addrs", []) if a.startswith(prefix))

    def stop(self, timeout: float = 30.0) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        return self.process.returncode


def launch(
    name: str, ns: str, state_dir: Path, args: list[str], python: str = sys.executable, command: str = "run"
) -> NsNode:
    """Start ``python -m dgrpo node COMMAND ARGS --state-dir STATE_DIR`` (``run`` or ``join``) in ``ns``; its
    output goes to node.log."""
    state_dir.mkdir(parents=True, exist_ok=True)
    (state_dir / "node.json").unlink(missing_ok=True)
    log = (state_dir / "node.log").open("ab")
    cmd = ["ip", "netns", "exec", ns, python, "-m", "dgrpo", "node", command, *args, "--state-dir", str(state_dir)]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    process = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
    return NsNode(name, ns, state_dir, process)


def wait_for(predicate: Any, timeout: float, what: str, nodes: list[NsNode] = ()) -> None:  # type: ignore[assignment]
    """Poll ``predicate`` (bounded); on timeout raise naming ``what``, with the tail of each node's log."""
    t0 = time.time()
    while not predicate():
        dead = [n for n in nodes if n.process.poll() is not None]
        if time.time() - t0 > timeout or dead:
            tails = "\n".join(
                f"--- {n.name} (exit {n.process.poll()}):\n"
                + "\n".join((n.state_dir / "node.log").read_text(errors="replace").splitlines()[-25:])
                for n in nodes
            )
            why = f"{[n.name for n in dead]} exited" if dead else f"timed out after {timeout:.0f} s"
            raise TimeoutError(f"{why} waiting for {what}\n{tails}")
        time.sleep(0.5)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("action", choices=["up", "down", "check"])
    parser.add_argument("--prefix", default="nl", help="namespace name prefix (keep it short: 1-6 letters)")
    parser.add_argument("--nat", choices=["cone", "symmetric"], default="cone")
    args = parser.parse_args(argv)
    lab = Lab(args.prefix, args.nat)
    why = unavailable()
    if why is not None:
        print(f"natlab: {why}", file=sys.stderr)
        return 2
    if args.action == "up":
        up(lab)
        print(f"public node: ip netns exec {lab.inet} ...  (address {lab.public_ip})")
        for i in range(1, lab.homes + 1):
            print(f"home {i}: ip netns exec {lab.home(i)} ...  (address {lab.home_ip(i)}, behind {lab.wan_ip(i)})")
    elif args.action == "down":
        down(lab)
    return 0


if __name__ == "__main__":
    sys.exit(main())
