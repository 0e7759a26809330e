"""Assembling a node from a run configuration: the one builder of the daemon and of the simulation runner."""

from __future__ import annotations

from dgrpo.adversary import build_adversary
from dgrpo.config import AdversaryConfig, ModelConfig, RolloutConfig, RunConfig
from dgrpo.defense import DefenseChain, Reputation
from dgrpo.learner.learner import Learner
from dgrpo.round.node import Node
from dgrpo.tasks.base import Task


def build_node(
    run: RunConfig,
    peer_id: str,
    run_id: str,
    task: Task,
    *,
    model: ModelConfig | None = None,
    rollout: RolloutConfig | None = None,
    adversary: AdversaryConfig | None = None,
    defended: bool = True,
    secret: bytes | None = None,
) -> Node:
    """A node of ``run`` named ``peer_id``.

    ``task``: shared by the nodes of a process (one sandbox, one math-verify worker). ``model`` and
    ``rollout`` replace the run's own (a heterogeneous simulation's per-node model; a scenario's per-node
    share of the global batch). ``adversary``: the attack this node runs, if any. ``defended``: whether the
    run's defense chain (if it has one) filters what this node trains on. ``secret``: the node's private
    randomness for the draw stage (a daemon's from its identity key).
    """
    defense = DefenseChain.from_config(run.defense) if defended and run.defense.chain else None
    return Node(
        peer_id,
        run_id,
        task,
        Learner(model or run.model, run.learner, run.lr_rounds()),
        rollout or run.rollout,
        run.sampling,
        build_adversary(adversary) if adversary is not None else None,
        defense,
        Reputation(run.defense.reputation) if defense is not None else None,
        run.limits,
        secret,
    )
