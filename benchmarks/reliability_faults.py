"""Reliability rows that need real daemons and time: ``python benchmarks/reliability_faults.py SCENARIO --out DIR``.

Scenarios (each bounded in time, each printing one table row and writing ``DIR/<scenario>.json``):

- ``sigstop``: a 3-daemon testnet; one daemon is frozen (SIGSTOP) for ``--frozen-rounds`` of the others' rounds,
  then thawed. Reports the others' median round time before, while frozen and the worst round, and whether the
  thawed daemon caught up (rejoined at the network's round and was trained on again).
- ``sigkill``: a 3-daemon testnet; one daemon is SIGKILLed at a random moment ``--kills`` times and restarted
  with ``--resume``. Reports restarts that resumed, checkpoints that verify, and whether any restart continued
  from anything but the newest verifying checkpoint (a round trained twice or lost silently).
- ``flood``: 4 daemons and a flooder that joins the network with its own identity and publishes valid signed
  rollouts as fast as it can. Reports the flood rate, the honest round time before and during the flood,
  and at how many honest daemons the flooder was blacklisted.
- ``spread-flood``: 4 daemons and a flooder (``benchmarks/spread_flooder.py``) that publishes ``--messages``
  valid rollouts, 8 per round, for rounds to come (within each round's quota, past what any peer may publish
  yet). Reports the honest round time before and in the three rounds from the flood's start, how many messages it
  got out, and at how many honest daemons it was blacklisted.
- ``soak``: a 3-daemon testnet for ``--minutes``; RSS of every daemon sampled every ``--every`` s, growth
  measured from the end of the warm-up (``--warmup`` s). Writes ``soak.csv`` and ``soak.png``; ``soak-report``
  recomputes the figures and the plot from ``soak.csv``.

Targets (docs/reliability.md): honest rounds <= 2x slower under a flood (1.5x under a spread flood) and the
flooder blacklisted; others keep
their round time with a frozen peer and it catches up; every SIGKILL restart resumes from a verifying checkpoint;
RSS growth < 10% over a 30-minute soak.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil

from dgrpo.daemon.checkpoint import CheckpointManager
from dgrpo.daemon.testnet import NetNode, rounds_log, start_testnet, stop_nodes, tcp_address, wait_until

FAST = ["rounds.deadline_seconds=30", "rounds.peer_timeout_seconds=3", "checkpoint.every=1"]


def progress(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def rss_mb(pid: int) -> float:
    return float(psutil.Process(pid).memory_info().rss) / 2**20


# ---------------------------------------------------------------------------------------------- sigstop
def sigstop(out: Path, frozen_rounds: int) -> dict[str, Any]:
    shutil.rmtree(out / "net", ignore_errors=True)
    nodes = start_testnet(3, out / "net", rounds=None, extra=FAST)
    victim, others = nodes[2], nodes[:2]
    try:
        wait_until(lambda: all(len(rounds_log(nd)) >= 4 for nd in nodes), 300, "four rounds everywhere")
        before = [row["seconds"] for nd in others for row in rounds_log(nd)[1:4]]
        marks = [len(rounds_log(nd)) for nd in others]
        progress(f"freezing {victim.peer_id[-8:]}")
        victim.process.send_signal(signal.SIGSTOP)
        wait_until(
            lambda: all(len(rounds_log(nd)) >= m + frozen_rounds for nd, m in zip(others, marks, strict=True)),
            60 * frozen_rounds,
            "the others' rounds while one is frozen",
        )
        during = [row["seconds"] for nd, m in zip(others, marks, strict=True) for row in rounds_log(nd)[m:]]
        dropped = [(nd.status() or {}).get("dropped_to_peer", {}).get(victim.peer_id, 0) for nd in others]
        victim.process.send_signal(signal.SIGCONT)
        network = max(rounds_log(nd)[-1]["round"] for nd in others)
        t_thaw = time.time()
        progress("thawed; waiting for it to catch up")
        wait_until(
            lambda: all(
                any(row["round"] > network and victim.peer_id in row["authors"] for row in rounds_log(nd))
                for nd in others
            ),
            180,
            "the others to train on the thawed peer again",
        )
        caught_up_s = time.time() - t_thaw
        catch_ups = (victim.status() or {}).get("catch_ups")
    finally:
        if victim.process.poll() is None:
            victim.process.send_signal(signal.SIGCONT)
        stop_nodes(nodes)
    return {
        "scenario": "sigstop",
        "round_s_before_median": statistics.median(before),
        "round_s_frozen_median": statistics.median(during),
        "round_s_frozen_max": max(during),
        "ratio_median": statistics.median(during) / statistics.median(before),
        "frozen_rounds": len(during) // 2,
        "dropped_to_frozen_peer": dropped,
        "caught_up_after_s": round(caught_up_s, 1),
        "catch_ups": catch_ups,
    }


# ---------------------------------------------------------------------------------------------- sigkill
def sigkill(out: Path, kills: int, seed: int) -> dict[str, Any]:
    rng = random.Random(seed)
    shutil.rmtree(out / "net", ignore_errors=True)
    nodes = start_testnet(3, out / "net", rounds=None, extra=FAST)
    victim = nodes[2]
    folder = victim.state_dir / "checkpoints"
    rows: list[dict[str, Any]] = []
    try:
        wait_until(lambda: len(rounds_log(victim)) >= 2, 300, "two rounds on the victim")
        for k in range(kills):
            time.sleep(rng.uniform(0.0, 4.0))  # a random point: generating, waiting, training or writing
            victim.process.send_signal(signal.SIGKILL)
            victim.process.wait(timeout=30)
            manager = CheckpointManager(folder)
            files = manager.checkpoints()
            verifying = [p for p in files if manager.read(p) is not None]
            newest = manager.load_latest()
            expected_round = newest.round + 1 if newest is not None else 1
            cmd = victim.process.args
            assert isinstance(cmd, list)
            log = open(victim.state_dir / "node.log", "ab")  # noqa: SIM115
            args = cmd if "--resume" in cmd else [*cmd, "--resume"]
            (victim.state_dir / "node.json").unlink(missing_ok=True)
            victim.process = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)
            victim.status_url = None
            resumed: dict[str, Any] = {}

            def started(resumed: dict[str, Any] = resumed) -> bool:
                status = victim.status()
                if status is None or status.get("state") != "running":
                    return False
                resumed.update(status)
                return True

            wait_until(started, 180, f"restart {k + 1} to run")
            done = int(resumed["rounds_done"])

            def trained(done: int = done) -> bool:
                return int((victim.status() or {}).get("rounds_done", 0)) > done

            wait_until(trained, 180, "a round")
            # Resumed exactly after the newest verifying checkpoint (or later, rejoining the network's round).
            row = {
                "kill": k + 1,
                "checkpoints": len(files),
                "verifying": len(verifying),
                "newest_checkpoint": None if newest is None else newest.round,
                "resumed_rounds_done": done,
                "checkpoint_rounds_done": None if newest is None else int(newest.meta.get("rounds_done", -1)),
                "resumed_round": resumed["round"],
                "expected_round": expected_round,
            }
            row["ok"] = (
                row["verifying"] == row["checkpoints"]
                and newest is not None
                and done == row["checkpoint_rounds_done"]
                and resumed["round"] >= expected_round
            )
            rows.append(row)
            progress(f"kill {k + 1}: {row}")
        replays = [(nd.status() or {}).get("rejected_by_peer", {}).get(victim.peer_id, 0) for nd in nodes[:2]]
    finally:
        stop_nodes(nodes)
    return {
        "scenario": "sigkill",
        "kills": kills,
        "restarts_resumed": sum(r["ok"] for r in rows),
        "checkpoints_verifying": f"{sum(r['verifying'] for r in rows)}/{sum(r['checkpoints'] for r in rows)}",
        "others_rejected_victim_messages": replays,
        "rows": rows,
    }


# ---------------------------------------------------------------------------------------------- flood
FLOODER = r"""
import sys, time, trio
from pathlib import Path
from dgrpo.protocol.messages import DEFAULT_SAMPLING
from dgrpo.net.gossip import GossipConfig, GossipNode
from dgrpo.net.p2p import Libp2pTransport
from dgrpo.protocol.envelope import Signer
from dgrpo.protocol.identity import Identity
from dgrpo.protocol.messages import Rollout
from dgrpo.protocol.nonce import NonceCounter
from dgrpo.protocol.validator import MessageValidator
from dgrpo.tasks.arith import ArithTask
from libp2p.pubsub.pb import rpc_pb2
from libp2p.pubsub.pubsub import PUBSUB_SIGNING_PREFIX

