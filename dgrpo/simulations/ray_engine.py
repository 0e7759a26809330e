"""The Ray engine (``engine.name = "ray"``): a simulation's nodes spread over Ray actors, on a Ray started for
the run or an existing cluster (``engine.address``), for simulations that outgrow one process or one machine.

Each actor (:class:`NodeGroup`) holds a contiguous group of the nodes, built exactly as the in-process engine
builds them (same names, keys and seeds), on an in-memory network of its own that knows every node's name
and key. A round is the batched engine's phases (:mod:`dgrpo.simulations.phased`), driven from here:

1. every actor runs the produce phase for its nodes (generate, sign, deliver to its own nodes) and returns
   the signed envelopes its nodes published;
2. each actor receives every other actor's envelopes, which each of its nodes validates (signature, run,
   limits, replay window) as it would a gossiped message, then runs the collect and consume phases.

The outcomes come back to this process, whose observers (evaluation, defense meter, metrics rows) are the
in-process engine's; so are the results for the same seeds (``benchmarks/sim_engines.py`` prints both).
Workers must have this version of dgrpo installed (a cluster's nodes as well as this machine).
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch
import trio

from dgrpo.net.memory import InMemoryNetwork, simulated_identity
from dgrpo.protocol.limits import Limits
from dgrpo.round.observer import RoundObserver, notify
from dgrpo.round.outcome import RoundOutcome
from dgrpo.simulations.evaluation import EvalPoint
from dgrpo.simulations.nodes import attack_stats, build_evaluator, build_nodes, wire_stats
from dgrpo.simulations.phased import collect_all, consume_all, expected_peers, produce_all
from dgrpo.simulations.pool import LearnerPool
from dgrpo.simulations.scenario import Scenario
from dgrpo.simulations.sim_node import SimNode


class BridgedNetwork(InMemoryNetwork):
    """An actor's in-memory network: its own nodes as members, every other node of the run known by name and
    key; what its members publish is also kept for the other actors (:meth:`take_outbox`)."""

    def __init__(self, run_id: str, limits: Limits, names: Sequence[str]) -> None:
        super().__init__(run_id, limits)
        self._remote = set(names)
        for name in names:
            self._names[simulated_identity(run_id, name).public_bytes] = name
        self._outbox: list[bytes] = []

    def join(self, name: str, identity: Any = None) -> Any:
        self._remote.discard(name)
        return super().join(name, identity)

    def deliver(self, sender: str, data: bytes) -> None:
        super().deliver(sender, data)
        self._outbox.append(data)

    def deliver_remote(self, data: bytes) -> None:
        """Bytes published on another actor: every member validates them."""
        self.inject(data)

    def members(self) -> set[str]:
        return super().members() | self._remote

    def take_outbox(self) -> list[bytes]:
        out, self._outbox = self._outbox, []
        return out


class NodeGroup:
    """A Ray actor's nodes (see the module docstring). Their inboxes are pumped by a trio loop in a thread of
    the actor; the driver's calls run the phases on that loop."""

    def __init__(self, scenario: Scenario, indices: list[int]) -> None:
        if scenario.torch_threads:
            torch.set_num_threads(scenario.torch_threads)
        self.scenario = scenario
        names = [f"node-{i}" for i in range(scenario.nodes.count)]
        self.network = BridgedNetwork(scenario.run_id, scenario.limits, names)
        self.nodes: list[SimNode] = build_nodes(scenario, indices, self.network)
        batched = scenario.engine.batched and len(self.nodes) > 1
        self.pool = LearnerPool(sim.node.learner for sim in self.nodes) if batched else None
        self.evaluator = build_evaluator(scenario, self.nodes[0].node.task, self.nodes)
        self._own: list[Any] = []
        self._expected: list[list[str]] = []
        self._t0 = 0.0
        self._ready = threading.Event()
        self._token: trio.lowlevel.TrioToken | None = None
        self._stop: trio.Event | None = None
        self._thread = threading.Thread(target=trio.run, args=(self._main,), daemon=True)
        self._thread.start()
        if not self._ready.wait(60):
            raise RuntimeError("the node group's trio loop did not start")

    async def _main(self) -> None:
        self._token = trio.lowlevel.current_trio_token()
        self._stop = trio.Event()
        async with trio.open_nursery() as pumps:
            for sim in self.nodes:
                pumps.start_soon(sim.inbox.pump, sim.transport.inbound())
            self._ready.set()
            await self._stop.wait()
            pumps.cancel_scope.cancel()

    def _call(self, fn: Any, *args: Any) -> Any:
        return trio.from_thread.run(fn, *args, trio_token=self._token)

    def produce(self, round_idx: int) -> list[bytes]:
        """The produce phase of this group's nodes; returns the envelopes they published."""
        self._t0 = time.perf_counter()
        self._expected = [expected_peers(sim) for sim in self.nodes]

        async def go() -> list[Any]:
            limiter = trio.CapacityLimiter(len(self.nodes))
            return await produce_all(self.nodes, round_idx, self.pool, limiter)

        self._own = self._call(go)
        return self.network.take_outbox()

    def consume(self, round_idx: int, envelopes: list[bytes]) -> list[RoundOutcome]:
        """Deliver the other groups' envelopes, then the collect and consume phases of this group's nodes."""

        async def go() -> list[RoundOutcome]:
            for data in envelopes:
                self.network.deliver_remote(data)
            limiter = trio.CapacityLimiter(len(self.nodes))
            collected = await collect_all(self.nodes, round_idx, self._expected, self.scenario.round.deadline_seconds)
            return await consume_all(self.nodes, round_idx, self._own, collected, self._t0, self.pool, limiter)

        result: list[RoundOutcome] = self._call(go)
        return result

    def eval_points(self) -> list[EvalPoint]:
        return self.evaluator.node_points(self.nodes)

    def stats(self) -> dict[str, Any]:
        return {
            "attack": attack_stats(self.nodes),
            "wire": wire_stats(self.nodes),
            "batched": self.pool.stats.as_dict() if self.pool is not None else None,
        }

    def close(self) -> None:
        if self._token is not None and self._stop is not None:
            trio.from_thread.run_sync(self._stop.set, trio_token=self._token)
        self._thread.join(timeout=30)


