"""A simulation scenario: typed, loaded from TOML, overridable with ``key=value`` pairs.

Unknown keys are errors that list the valid keys of their section.
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field, ValidationError, model_validator

from dgrpo.config import SAME_MODEL_DEFENSES, ModelConfig, RolloutConfig, RunConfig, Section
from dgrpo.errors import ConfigError
from dgrpo.overrides import apply_overrides, explain_validation_error

SCENARIO_DIR = Path(__file__).resolve().parent / "scenarios"


class NodesConfig(Section):
    count: Annotated[int, Field(ge=1, le=64, description="number of nodes (m)")] = 4
    mode: Annotated[
        Literal["homogeneous", "heterogeneous"],
        Field(description="homogeneous: one model, identical weights; heterogeneous: models[] per node"),
    ] = "homogeneous"
    models: list[str] = Field(
        default_factory=lambda: ["dgrpo:tiny-arith", "dgrpo:tiny-arith-llama"],
        description="heterogeneous: model names, assigned to nodes round-robin",
    )
    malicious: Annotated[
        int, Field(ge=0, description="how many nodes run the [adversary] (the last ones: node-<count-1>, ...)")
    ] = 0

    @model_validator(mode="after")
    def _some_honest(self) -> NodesConfig:
        if self.malicious >= self.count:
            raise ValueError(f"malicious ({self.malicious}) must leave at least one honest node of {self.count}")
        return self


class RoundsConfig(Section):
    """The paper's global batch (sec. 3): B prompts, G completions each, over all nodes. Each node's share
    (``rollout.prompts_per_round``, ``rollout.completions_per_prompt``) follows from them and the split."""

    prompts_per_round: Annotated[int, Field(ge=1, description="B: prompts per round, over all nodes")] = 8
    group_size: Annotated[int, Field(ge=1, description="G: completions per prompt, over all nodes")] = 8
    deadline_seconds: Annotated[float, Field(gt=0, description="a round closes at quorum or this")] = 600.0


class EvalConfig(Section):
    every: Annotated[int, Field(ge=1, description="evaluate every k rounds (and at the start and end)")] = 5
    asr_prompts: Annotated[
        int, Field(ge=1, description="held-out prompts for the ASR when the detector picks its own (math)")
    ] = 128
    prompts: Annotated[int, Field(ge=1, description="held-out prompts per evaluation")] = 128
    greedy: Annotated[bool, Field(description="greedy decoding instead of the run's sampling")] = False
    seed: Annotated[int, Field(ge=0, description="sampling seed of evaluations")] = 1234


class EngineConfig(Section):
    """How the simulation's nodes run (docs/simulations.md, "Engines")."""

    name: Annotated[
        Literal["inprocess", "ray"],
        Field(
            description="inprocess: every node in this process; ray: groups of nodes as Ray actors on a local or "
            "existing Ray cluster (the `ray` extra), carrying the same signed envelopes between them"
        ),
    ] = "inprocess"
    batched: Annotated[
        bool,
        Field(
            description="run the nodes' generation and updates together where that gives the same results as one "
            "by one: nodes holding identical weights decode in one pass, identical updates are computed once "
            "(dgrpo/simulations/pool.py)"
        ),
    ] = True
    address: Annotated[
        str | None,
        Field(description="ray: the cluster to join (ray.init(address=...)); unset: a local Ray started for the run"),
    ] = None
    workers: Annotated[int, Field(ge=1, le=64, description="ray: actors the nodes are spread over")] = 2
    cpus_per_worker: Annotated[float, Field(gt=0, description="ray: CPUs each actor reserves")] = 1.0


