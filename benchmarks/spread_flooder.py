"""A flooder that spreads its messages over rounds to come: ``python benchmarks/spread_flooder.py STATE RUN_ID
MESSAGES PER_ROUND BOOTSTRAP...``.

It joins the run with an identity of its own, reads the network's round from the heartbeats, and publishes
``MESSAGES`` validly signed rollouts, ``PER_ROUND`` per round (within each round's quota: parts =
``PER_ROUND``) for the rounds from three ahead of the network's on, through the normal (paced) publish. Each is a
valid message; none is for a round any peer may publish yet. Receivers before issue 24 let every one through
gossipsub (and forwarded it), then dropped it on arrival (``future_round``, no evidence): never cut off. Prints
``flooding from <peer> at round <r>`` when it starts and ``SENT <n> <seconds>`` at the end. Used by
``tests/test_integration_faults.py`` and ``benchmarks/reliability_faults.py spread-flood``.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import trio

from dgrpo.net.gossip import GossipConfig, GossipError, GossipNode
from dgrpo.net.p2p import Libp2pTransport
from dgrpo.net.traversal_config import TraversalConfig
from dgrpo.protocol.envelope import Signer
from dgrpo.protocol.identity import Identity
from dgrpo.protocol.messages import DEFAULT_SAMPLING, Rollout
from dgrpo.protocol.nonce import NonceCounter
from dgrpo.protocol.validator import MessageValidator
from dgrpo.tasks.arith import ArithTask

AHEAD = 3  # the first round flooded: past what receivers keep (rounds_ahead, 2)


async def main(state: Path, run_id: str, messages: int, per_round: int, bootstrap: list[str]) -> None:
    state.mkdir(parents=True, exist_ok=True)
    ident = Identity.generate()
    signer = Signer(ident, run_id, NonceCounter(state / "nonce.json"))
    prompt = ArithTask().train_prompt(0)
    plain = TraversalConfig(use_relays=False, hole_punching=False)
    async with GossipNode.open(GossipConfig(bootstrap=tuple(bootstrap)), ident.to_libp2p_keypair(), plain) as gossip:
        transport = Libp2pTransport(gossip, signer, MessageValidator(run_id), run_id)
        async with trio.open_nursery() as nursery:
            await transport.start(nursery)
            await gossip.wait_for_peers(1, 60)
            with trio.move_on_after(20):
                while not any(p.rounds_done for p in transport.peer_table()):
                    await trio.sleep(0.2)
            network = max((p.round for p in transport.peer_table()), default=1)
            print(f"flooding from {ident.peer_id} at round {network}", flush=True)
            sent, t0 = 0, time.time()
            for k in range(messages):
                rollout = Rollout(
                    author=ident.peer_id, round=network + AHEAD + k // per_round, part=k % per_round,
                    parts=per_round, prompt_id=prompt.id, prompt=prompt.text, completions=("1",), indices=(0,),
                    model_id="m", weights="", sampling=DEFAULT_SAMPLING, split="horizontal",
                )  # fmt: skip
                try:
                    await transport.publish(rollout)
                except GossipError:
                    break
                sent += 1
                if not gossip.connected_peers():  # every peer cut it off
                    break
            print(f"SENT {sent} {time.time() - t0:.2f}", flush=True)
            nursery.cancel_scope.cancel()


if __name__ == "__main__":
    args = sys.argv[1:]
    trio.run(main, Path(args[0]), args[1], int(args[2]), int(args[3]), args[4:])
