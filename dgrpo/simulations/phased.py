"""A lock-step round for every node at once, phase by phase: the simulations' round.

The daemon's round (:func:`dgrpo.round.run.run_round`) is three phases: produce (generate and publish),
collect (wait for the peers' rollouts) and consume (admit, defend, score, update). Here each phase runs for
all nodes together before the next starts, so that every node's torch work of a phase meets the others' in
the :class:`~dgrpo.simulations.pool.LearnerPool`. A node waiting for the network never holds the pool up: it
is in the pool only during a phase's worker call (an attacker's extra generation in the produce phase, for
one, runs while the honest nodes have finished theirs, not while they wait for its rollouts). Without a pool
(``engine.batched = false``) the same phases run the nodes' torch work one job at a time.

Between produce and collect every node's inbox takes in what has been delivered (:func:`drained`), so a
round's counts do not depend on the order the scheduler ran the nodes in.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Sequence

import trio
import trio.testing

from dgrpo.protocol.messages import Rollout
from dgrpo.round.outcome import RoundOutcome
from dgrpo.round.run import Collected, collect_phase, consume_phase, produce_phase
from dgrpo.simulations.pool import LearnerPool
from dgrpo.simulations.sim_node import SimNode


async def _each(
    nodes: Sequence[SimNode], pool: LearnerPool | None, fn: Callable[[int, SimNode], Awaitable[None]]
) -> None:
    """``fn`` for every node at once; each node is in the pool from the start until its call returns."""

    async def one(i: int, sim: SimNode) -> None:
        try:
            await fn(i, sim)
        finally:
            if pool is not None:
                pool.leave(sim.node.learner)

    if pool is not None:
        for sim in nodes:
            pool.enter(sim.node.learner)
    async with trio.open_nursery() as nursery:
        for i, sim in enumerate(nodes):
            nursery.start_soon(one, i, sim)


async def produce_all(
    nodes: Sequence[SimNode], round_idx: int, pool: LearnerPool | None, limiter: trio.CapacityLimiter
) -> list[list[Rollout]]:
    own: list[list[Rollout]] = [[] for _ in nodes]

    async def produce(i: int, sim: SimNode) -> None:
        own[i] = await produce_phase(sim.node, sim.transport, sim.inbox, round_idx, limiter)

    await _each(nodes, pool, produce)
    return own


async def drained() -> None:
    """Let every node's inbox pump take in what its transport has validated so far (every other task of the
    loop runs until it blocks): a round then closes with everything delivered before it (a blacklisted
    author's rollouts included, which the admit stage counts), whichever order the scheduler runs the pumps
    in, and so do both engines."""
    await trio.testing.wait_all_tasks_blocked()


async def collect_all(
    nodes: Sequence[SimNode], round_idx: int, expected: Sequence[list[str]], deadline_seconds: float
) -> list[Collected]:
    await drained()
    collected: list[Collected | None] = [None] * len(nodes)

    async def collect(i: int, sim: SimNode) -> None:
        collected[i] = await collect_phase(sim.inbox, round_idx, expected[i], deadline_seconds)

    await _each(nodes, None, collect)
    return [c for c in collected if c is not None]


async def consume_all(
    nodes: Sequence[SimNode],
    round_idx: int,
    own: Sequence[list[Rollout]],
    collected: Sequence[Collected],
    t0: float,
    pool: LearnerPool | None,
    limiter: trio.CapacityLimiter,
) -> list[RoundOutcome]:
    outcomes: list[RoundOutcome | None] = [None] * len(nodes)

    async def consume(i: int, sim: SimNode) -> None:
        outcomes[i] = await consume_phase(sim.node, round_idx, own[i], collected[i], t0, limiter)

    await _each(nodes, pool, consume)
    return [o for o in outcomes if o is not None]


def expected_peers(sim: SimNode) -> list[str]:
    """The peers a node waits for: every other node it has not blacklisted (as the in-process engine)."""
    return [p for p in sim.transport.peers() if not sim.node.blacklisted(p)]


async def phased_round(
    nodes: Sequence[SimNode],
    round_idx: int,
    deadline_seconds: float,
    pool: LearnerPool | None,
    limiter: trio.CapacityLimiter | None = None,
) -> list[RoundOutcome]:
    """One round of every node, phase by phase (see the module docstring). Without a pool, ``limiter`` (one
    job at a time) runs the nodes' torch work one by one."""
    t0 = time.perf_counter()
    limiter = limiter or trio.CapacityLimiter(max(len(nodes), 1))
    expected = [expected_peers(sim) for sim in nodes]
    own = await produce_all(nodes, round_idx, pool, limiter)
    collected = await collect_all(nodes, round_idx, expected, deadline_seconds)
    return await consume_all(nodes, round_idx, own, collected, t0, pool, limiter)
