"""A simulation's nodes: built on an in-memory network over the real wire format, evaluated, and counted
(what both engines, in-process and Ray, share)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

from dgrpo.adversary import build_adversary
from dgrpo.net.memory import InMemoryNetwork
from dgrpo.round.build import build_node
from dgrpo.round.receive import RoundInbox
from dgrpo.simulations.evaluation import EvalPoint, Evaluator
from dgrpo.simulations.scenario import Scenario
from dgrpo.simulations.sim_node import SimNode
from dgrpo.tasks import get_task
from dgrpo.tasks.base import Task


def build_nodes(
    scenario: Scenario, indices: Sequence[int] | None = None, network: InMemoryNetwork | None = None
) -> list[SimNode]:
    """The scenario's nodes (``indices`` of them: all by default), on one in-memory network over the real wire
    format; the last ``nodes.malicious`` of them run the adversary (and no defense unless
    ``adversary.in_sync``), the others the defense."""
    network = network or InMemoryNetwork(scenario.run_id, scenario.limits)
    rollout = scenario.node_rollout()
    task = get_task(scenario.task.name, **scenario.task.options)
    first_malicious = scenario.nodes.count - scenario.nodes.malicious
    nodes = []
    for i in range(scenario.nodes.count) if indices is None else indices:
        peer_id = f"node-{i}"
        attack = None
        if i >= first_malicious and scenario.adversary is not None:
            attack = scenario.adversary.model_copy(update={"seed": scenario.adversary.seed + i})
        node = build_node(
            scenario,
            peer_id,
            scenario.run_id,
            task,
            model=scenario.node_model(i),
            rollout=rollout,
            adversary=attack,
            defended=attack is None or attack.in_sync,
        )
        inbox = RoundInbox(node.admitter)
        nodes.append(SimNode(node, network.join(peer_id), inbox, honest=attack is None))
    return nodes


def build_evaluator(
    scenario: Scenario,
    task: Task,
    nodes: list[SimNode] | None = None,
    source: Callable[[], list[EvalPoint]] | None = None,
) -> Evaluator:
    detector = None
    asr_prompts = None
    if scenario.adversary is not None:
        detector = build_adversary(scenario.adversary).detector(task)
        asr_prompts = detector.eval_prompts(task, scenario.eval.asr_prompts)
    return Evaluator(
        task.eval_prompts(scenario.eval.prompts),
        detector,
        asr_prompts,
        greedy=scenario.eval.greedy,
        seed=scenario.eval.seed,
        dedupe=scenario.nodes.mode == "homogeneous",
        nodes=nodes or [],
        every=scenario.eval.every,
        last=scenario.rounds,
        source=source,
    )


def wire_stats(nodes: list[SimNode]) -> dict[str, Any]:
    """What the nodes' validators and the admit stage accepted, rejected and dropped (every drop visible)."""
    rejected: Counter[str] = Counter()
    dropped: Counter[str] = Counter()
    admission: Counter[str] = Counter()
    accepted = 0
    for sim in nodes:
        stats = sim.transport.statistics()
        accepted += stats.accepted
        rejected.update(stats.rejected_by_reason)
        dropped.update(stats.dropped)
        admission.update(sim.node.admitter.statistics().rejected_by_reason)
    return {
        "messages_accepted": accepted,
        "messages_rejected": dict(rejected),
        "dropped": dict(dropped),
        "admission_rejected": dict(admission),
    }


def attack_stats(nodes: list[SimNode]) -> dict[str, int]:
    total: dict[str, int] = {}
    for sim in nodes:
        if sim.node.adversary is not None:
            for key, value in sim.node.adversary.stats.as_dict().items():
                total[key] = total.get(key, 0) + value
    return total
