"""Gossip throughput and latency over a chain of three processes on loopback: bare py-libp2p vs the dgrpo stack.

    .venv/bin/python benchmarks/gossip.py [--messages-4k 500] [--messages-64k 200] [--rate 20]

Each run starts three ``benchmarks.gossip_probe`` processes, A -> B -> C (A and C each connected only to B),
once per (load, payload size, stack). A publishes and exits; C measures throughput (distinct payloads
delivered per s, from A's first send to C's last receipt) and hop-2 latency A -> C, from the send time A
writes into each payload (one machine, so one clock). Two loads: a flood, where A publishes as fast as the
node's pacing lets it (throughput; its latency is mostly queueing), and a steady ``--rate`` per s (latency).

Stacks:

- ``bare``: GossipNode with raw bytes (strict signing and yamux, as in the node).
- ``dgrpo``: each payload wrapped by the protocol's codec (sign and encode at A, validate at every hop,
  decode at C). It is the ``Codec`` subclass at ``DGRPO_STACK``; until that exists its columns read n/a.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script: the checkout's benchmarks/
from benchmarks.gossip_probe import resolve_codec, run_chain_processes

DGRPO_STACK = "benchmarks.gossip_codec:DgrpoCodec"
"""The hook for the dgrpo stack: a ``benchmarks.gossip_probe.Codec`` subclass (encode = sign + encode,
``validator`` = the protocol's validation, decode = validate + decode)."""

STACKS = {"bare": "bare", "dgrpo": DGRPO_STACK}


def stack_missing(stack: str) -> str | None:
    """Why ``stack`` cannot run here, or None when it can."""
    try:
        resolve_codec(STACKS[stack])
    except (ImportError, AttributeError) as error:
        return f"{type(error).__name__}: {error}"
    return None


def run_chain(stack: str, payload_bytes: int, messages: int, rate: float = 0.0) -> dict[str, Any]:
    """One A -> B -> C run of ``stack`` ("bare" or "dgrpo"); ``{"missing": reason}`` if the stack is absent."""
    reason = stack_missing(stack)
    if reason is not None:
        return {"stack": stack, "payload_bytes": payload_bytes, "missing": reason}
    with tempfile.TemporaryDirectory(prefix="gossip-bench-") as workdir:
        result = run_chain_processes(STACKS[stack], payload_bytes, messages, Path(workdir), rate=rate, timeout=300)
    return {**result, "stack": stack, "messages": messages}


def fmt(value: float | None, digits: int = 1) -> str:
    return "n/a" if value is None else f"{value:.{digits}f}"


def table(results: dict[tuple[float, int, str], dict[str, Any]]) -> str:
    """One row per (load, payload, stack); the dgrpo rows carry the comparison with bare at the same point."""
    header = ["load", "payload", "stack", "delivered", "msg/s at C", "MB/s at C", "p50 ms", "p99 ms"]
    header += ["dgrpo/bare msg/s", "dgrpo-bare p50 ms"]
    rows = ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    for (rate, size, stack), r in results.items():
        bare = results[(rate, size, "bare")]
        cells = ["n/a"] * 5
        if "missing" not in r:
            speed = r["throughput_msgs_per_s"]
            cells = [f"{r['received']}/{r['messages']}", fmt(speed), fmt(speed and speed * size / 1e6, 2)]
            cells += [fmt(r["p50_ms"]), fmt(r["p99_ms"])]
        ratio = diff = None
        if stack == "dgrpo" and "missing" not in r and "missing" not in bare:
            ratio = r["throughput_msgs_per_s"] / bare["throughput_msgs_per_s"]
            diff = r["p50_ms"] - bare["p50_ms"]
        compare = [fmt(ratio, 2), fmt(diff)] if stack == "dgrpo" else ["", ""]
        load = f"{rate:g}/s" if rate else "flood"
        rows.append("| " + " | ".join([load, f"{size // 1024} KiB", stack, *cells, *compare]) + " |")
    return "\n".join(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--messages-4k", type=int, default=500, help="messages in the 4 KiB runs")
    parser.add_argument("--messages-64k", type=int, default=200, help="messages in the 64 KiB runs")
    parser.add_argument("--rate", type=float, default=20.0, help="publish rate of the latency runs, per s")
    args = parser.parse_args()
    results: dict[tuple[float, int, str], dict[str, Any]] = {}
    for rate in (0.0, args.rate):  # a flood (pacing only) for throughput, then a steady load for latency
        for size, messages in ((4096, args.messages_4k), (65536, args.messages_64k)):
            if rate:
                messages = min(messages, int(10 * rate))  # 10 s per latency run is plenty
            for stack in STACKS:
                r = results[(rate, size, stack)] = run_chain(stack, size, messages, rate=rate)
                done = r.get("missing") or f"{r['received']}/{messages} delivered"
                print(
                    f"{'flood' if not rate else f'{rate:g}/s':>6} {size // 1024:>2} KiB {stack:>5}: {done}", flush=True
                )
    print()
    print(table(results))


if __name__ == "__main__":
    main()
