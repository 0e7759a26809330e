"""One round over a transport: the one function the daemon and every simulation run for each node and round.

generate (worker thread) -> publish -> receive until quorum or deadline -> consume (worker thread: admit,
defend, score, advantages, update). Heavy torch work runs in worker threads so the trio loop, and with it the
network, never stalls (shared notes on py-libp2p: a 2 s computation in the loop starved gossip).
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from typing import Protocol, TypeVar

import trio

from dgrpo.protocol.messages import Rollout
from dgrpo.round.fill import FillTracker
from dgrpo.round.node import Node
from dgrpo.round.outcome import Admitted, RoundOutcome
from dgrpo.round.receive import RoundInbox

_T = TypeVar("_T")


class Transport(Protocol):
    """What a round needs of a network: to publish the node's rollouts (what it receives arrives through the
    inbox). Met by :class:`dgrpo.net.transport.Transport`: the round is below the network, which carries it."""

    async def publish(self, rollout: Rollout) -> None: ...


async def run_round(
    node: Node,
    transport: Transport,
    inbox: RoundInbox,
    round_idx: int,
    expected_peers: Iterable[str],
    deadline_seconds: float,
    limiter: trio.CapacityLimiter | None = None,
    still_expected: Callable[[set[str]], set[str]] | None = None,
    slowdown: float = 1.0,
) -> RoundOutcome:
    """Run one round for ``node``. The round closes when every expected peer has delivered, or at the
    deadline (counted from the end of our own generation) with whatever arrived. ``still_expected`` narrows
    the expected peers during the round (peers that stopped, fell silent or disconnected: the daemon's).

    Its three phases are also called one by one, each for every node at once, by the simulations' batched
    engine (:mod:`dgrpo.simulations.phased`)."""
    t0 = time.perf_counter()
    own = await produce_phase(node, transport, inbox, round_idx, limiter, slowdown)
    collected = await collect_phase(inbox, round_idx, expected_peers, deadline_seconds, still_expected)
    return await consume_phase(node, round_idx, own, collected, t0, limiter, slowdown)


@dataclass(frozen=True)
class Collected:
    """What the wait for peers ended with."""

    received: list[Rollout]
    expected: set[str]
    departed: set[str]
    at_deadline: bool


async def produce_phase(
    node: Node,
    transport: Transport,
    inbox: RoundInbox,
    round_idx: int,
    limiter: trio.CapacityLimiter | None = None,
    slowdown: float = 1.0,
) -> list[Rollout]:
    """Open the round's inbox, generate (worker thread) and publish; returns our own rollouts."""
    inbox.open(round_idx)
    own = await _timed(node.produce, round_idx, limiter=limiter, slowdown=slowdown)
    for rollout in own:
        await transport.publish(rollout)
    return own


async def collect_phase(
    inbox: RoundInbox,
    round_idx: int,
    expected_peers: Iterable[str],
    deadline_seconds: float,
    still_expected: Callable[[set[str]], set[str]] | None = None,
) -> Collected:
    """Wait until every expected peer has delivered, or the deadline; take what arrived."""
    expected = set(expected_peers)
    with trio.move_on_after(deadline_seconds) as deadline:
        await inbox.wait_complete(round_idx, expected, still_expected)
    departed = set() if still_expected is None else expected - still_expected(expected)
    return Collected(inbox.take(round_idx), expected, departed, deadline.cancelled_caught)


async def consume_phase(
    node: Node,
    round_idx: int,
    own: list[Rollout],
    collected: Collected,
    t0: float,
    limiter: trio.CapacityLimiter | None = None,
    slowdown: float = 1.0,
) -> RoundOutcome:
    """Admit, defend, score and update (worker thread) on our own and the received rollouts; ``t0``: when
    the round began."""
    # Shielded: once the update starts, a shutdown waits for it, so the caller learns the round happened and
    # a checkpoint never pairs updated weights with an old round number.
    with trio.CancelScope(shield=True):
        outcome = await _timed(node.consume, round_idx, [*own, *collected.received], limiter=limiter, slowdown=slowdown)
    return replace(
        outcome,
        round_seconds=time.perf_counter() - t0,
        expected=tuple(sorted(collected.expected)),
        departed=tuple(sorted(collected.departed)),
        at_deadline=collected.at_deadline,
    )


async def run_step(
    node: Node,
    transport: Transport,
    inbox: RoundInbox,
    round_idx: int,
    limiter: trio.CapacityLimiter | None = None,
    slowdown: float = 1.0,
    fill: FillTracker | None = None,
) -> RoundOutcome:
    """One step of async mode (``rollout.mode = "async"``): generate and publish, then train at once on our own
    completions and every peer's complete rollouts of rounds ``round_idx - S .. round_idx`` that have arrived
    (:meth:`RoundInbox.drain`); nothing is waited for. A late peer's rollouts count in the step where they
    arrive, as long as they are at most S rounds old. ``fill`` (``rollout.async_fill``): where peers delivered
    fewer completions than in a full recent step, the node generates the difference itself (:mod:`dgrpo.round.fill`)."""
    t0 = time.perf_counter()
    # opening the round drops what is older than the window, counted as closed_round
    own = await produce_phase(node, transport, inbox, round_idx, limiter, slowdown)
    received = inbox.drain(round_idx, node.rollout.async_rounds_per_peer)
    local: list[Admitted] = []
    if fill is not None:  # rollout.async_fill: a step short of its peers' completions fills up with our own
        delivered: Counter[str] = Counter()
        for r in received:
            delivered[r.author] += len(r.completions)
        share = node.rollout.prompts_per_round * node.rollout.completions_per_prompt
        deficit = fill.deficit(delivered, share)
        if deficit > 0:
            local = await _timed(node.fill, round_idx, deficit, limiter=limiter, slowdown=slowdown)
    with trio.CancelScope(shield=True):
        outcome = await _timed(node.consume, round_idx, [*own, *received], local, limiter=limiter, slowdown=slowdown)
    return replace(outcome, round_seconds=time.perf_counter() - t0)


async def _timed(fn: Callable[..., _T], *args: object, limiter: trio.CapacityLimiter | None, slowdown: float) -> _T:
    """``fn(*args)`` in a worker thread; with ``slowdown`` > 1 (the ``--slow`` fault) it then waits
    ``slowdown - 1`` times as long as the call took, as a machine that many times slower would (without
    taking the CPU from the other nodes of a test on one machine)."""
    t0 = time.perf_counter()
    result = await trio.to_thread.run_sync(fn, *args, limiter=limiter)
    if slowdown > 1.0:
        await trio.sleep((slowdown - 1.0) * (time.perf_counter() - t0))
    return result
