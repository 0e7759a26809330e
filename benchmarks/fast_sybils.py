"""Sybils that publish on time: ``python benchmarks/fast_sybils.py MANIFEST OUT SYBILS SECONDS BOOTSTRAP...``.

The Sybil daemons of ``benchmarks/sybil.py`` are full nodes: 50 of them in one process on 2 cores generate,
verify and train every round, fall behind the honest network and publish for rounds it has closed, so they
never reach an honest node's draw. An attacker would do none of that work. This process holds ``SYBILS`` fresh
identities, each its own libp2p host and key, and no model at work: it reads the network's round from the honest
rollouts it hears and writes each Sybil's junk for that round and the next ``rounds_ahead`` (validly signed, on
the prompts of the Sybil's plan, the run's sampling with the Sybil's seed, zero-reward random text, the base
model's name and weights digest), publishing the coming rounds' before they start (receivers keep those until
they open). One Sybil listens; the others only publish (subscribed to nothing: no inbound gossip to keep up
with). Every Sybil heartbeats as a running node at the network's round. So the young cap is what stands between
them and the honest nodes' batches, not their slowness.

Writes ``OUT/sybils.json`` (the Sybils' peer ids) and prints ``SYBILS UP <round>`` once the first rounds'
rollouts are out, and ``PUBLISHED <rollouts> <rounds>`` at the end; stops by itself after ``SECONDS``. Used by
``benchmarks/sybil.py --fast``.
"""

from __future__ import annotations

import functools
import json
import random
import sys
import time
from contextlib import AsyncExitStack
from pathlib import Path

import trio

from dgrpo.adversary.gibberish import gibberish
from dgrpo.daemon.run_manifest import load_manifest, settings_from_manifest
from dgrpo.daemon.settings import NodeSettings
from dgrpo.net.gossip import GossipConfig, GossipError, GossipNode
from dgrpo.net.p2p import Libp2pTransport
from dgrpo.net.traversal_config import TraversalConfig
from dgrpo.protocol.envelope import HeartbeatBody, Signer
from dgrpo.protocol.identity import Identity
from dgrpo.protocol.messages import Rollout
from dgrpo.protocol.topics import control_topic, rollout_topic
from dgrpo.protocol.validator import MessageValidator
from dgrpo.round.build import build_node
from dgrpo.round.generate import plan, round_sampling
from dgrpo.tasks.base import Task
from dgrpo.tasks.registry import get_task

PLAIN = TraversalConfig(use_relays=False, hole_punching=False, reachability_interval=3600.0)
HEARTBEAT_SECONDS = 2.0


class Nonces:
    """A fresh identity's envelope nonces (nothing to persist: it never restarts)."""

    def __init__(self) -> None:
        self.value = 0

    def next(self) -> int:
        self.value += 1
        return self.value


class Junk:
    """Each Sybil's rollouts for a round, written without a model: the prompts of its plan, the run's sampling
    with its own seed, zero-reward random text (:func:`dgrpo.adversary.gibberish.gibberish`, checked against the
    task's reward), the base model's name and weights digest (what a fresh node announces)."""

    def __init__(self, settings: NodeSettings, run_id: str, task: Task, model_id: str, weights: str) -> None:
        self.settings, self.run_id, self.task = settings, run_id, task
        self.model_id, self.weights = model_id, weights
        self.rng = random.Random(0)

    def rollouts(self, peer_id: str, round_idx: int) -> list[Rollout]:
        cfg, n = self.settings.rollout, self.settings.rollout.completions_per_prompt
        prompts = plan(self.task, cfg, self.run_id, peer_id, round_idx)
        params = round_sampling(self.settings.sampling, self.run_id, peer_id, round_idx)
        out = []
        for i, p in enumerate(prompts):
            texts = gibberish(self.rng, [], n, functools.partial(self.task.rewards, p))
            rollout = Rollout(
                author=peer_id, round=round_idx, part=i, parts=len(prompts), prompt_id=p.id, prompt=p.text,
                completions=tuple(texts), indices=tuple(range(len(texts))), model_id=self.model_id,
                weights=self.weights, sampling=params, split=cfg.split,
            )  # fmt: skip
            out.append(rollout)
        return out