state, run_id, seconds, bootstrap = Path(sys.argv[1]), sys.argv[2], float(sys.argv[3]), sys.argv[4:]
state.mkdir(parents=True, exist_ok=True)
ident = Identity.generate()
signer = Signer(ident, run_id, NonceCounter(state / "nonce.json"))
prompt = ArithTask().train_prompt(0)

async def main() -> None:
    cfg = GossipConfig(bootstrap=tuple(bootstrap))
    async with GossipNode.open(cfg, ident.to_libp2p_keypair()) as gossip:
        transport = Libp2pTransport(gossip, signer, MessageValidator(run_id), run_id)
        async with trio.open_nursery() as nursery:
            await transport.start(nursery)
            await gossip.wait_for_peers(1, 60)
            await trio.sleep(3)
            rnd = max(max((p.round for p in transport.peer_table()), default=1), 1) + 1
            # Signed in advance (a distinct nonce each), for the current round and the two ahead that
            # receivers keep: the flood is then only as slow as publishing.
            batch = [  # rounds rnd .. rnd+2 (rnd: the next round, as signing takes a while)
                signer.sign_rollout(Rollout(author=ident.peer_id, round=rnd + k % 3, part=k // 3, parts=1_000_000,
                                            prompt_id=prompt.id, prompt=prompt.text, completions=("x",),
                                            indices=(0,), model_id="m", weights="", sampling=DEFAULT_SAMPLING,
                                            split="horizontal"))
                for k in range(1500)
            ]
            ps = gossip._pubsub
            key = ps.host.get_public_key().serialize()
            messages = []
            for data in batch:  # signed for gossipsub too (strict signing), as publish would
                msg = rpc_pb2.Message(data=data, topicIDs=[transport.topic], from_id=ps.my_id.to_bytes(),
                                      seqno=ps._next_seqno())
                msg.signature = ps.sign_key.sign(PUBSUB_SIGNING_PREFIX.encode() + msg.SerializeToString())
                msg.key = key
                messages.append(msg)
            print(f"flooding from {ident.peer_id} at round {rnd}", flush=True)
            sent, t0 = 0, time.time()
            # Written straight to every peer's pubsub stream, 250 messages per RPC: no queue, no pacing. After the
            # first pass, the same messages again (receivers drop them as seen): the load goes on.
            async def write(stream, rpc) -> None:
                try:
                    await ps.write_msg(stream, rpc)
                except Exception:
                    pass

            while time.time() - t0 < seconds and ps.peers:
                chunk = [messages[(sent + i) % len(messages)] for i in range(250)]
                rpc = rpc_pb2.RPC(publish=chunk)
                async with trio.open_nursery() as writers:  # to every peer at once
                    for stream in list(ps.peers.values()):
                        writers.start_soon(write, stream, rpc)
                sent += len(chunk)
            elapsed = time.time() - t0
            print(f"SENT {sent} {elapsed:.2f} {gossip.blacklisted()}", flush=True)
            nursery.cancel_scope.cancel()

