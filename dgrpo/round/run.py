"""One round over a transport: the one function the daemon and every simulation run for each node and round.

generate (worker thread) -> publish -> receive until quorum or deadline -> consume (worker thread: admit,
defend, score, advantages, update). Heavy torch work runs in worker threads so the trio loop, and with it the
network, never stalls (shared notes on py-libp2p: a 2 s computation in the loop starved gossip).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import replace

import trio

from dgrpo.net.transport import Transport
from dgrpo.round.node import Node
from dgrpo.round.outcome import RoundOutcome
from dgrpo.round.receive import RoundInbox


async def run_round(
    node: Node,
    transport: Transport,
    inbox: RoundInbox,
    round_idx: int,
    expected_peers: Iterable[str],
    deadline_seconds: float,
    limiter: trio.CapacityLimiter | None = None,
    still_expected: Callable[[set[str]], set[str]] | None = None,
) -> RoundOutcome:
    """Run one round for ``node``. The round closes when every expected peer has delivered, or at the
    deadline (counted from the end of our own generation) with whatever arrived. ``still_expected`` narrows
    the expected peers during the round (peers that stopped, fell silent or disconnected: the daemon's)."""
    t0 = time.perf_counter()
    expected = set(expected_peers)
    inbox.open(round_idx)
    own = await trio.to_thread.run_sync(node.produce, round_idx, limiter=limiter)
    for rollout in own:
        await transport.publish(rollout)
    with trio.move_on_after(deadline_seconds) as deadline:
        await inbox.wait_complete(round_idx, expected, still_expected)
    departed = set() if still_expected is None else expected - still_expected(expected)
    received = inbox.take(round_idx)
    # Shielded: once the update starts, a shutdown waits for it, so the caller learns the round happened and
    # a checkpoint never pairs updated weights with an old round number.
    with trio.CancelScope(shield=True):
        outcome = await trio.to_thread.run_sync(node.consume, round_idx, [*own, *received], limiter=limiter)
    return replace(
        outcome,
        round_seconds=time.perf_counter() - t0,
        expected=tuple(sorted(expected)),
        departed=tuple(sorted(departed)),
        at_deadline=deadline.cancelled_caught,
    )
