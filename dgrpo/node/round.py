"""The round: the one function the daemon and every simulation run for each node and round.

generate (worker thread) -> publish -> collect until quorum or deadline -> consume (worker thread:
validate, defenses, reward, advantages, update). Heavy torch work runs in worker threads so the trio loop,
and with it the network, never stalls (shared notes on py-libp2p: a 2 s computation in the loop starved
gossip).
"""

from __future__ import annotations

from collections.abc import Iterable

import trio

from dgrpo.node.inbox import RoundInbox
from dgrpo.node.node import Node, RoundReport
from dgrpo.node.transport import Transport


async def run_round(
    node: Node,
    transport: Transport,
    inbox: RoundInbox,
    round_idx: int,
    expected_peers: Iterable[str],
    deadline_seconds: float,
    limiter: trio.CapacityLimiter | None = None,
) -> RoundReport:
    """Run one round for ``node``. The round closes when every expected peer has delivered, or at the
    deadline (counted from the end of our own generation) with whatever arrived."""
    inbox.open(round_idx)
    own = await trio.to_thread.run_sync(node.produce, round_idx, limiter=limiter)
    for rollout in own:
        await transport.publish(rollout)
    with trio.move_on_after(deadline_seconds):
        await inbox.wait_complete(round_idx, expected_peers)
    received = inbox.take(round_idx)
    # Shielded: once the update starts, a shutdown waits for it, so the caller learns the round happened and
    # a checkpoint never pairs updated weights with an old round number.
    with trio.CancelScope(shield=True):
        return await trio.to_thread.run_sync(node.consume, round_idx, [*own, *received], limiter=limiter)