async def watch(channel: trio.MemoryReceiveChannel[Rollout], sybils: set[str], network: list[int]) -> None:
    """The network's round, from the honest rollouts heard (heartbeats come every few seconds; rounds of the
    tiny model take a fraction of one)."""
    async for rollout in channel:
        if rollout.author not in sybils and rollout.round > network[0]:
            network[0] = rollout.round


async def main(manifest_path: Path, out: Path, count: int, seconds: float, bootstrap: list[str]) -> None:
    signed = load_manifest(manifest_path)
    assert signed is not None, f"no run manifest at {manifest_path}"
    run_id = signed.manifest.run_id
    settings = settings_from_manifest(signed.manifest, [])
    task = get_task(settings.task.name, **settings.task.options)
    learner = build_node(settings, "sybil", run_id, task, defended=False).learner  # only its name and digest
    junk = Junk(settings, run_id, task, learner.model_id, learner.weights_digest())
    identities = [Identity.generate() for _ in range(count)]
    sybil_ids = {i.peer_id for i in identities}
    published = rounds = 0
    ahead = settings.limits.rounds_ahead
    with trio.move_on_after(seconds):
        async with trio.open_nursery() as nursery, AsyncExitStack() as stack:
            hosts: list[tuple[str, GossipNode, Signer]] = []
            for identity in identities:
                cfg = GossipConfig(bootstrap=tuple(bootstrap))
                gossip = await stack.enter_async_context(GossipNode.open(cfg, identity.to_libp2p_keypair(), PLAIN))
                hosts.append((identity.peer_id, gossip, Signer(identity, run_id, Nonces())))
            # One Sybil listens (the network's round); the others only publish: subscribed to nothing, they
            # cost no inbound gossip, and gossipsub sends their messages to the topic's peers (fanout).
            listener = Libp2pTransport(hosts[0][1], hosts[0][2], MessageValidator(run_id), run_id)
            await listener.start(nursery)
            network = [0]
            nursery.start_soon(watch, listener.inbound(), sybil_ids, network)
            done: set[int] = set()
            last_beat = 0.0
            while True:
                heard = (p.round for p in listener.peer_table() if p.peer_id not in sybil_ids)
                current = max([network[0], *heard])
                if time.monotonic() - last_beat >= HEARTBEAT_SECONDS:
                    last_beat = time.monotonic()
                    for _, gossip, signer in hosts:
                        body = HeartbeatBody(
                            round=current, rounds_done=max(current - 1, 0), status="running",
                            listen_addrs=tuple(gossip.local_addrs()[:1]),
                        )  # fmt: skip
                        with trio.move_on_after(1):
                            await gossip.publish(control_topic(run_id), signer.sign_heartbeat(body, current))
                # this round (if not done yet) and the next ones receivers keep (rounds_ahead), before they start
                for target in range(current, current + ahead + 1) if current else ():
                    if target in done:
                        continue
                    done.add(target)
                    rounds += 1
                    for peer_id, gossip, signer in hosts:
                        for rollout in junk.rollouts(peer_id, target):
                            try:
                                await gossip.publish(rollout_topic(run_id), signer.sign_rollout(rollout))
                                published += 1
                            except GossipError:
                                pass
                    if rounds == ahead + 1:  # the first rounds are out: measured from here
                        (out / "sybils.json").write_text(json.dumps(sorted(sybil_ids)))
                        print(f"SYBILS UP {target}", flush=True)
                await trio.sleep(0.05)
    print(f"PUBLISHED {published} {rounds}", flush=True)


if __name__ == "__main__":
    args = sys.argv[1:]
    trio.run(main, Path(args[0]), Path(args[1]), int(args[2]), float(args[3]), args[4:])
