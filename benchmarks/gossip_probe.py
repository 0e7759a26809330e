"""A one-node gossip probe, run as its own process: ``python -m benchmarks.gossip_probe MODE ...``.

Every line it prints on stdout is one JSON object: first ``{"event": "listening", "addr": ...}`` (the full
multiaddr, /p2p/ included), then ``{"event": "ready"}`` once its mesh on the topic has ``--wait-mesh`` peers,
then ``{"event": "summary", ...}``. Modes:

- ``publish``: send ``--count`` payloads of ``--size`` bytes (paced by the node; ``--rate`` caps it further).
  A payload starts with its index and the wall-clock send time, so receivers on the same machine can
  measure latency.
- ``receive``: count payloads until ``--count`` distinct ones arrived or ``--timeout`` passed; the summary
  has latency percentiles and throughput.
- ``relay``: subscribe and forward until stdin closes.

``--stack`` picks the :class:`Codec` wrapped around each payload (see ``CODECS``). :class:`ProbeProcess`
starts a probe and reads its events; tests and ``benchmarks/gossip.py`` use it.
"""

from __future__ import annotations

import argparse
import importlib
import json
import logging
import os
import select
import struct
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any, TextIO

import trio

from dgrpo.errors import DgrpoError, UnknownNameError
from dgrpo.net.gossip import GossipConfig, GossipNode, Validator

HEADER = struct.Struct(">Qd")  # payload index, sender's time.time()

REPO = Path(__file__).resolve().parents[1]


class Codec:
    """How a stack turns an application payload into gossip bytes and back. This base class is the bare
    stack: raw bytes, no validator. A stack overrides the hooks it needs."""

    validator: Validator | None = None
    """Installed as the topic validator on every probe (relays included), when set."""

    def __init__(self, key_pair: Any) -> None:
        self.key_pair = key_pair

    def encode(self, payload: bytes) -> bytes:
        return payload

    def decode(self, data: bytes, source: str) -> bytes | None:
        """The payload, or None for a message the stack finds invalid."""
        return data


CODECS: dict[str, Callable[[Any], Codec]] = {"bare": Codec}
"""Stacks by name. Others are given as ``module:attribute``, the attribute being a :class:`Codec` subclass
(called with the node's libp2p key pair): this is where the dgrpo stack (sign, encode, validate, decode, from
``dgrpo.protocol``) plugs in, without this file knowing it; see ``DGRPO_STACK`` in ``benchmarks/gossip.py``."""


def resolve_codec(name: str) -> Callable[[Any], Codec]:
    """The codec factory for a stack name or ``module:attribute`` (ImportError or AttributeError if missing)."""
    if name in CODECS:
        return CODECS[name]
    if ":" not in name:
        raise UnknownNameError("stack", name, [*CODECS, "<module>:<Codec subclass>"])
    module, _, attribute = name.partition(":")
    factory: Callable[[Any], Codec] = getattr(importlib.import_module(module), attribute)
    return factory


def emit(event: str, **fields: Any) -> None:
    print(json.dumps({"event": event, **fields}), flush=True)