def groups_of(count: int, workers: int) -> list[list[int]]:
    """Node indices split into ``workers`` contiguous groups of sizes differing by at most one."""
    workers = max(1, min(workers, count))
    base, extra = divmod(count, workers)
    out, start = [], 0
    for w in range(workers):
        size = base + (1 if w < extra else 0)
        out.append(list(range(start, start + size)))
        start += size
    return out


class RayEngine:
    """The driver side: starts or joins Ray, places one :class:`NodeGroup` actor per group and runs the rounds."""

    def __init__(self, scenario: Scenario) -> None:
        try:
            import ray
        except ImportError as exc:  # pragma: no cover - the extra is installed in CI
            raise RuntimeError("engine.name = 'ray' needs the ray extra: pip install 'dgrpo[ray]'") from exc
        self.ray = ray
        self.scenario = scenario
        engine = scenario.engine
        self._started = False
        if not ray.is_initialized():
            os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
            os.environ.setdefault("RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO", "0")  # no GPUs asked for: no warning
            common: dict[str, Any] = {
                "include_dashboard": False,
                "log_to_driver": False,
                "logging_level": logging.ERROR,
            }
            if engine.address:
                ray.init(address=engine.address, **common)
            else:
                cpus = max(1, int(engine.workers * engine.cpus_per_worker + 0.999))
                ray.init(num_cpus=cpus, **common)
            self._started = True
        self.groups = groups_of(scenario.nodes.count, engine.workers)
        actor = ray.remote(num_cpus=engine.cpus_per_worker)(NodeGroup)
        self.actors: list[Any] = [actor.remote(scenario, group) for group in self.groups]
        self.nodes: list[SimNode] = []  # the evaluator reads the actors instead

    def eval_points(self) -> list[EvalPoint]:
        points: list[list[EvalPoint]] = self.ray.get([a.eval_points.remote() for a in self.actors])
        return [p for group in points for p in group]

    name = "ray"

    def run(self, observers: Sequence[RoundObserver], rounds: range, between: Callable[[int], bool]) -> None:
        ray = self.ray
        for round_idx in rounds:
            published: list[list[bytes]] = ray.get([a.produce.remote(round_idx) for a in self.actors])
            calls = []
            for i, a in enumerate(self.actors):
                others = [data for j, group in enumerate(published) if j != i for data in group]
                calls.append(a.consume.remote(round_idx, others))
            results: list[list[RoundOutcome]] = ray.get(calls)
            notify(observers, round_idx, [o for group in results for o in group])
            if between(round_idx):
                break

    def _stats(self) -> list[dict[str, Any]]:
        stats: list[dict[str, Any]] = self.ray.get([a.stats.remote() for a in self.actors])
        return stats

    def attack_stats(self) -> dict[str, int]:
        return _summed([s["attack"] for s in self._stats()])

    def wire_stats(self) -> dict[str, Any]:
        return _summed([s["wire"] for s in self._stats()])

    def info(self) -> dict[str, Any]:
        batched = [s["batched"] for s in self._stats() if s["batched"] is not None]
        return {
            "name": "ray",
            "workers": len(self.actors),
            "groups": [len(g) for g in self.groups],
            "address": self.scenario.engine.address,
            "batched": _summed(batched) if batched else None,
        }

    def close(self) -> None:
        ray = self.ray
        for a in getattr(self, "actors", []):
            with contextlib.suppress(Exception):  # an actor that died is gone already
                ray.get(a.close.remote(), timeout=30)
            ray.kill(a)
        if self._started:
            ray.shutdown()


def _summed(parts: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Counters in nested dicts, added up."""
    out: dict[str, Any] = {}
    for part in parts:
        for key, value in part.items():
            if isinstance(value, dict):
                out[key] = _summed([out.get(key, {}), value])
            else:
                out[key] = out.get(key, 0) + value
    return out