trio.run(main)
"""


def messages_seen(node: NetNode) -> int:
    """Messages a daemon's validator judged so far (accepted or rejected)."""
    status = node.status() or {}
    return int(status.get("messages_accepted", 0)) + int(sum(status.get("messages_rejected", {}).values()))


def flood(out: Path, seconds: float) -> dict[str, Any]:
    shutil.rmtree(out / "net", ignore_errors=True)
    nodes = start_testnet(4, out / "net", rounds=None, extra=FAST)
    try:
        wait_until(lambda: all(len(rounds_log(nd)) >= 4 for nd in nodes), 300, "four rounds everywhere")
        before = [row["seconds"] for nd in nodes for row in rounds_log(nd)[1:4]]
        script = out / "flooder.py"
        script.write_text(FLOODER)
        progress(f"flooding for {seconds:.0f} s")
        cmd = [sys.executable, str(script), str(out / "flooder"), "testnet", str(seconds)]
        flooder = subprocess.Popen(
            [*cmd, *(tcp_address(nd) for nd in nodes)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        assert flooder.stdout is not None
        started = flooder.stdout.readline()  # "flooding from <peer> at round <r>": its start-up is over
        # Rounds from here on are measured: the flooder's start-up (imports, signing) is not the flood.
        marks = [len(rounds_log(nd)) for nd in nodes]
        seen_before = [messages_seen(nd) for nd in nodes]
        stdout, stderr = flooder.communicate(timeout=seconds + 180)
        seen_during = [messages_seen(nd) - b for nd, b in zip(nodes, seen_before, strict=True)]
        lines = [started, *stdout.splitlines()]
        sent_line = next((ln for ln in lines if ln.startswith("SENT")), "SENT 0 1")
        attacker = next((ln.split()[2] for ln in lines if ln.startswith("flooding")), "")
        _, sent, elapsed = sent_line.split()[:3]
        wait_until(lambda: all(len(rounds_log(nd)) >= m + 3 for nd, m in zip(nodes, marks, strict=True)), 300, "rounds")
        during = [row["seconds"] for nd, m in zip(nodes, marks, strict=True) for row in rounds_log(nd)[m : m + 3]]
        statuses = [nd.status() or {} for nd in nodes]
    finally:
        stop_nodes(nodes)
    blacklisted = sum(attacker in s.get("blacklisted_peers", []) for s in statuses)
    rejected = [s.get("round_rejections_by_peer", {}).get(attacker, 0) for s in statuses]
    return {
        "scenario": "flood",
        "flooder": attacker,
        "sent": int(sent),
        "send_rate_per_s": round(int(sent) / float(elapsed), 1),
        "seconds_until_every_peer_cut_it_off": round(float(elapsed), 2),
        "round_s_before_median": statistics.median(before),
        "round_s_flood_median": statistics.median(during),
        "round_s_flood_max": max(during),
        "ratio_median": statistics.median(during) / statistics.median(before),
        "blacklisted_at": f"{blacklisted}/{len(nodes)}",
        "validated_per_honest_node": seen_during,
        "rejected_by_honest": rejected,
        "flooder_stderr_tail": stderr[-500:],
    }


# ---------------------------------------------------------------------------------------------- soak
def soak(out: Path, minutes: float, every: float, warmup: float) -> dict[str, Any]:
    shutil.rmtree(out / "net", ignore_errors=True)
    nodes = start_testnet(3, out / "net", rounds=None, extra=["rounds.peer_timeout_seconds=4", "checkpoint.every=5"])
    samples: list[dict[str, Any]] = []
    t0 = time.time()
    try:
        wait_until(lambda: all(len(rounds_log(nd)) >= 1 for nd in nodes), 300, "a first round everywhere")
        t0 = time.time()
        while time.time() - t0 < minutes * 60:
            dead = [nd.index for nd in nodes if nd.process.poll() is not None]
            if dead:
                raise RuntimeError(f"daemon(s) {dead} exited during the soak")
            row = {"t_s": round(time.time() - t0, 1)}
            for nd in nodes:
                row[f"rss_mb_{nd.index}"] = round(rss_mb(nd.process.pid), 1)
                row[f"rounds_{nd.index}"] = len(rounds_log(nd))
            samples.append(row)
            progress(json.dumps(row))
            time.sleep(every)
    finally:
        clean = stop_nodes(nodes)
    indices = [nd.index for nd in nodes]
    write_soak_outputs(out, samples, indices, warmup)
    return {**soak_summary(samples, indices, warmup), "stopped_cleanly": clean}


def soak_summary(samples: list[dict[str, Any]], indices: list[int], warmup: float, window: int = 4) -> dict[str, Any]:
    """RSS growth per daemon from the end of the warm-up to the end: sample to sample, and between the means of
    the first and the last ``window`` samples (RSS moves by tens of MB with the allocator; a mean is steadier)."""
    base = [row for row in samples if row["t_s"] >= warmup]
    first, last = base[0], base[-1]

    def mean(rows: list[dict[str, Any]], i: int) -> float:
        return statistics.mean(float(row[f"rss_mb_{i}"]) for row in rows)

    point = {i: float(last[f"rss_mb_{i}"]) / float(first[f"rss_mb_{i}"]) - 1 for i in indices}
    windowed = {i: mean(base[-window:], i) / mean(base[:window], i) - 1 for i in indices}
    return {
        "scenario": "soak",
        "minutes": round(float(samples[-1]["t_s"]) / 60, 1),
        "rounds": [int(last[f"rounds_{i}"]) for i in indices],
        "rss_mb_after_warmup": [float(first[f"rss_mb_{i}"]) for i in indices],
        "rss_mb_end": [float(last[f"rss_mb_{i}"]) for i in indices],
        "rss_mb_max": [max(float(row[f"rss_mb_{i}"]) for row in base) for i in indices],
        "growth_max_pct": round(100 * max(point.values()), 2),
        "growth_max_pct_windowed": round(100 * max(windowed.values()), 2),
    }


def soak_report(out: Path, warmup: float) -> dict[str, Any]:
    """Recompute the soak's figures (and its plot) from ``soak.csv``."""
    import csv

    with (out / "soak.csv").open() as f:
        samples: list[dict[str, Any]] = [{k: float(v) for k, v in row.items()} for row in csv.DictReader(f)]
    indices = sorted(int(k.rsplit("_", 1)[1]) for k in samples[0] if k.startswith("rss_mb_"))
    write_soak_outputs(out, samples, indices, warmup)
    return soak_summary(samples, indices, warmup)


def write_soak_outputs(out: Path, samples: list[dict[str, Any]], indices: list[int], warmup: float) -> None:
    import csv

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    with (out / "soak.csv").open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(samples[0]))
        writer.writeheader()
        writer.writerows(samples)
    fig, ax = plt.subplots(figsize=(7, 3.5))
    for i in indices:
        ax.plot([s["t_s"] / 60 for s in samples], [s[f"rss_mb_{i}"] for s in samples], label=f"node-{i}")
    ax.axvline(warmup / 60, color="grey", linestyle=":", label="end of warm-up")
    ax.set_xlabel("minutes")
    ax.set_ylabel("RSS (MiB)")
    ax.set_title("3-daemon testnet soak: resident memory per daemon")
    ax.legend()
    fig.tight_layout()
    fig.savefig(out / "soak.png", dpi=120)


def spread_flood(out: Path, messages: int) -> dict[str, Any]:
    shutil.rmtree(out / "net", ignore_errors=True)
    nodes = start_testnet(4, out / "net", rounds=None, extra=FAST)
    try:
        wait_until(lambda: all(len(rounds_log(nd)) >= 4 for nd in nodes), 300, "four rounds everywhere")
        before = [row["seconds"] for nd in nodes for row in rounds_log(nd)[1:4]]
        script = Path(__file__).resolve().parent / "spread_flooder.py"
        progress(f"flooding {messages} messages over rounds to come")
        cmd = [sys.executable, str(script), str(out / "flooder"), "testnet", str(messages), "8"]
        flooder = subprocess.Popen(
            [*cmd, *(tcp_address(nd) for nd in nodes)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        assert flooder.stdout is not None
        started = flooder.stdout.readline()  # "flooding from <peer> at round <r>": its start-up is over
        marks = [len(rounds_log(nd)) for nd in nodes]
        stdout, stderr = flooder.communicate(timeout=1800)
        lines = [started, *stdout.splitlines()]
        attacker = next((ln.split()[2] for ln in lines if ln.startswith("flooding")), "")
        sent_line = next((ln for ln in lines if ln.startswith("SENT")), "SENT 0 1")
        _, sent, elapsed = sent_line.split()[:3]
        wait_until(lambda: all(len(rounds_log(nd)) >= m + 3 for nd, m in zip(nodes, marks, strict=True)), 600, "rounds")
        during = [row["seconds"] for nd, m in zip(nodes, marks, strict=True) for row in rounds_log(nd)[m : m + 3]]
        statuses = [nd.status() or {} for nd in nodes]
    finally:
        stop_nodes(nodes)
    blacklisted = sum(attacker in s.get("blacklisted_peers", []) for s in statuses)
    refused = [s.get("rejected_by_peer_reason", {}).get(attacker, {}).get("future_round", 0) for s in statuses]
    dropped = [s.get("round_rejections_by_peer_reason", {}).get(attacker, {}).get("future_round", 0) for s in statuses]
    return {
        "scenario": "spread-flood",
        "flooder": attacker,
        "messages": messages,
        "sent": int(sent),
        "seconds_flooding": float(elapsed),
        "round_s_before_median": statistics.median(before),
        "round_s_flood_median": statistics.median(during),
        "round_s_flood_max": max(during),
        "ratio_median": statistics.median(during) / statistics.median(before),
        "blacklisted_at": f"{blacklisted}/{len(nodes)}",
        "refused_in_gossipsub_future_round": refused,
        "dropped_on_arrival_future_round": dropped,
        "flooder_stderr_tail": stderr[-500:],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("scenario", choices=["sigstop", "sigkill", "flood", "spread-flood", "soak", "soak-report"])
    parser.add_argument("--messages", type=int, default=2000, help="spread-flood: messages, 8 per round")
    parser.add_argument("--out", type=Path, default=Path("runs/reliability"))
    parser.add_argument("--frozen-rounds", type=int, default=6)
    parser.add_argument("--kills", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--flood-seconds", type=float, default=15.0)
    parser.add_argument("--minutes", type=float, default=30.0)
    parser.add_argument("--every", type=float, default=30.0)
    parser.add_argument("--warmup", type=float, default=120.0)
    args = parser.parse_args()
    out = args.out / args.scenario
    out.mkdir(parents=True, exist_ok=True)
    if args.scenario == "sigstop":
        result = sigstop(out, args.frozen_rounds)
    elif args.scenario == "sigkill":
        result = sigkill(out, args.kills, args.seed)
    elif args.scenario == "flood":
        result = flood(out, args.flood_seconds)
    elif args.scenario == "spread-flood":
        result = spread_flood(out, args.messages)
    elif args.scenario == "soak-report":
        out = args.out / "soak"
        result = soak_report(out, args.warmup)
    else:
        result = soak(out, args.minutes, args.every, args.warmup)
    (out / f"{args.scenario}.json").write_text(json.dumps(result, indent=2))
    print(json.dumps({k: v for k, v in result.items() if k not in ("rows", "flooder_stderr_tail")}, indent=2))


if __name__ == "__main__":
    main()