def percentile(values: list[float], q: float) -> float | None:
    """Nearest-rank percentile (``q`` in [0, 100]); None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, -(-len(ordered) * q // 100))  # ceil(n q / 100), at least 1
    return ordered[int(rank) - 1]


def make_payload(index: int, size: int) -> bytes:
    header = HEADER.pack(index, time.time())
    return header + bytes(max(0, size - len(header)))


async def run_probe(args: argparse.Namespace) -> None:
    from libp2p.crypto.ed25519 import create_new_key_pair

    key_pair = create_new_key_pair()
    codec = resolve_codec(args.stack)(key_pair)
    config = GossipConfig(listen=args.listen, bootstrap=tuple(args.bootstrap))
    async with GossipNode.open(config, key_pair) as node:
        emit("listening", addr=node.listen_addrs()[0], peer_id=node.peer_id)
        if codec.validator is not None:
            node.set_validator(args.topic, codec.validator)
        inbox = await node.subscribe(args.topic)
        await node.wait_for_mesh(args.topic, args.wait_mesh, timeout=args.timeout)
        emit("ready", mesh=len(node.mesh_peers(args.topic)))
        if args.mode == "publish":
            summary = await publish(node, codec, args)
        elif args.mode == "receive":
            summary = await receive(inbox, codec, args)
        else:
            summary = await relay(inbox)
        stats = node.statistics()
    emit("summary", mode=args.mode, **summary, stats=asdict(stats))


async def publish(node: GossipNode, codec: Codec, args: argparse.Namespace) -> dict[str, Any]:
    start = trio.current_time()
    for index in range(args.count):
        if args.rate:
            await trio.sleep_until(start + index / args.rate)
        await node.publish(args.topic, codec.encode(make_payload(index, args.size)))
    return {"published": args.count, "seconds": trio.current_time() - start}


async def receive(inbox: trio.MemoryReceiveChannel[Any], codec: Codec, args: argparse.Namespace) -> dict[str, Any]:
    seen: set[int] = set()
    latencies: list[float] = []
    first_sent = last_received = 0.0
    duplicates = invalid = 0
    with trio.move_on_after(args.timeout):
        while len(seen) < args.count:
            message = await inbox.receive()
            payload = codec.decode(message.data, message.source)
            if payload is None or len(payload) < HEADER.size:
                invalid += 1
                continue
            index, sent_at = HEADER.unpack_from(payload)
            if index in seen:
                duplicates += 1
                continue
            seen.add(index)
            latencies.append(message.received_at - sent_at)
            first_sent = sent_at if len(seen) == 1 else min(first_sent, sent_at)
            last_received = max(last_received, message.received_at)
    elapsed = last_received - first_sent
    return {
        "received": len(seen),
        "expected": args.count,
        "duplicates": duplicates,
        "invalid": invalid,
        "throughput_msgs_per_s": len(seen) / elapsed if elapsed > 0 else None,
        "latency_ms": {f"p{q}": _ms(percentile(latencies, q)) for q in (50, 99, 100)},
    }


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(1000 * seconds, 2)


async def relay(inbox: trio.MemoryReceiveChannel[Any]) -> dict[str, Any]:
    forwarded = 0

    async def count() -> None:
        nonlocal forwarded
        async for _ in inbox:
            forwarded += 1

    async with trio.open_nursery() as nursery, trio.lowlevel.FdStream(os.dup(sys.stdin.fileno())) as stdin:
        nursery.start_soon(count)
        while await stdin.receive_some():
            pass
        nursery.cancel_scope.cancel()
    return {"received": forwarded}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.gossip_probe", description=__doc__.split("\n")[0])
    parser.add_argument("mode", choices=["publish", "receive", "relay"])
    parser.add_argument("--topic", default="probe")
    parser.add_argument("--listen", default="/ip4/127.0.0.1/tcp/0")
    parser.add_argument("--bootstrap", action="append", default=[], help="multiaddr with /p2p/; repeatable")
    parser.add_argument("--count", type=int, default=100, help="payloads to publish / to wait for")
    parser.add_argument("--size", type=int, default=4096, help="payload bytes (before the stack's encoding)")
    parser.add_argument("--rate", type=float, default=0.0, help="publish at most this many per s (0: no cap)")
    parser.add_argument("--wait-mesh", type=int, default=0, help="mesh peers to wait for before starting")
    parser.add_argument("--timeout", type=float, default=60.0, help="s to wait for the mesh / for payloads")
    parser.add_argument("--stack", default="bare", help=f"{', '.join(CODECS)} or module:CodecSubclass")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    trio.run(run_probe, parse_args(argv))


class ProbeError(DgrpoError):
    """A probe process exited early, printed something unexpected, or was too slow."""


class ProbeProcess:
    """A probe in a child process; ``event()`` returns its next JSON line. Its stderr goes to ``log``."""

    def __init__(self, args: list[str], log: Path, python: str = sys.executable) -> None:
        self.log = log
        self._log_file: TextIO = log.open("w")
        self.proc = subprocess.Popen(
            [python, "-m", "benchmarks.gossip_probe", *args],
            cwd=REPO,  # benchmarks/ is a folder of the repository, not an installed package
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._log_file,
        )
        self._buffer = b""

    def event(self, expect: str, timeout: float) -> dict[str, Any]:
        line = self._readline(timeout)
        record: dict[str, Any] = json.loads(line)
        if record.get("event") != expect:
            raise ProbeError(f"expected a {expect!r} event, got {record}")
        return record

    def _readline(self, timeout: float) -> bytes:
        assert self.proc.stdout is not None
        deadline = time.monotonic() + timeout
        while b"\n" not in self._buffer:
            left = deadline - time.monotonic()
            ready, _, _ = select.select([self.proc.stdout], [], [], max(0.0, left))
            if not ready:
                raise ProbeError(f"probe silent for {timeout} s; log {self.log}: {self.log_tail()}")
            chunk = os.read(self.proc.stdout.fileno(), 65536)
            if not chunk:
                raise ProbeError(f"probe exited ({self.proc.wait()}); log {self.log}: {self.log_tail()}")
            self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        return line

    def close_stdin(self) -> None:
        """Tells a relay to stop."""
        assert self.proc.stdin is not None
        self.proc.stdin.close()

    def log_tail(self, chars: int = 2000) -> str:
        self._log_file.flush()
        return self.log.read_text()[-chars:]

    def stop(self, timeout: float = 10.0) -> int:
        """Wait for the process to exit, killing it after ``timeout``; returns its exit status."""
        if self.proc.stdin is not None and not self.proc.stdin.closed:
            self.proc.stdin.close()
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait()
        finally:
            self._log_file.close()


def run_chain_processes(
    stack: str, payload_bytes: int, messages: int, workdir: Path, rate: float = 0.0, timeout: float = 120.0
) -> dict[str, Any]:
    """Three probes on loopback, chained A -> B -> C (A and C each dial only B): A publishes ``messages``
    payloads, B relays, C receives. Returns C's measurements and everyone's counters; logs go to ``workdir``."""
    common = ["--topic", "chain", "--stack", stack, "--size", str(payload_bytes), "--count", str(messages)]
    common += ["--timeout", str(timeout)]
    probes: list[ProbeProcess] = []

    def start(name: str, *args: str) -> ProbeProcess:
        probes.append(ProbeProcess([*args, *common], workdir / f"{name}.log"))
        return probes[-1]

    try:
        b = start("b", "relay")
        relay_addr = b.event("listening", 60)["addr"]
        b.event("ready", timeout)
        c = start("c", "receive", "--bootstrap", relay_addr, "--wait-mesh", "1")
        c.event("listening", 60)
        c.event("ready", timeout)
        a = start("a", "publish", "--bootstrap", relay_addr, "--wait-mesh", "1", "--rate", str(rate))
        a.event("listening", 60)
        a.event("ready", timeout)
        sent = a.event("summary", timeout)  # A has flushed and exited: C must still get everything
        got = c.event("summary", timeout)
        b.close_stdin()
        relayed = b.event("summary", 30)
        codes = [probe.stop() for probe in probes]
    finally:
        for probe in probes:
            probe.stop(timeout=0)
    return {
        "stack": stack,
        "payload_bytes": payload_bytes,
        "published": sent["published"],
        "publish_seconds": sent["seconds"],
        "relayed": relayed["received"],
        "received": got["received"],
        "duplicates": got["duplicates"],
        "invalid": got["invalid"],
        "throughput_msgs_per_s": got["throughput_msgs_per_s"],
        "p50_ms": got["latency_ms"]["p50"],
        "p99_ms": got["latency_ms"]["p99"],
        "dropped": sum(s["stats"]["dropped"] for s in (sent, relayed, got)),
        "exit_codes": codes,
    }


if __name__ == "__main__":
    main()