class Scenario(RunConfig):
    """A simulation: the run configuration (:class:`dgrpo.config.RunConfig`) of every node, plus how many
    nodes, which of them attack (``[adversary]`` applies to the ``nodes.malicious`` ones; ``[defense]`` to
    the honest ones), the global batch and the evaluation."""

    name: Annotated[str, Field(description="scenario name")] = "default"
    run_id: Annotated[str, Field(description="run id, part of every seed")] = "sim"
    rounds: Annotated[int, Field(ge=1, description="GRPO rounds")] = 50
    torch_threads: Annotated[
        int,
        Field(
            ge=0,
            description="torch intra-op threads; 0 keeps torch's default. Small models run fastest on one thread "
            "(on a busy 2-core machine, 2 threads made generation ~50x slower through OpenMP contention)",
        ),
    ] = 1
    checkpoint_every: Annotated[
        int,
        Field(
            ge=0,
            description="save the whole simulation every k rounds, so that `dgrpo simulate --resume` continues it "
            "(a run stopped by Ctrl-C or SIGTERM is saved at its last round whatever k; a killed one resumes from "
            "its last save); 0: never (an interrupted run then cannot be continued)",
        ),
    ] = 5
    nodes: NodesConfig = NodesConfig()
    engine: EngineConfig = EngineConfig()
    round: RoundsConfig = RoundsConfig()
    eval: EvalConfig = EvalConfig()

    @model_validator(mode="before")
    @classmethod
    def _share_is_derived(cls, data: Any) -> Any:
        rollout = data.get("rollout") if isinstance(data, dict) else None
        if isinstance(rollout, dict):
            given = sorted({"prompts_per_round", "completions_per_prompt"} & set(rollout))
            if given:
                raise ValueError(
                    f"a scenario derives rollout.{given[0]} from [round] (prompts_per_round = B, group_size = G, "
                    "over all nodes) and the split; set those instead"
                )
        return data

    @model_validator(mode="after")
    def _federated_attacks_its_own_way(self) -> Scenario:
        if self.federated is not None and (self.nodes.malicious or self.adversary is not None):
            raise ValueError(
                "a federated scenario shares updates, not completions: its attackers are [federated.attack], "
                "not [adversary] / nodes.malicious"
            )
        return self

    @model_validator(mode="after")
    def _federated_runs_in_process(self) -> Scenario:
        if self.federated is not None and self.engine.name == "ray":
            raise ValueError(
                "engine.name = 'ray' runs decentralised GRPO nodes; a federated scenario runs in this process, or "
                "on Flower's Ray simulation engine (docs/flower.md)"
            )
        return self

    @model_validator(mode="after")
    def _no_same_model_check_across_models(self) -> Scenario:
        bad = [name for name in self.defense.chain if name in SAME_MODEL_DEFENSES]
        if self.nodes.mode == "heterogeneous" and bad:
            raise ValueError(
                f"defense.chain holds {bad} in a heterogeneous network: these compare a completion with the "
                "receiver's own model and weights, which other nodes do not hold (the check would reject honest "
                "peers, or be skipped for them); use defenses that work across models (surprisal, judge, "
                "arith-check, code-policy, length)"
            )
        return self

    @model_validator(mode="after")
    def _simulations_are_lock_step(self) -> Scenario:
        if self.rollout.mode == "async":
            raise ValueError(
                "rollout.mode = 'async' is the daemons' (a node that never waits for its peers); simulations run "
                "lock-step rounds: try it with `dgrpo testnet up -s rollout.mode=async` (docs/scale.md)"
            )
        return self

    @model_validator(mode="after")
    def _adversary_for_malicious(self) -> Scenario:
        if self.nodes.malicious and self.adversary is None:
            raise ValueError("nodes.malicious > 0 needs an [adversary] section (e.g. name = 'text')")
        return self

    def run_rounds(self) -> int | None:
        return self.rounds

    def node_rollout(self) -> RolloutConfig:
        """Per-node work from the global B and G (paper, sec. 3): horizontal, G/m completions of all B
        prompts; vertical, G completions of B/m own prompts."""
        m = self.nodes.count
        r = self.round
        if self.rollout.split == "horizontal":
            if r.group_size % m:
                raise ConfigError(f"horizontal split: group_size {r.group_size} is not divisible by {m} nodes")
            share = {"prompts_per_round": r.prompts_per_round, "completions_per_prompt": r.group_size // m}
        else:
            if r.prompts_per_round % m:
                raise ConfigError(f"vertical split: prompts_per_round {r.prompts_per_round} not divisible by {m}")
            share = {"prompts_per_round": r.prompts_per_round // m, "completions_per_prompt": r.group_size}
        return self.rollout.model_copy(update=share)

    def node_model(self, index: int) -> ModelConfig:
        if self.nodes.mode == "homogeneous":
            return self.model
        return self.model.model_copy(update={"name": self.nodes.models[index % len(self.nodes.models)]})


def build_scenario(data: dict[str, Any]) -> Scenario:
    try:
        return Scenario.model_validate(data)
    except ValidationError as exc:
        raise explain_validation_error(exc, Scenario, "scenario") from None


def load_scenario(path: Path | None = None, overrides: list[str] | None = None) -> Scenario:
    """The scenario in ``path`` (a TOML file or the name of a shipped scenario), with overrides applied."""
    data: dict[str, Any] = {}
    if path is not None:
        if not path.exists() and (SCENARIO_DIR / f"{path}.toml").exists():
            path = SCENARIO_DIR / f"{path}.toml"
        if not path.exists():
            shipped = sorted(p.stem for p in SCENARIO_DIR.glob("*.toml"))
            raise ConfigError(f"scenario file {str(path)!r} not found; shipped scenarios: {', '.join(shipped)}")
        try:
            data = tomllib.loads(path.read_text())
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"scenario {path}: invalid TOML: {exc}") from None
    return build_scenario(apply_overrides(data, overrides or []))
