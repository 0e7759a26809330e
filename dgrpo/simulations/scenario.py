"""A simulation scenario: typed, loaded from TOML, overridable with ``key=value`` pairs.

Unknown keys are errors that list the valid keys of their section.
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from dgrpo.adversary.config import AdversaryConfig
from dgrpo.defense.config import DefenseConfig, check_sampler
from dgrpo.errors import ConfigError
from dgrpo.node.config import LearnerConfig, ModelConfig, RolloutConfig, Section, TaskConfig, fill_section
from dgrpo.overrides import apply_overrides, explain_validation_error
from dgrpo.protocol.messages import DEFAULT_SAMPLING, SamplingParams, SplitMode

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
    split: Annotated[SplitMode, Field(description="the paper's horizontal or vertical split")] = "horizontal"
    prompts_per_round: Annotated[int, Field(ge=1, description="B: prompts per round, over all nodes")] = 8
    group_size: Annotated[int, Field(ge=1, description="G: completions per prompt, over all nodes")] = 8
    deadline_seconds: Annotated[float, Field(gt=0, description="a round closes at quorum or this")] = 600.0
    sampler: Annotated[
        Literal["multinomial", "seeded"],
        Field(description="seeded: the verifiable seeded sampler every node uses (needed by sampling-proof)"),
    ] = "multinomial"


class EvalConfig(Section):
    every: Annotated[int, Field(ge=1, description="evaluate every k rounds (and at the start and end)")] = 5
    asr_prompts: Annotated[
        int, Field(ge=1, description="held-out prompts for the ASR when the detector picks its own (math)")
    ] = 128
    prompts: Annotated[int, Field(ge=1, description="held-out prompts per evaluation")] = 128
    greedy: Annotated[bool, Field(description="greedy decoding instead of the run's sampling")] = False
    seed: Annotated[int, Field(ge=0, description="sampling seed of evaluations")] = 1234


class Scenario(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True)

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
    task: TaskConfig = TaskConfig()
    nodes: NodesConfig = NodesConfig()
    model: ModelConfig = ModelConfig()
    sampling: SamplingParams = DEFAULT_SAMPLING
    learner: LearnerConfig = LearnerConfig()
    round: RoundsConfig = RoundsConfig()
    eval: EvalConfig = EvalConfig()
    adversary: Annotated[
        AdversaryConfig | None,
        Field(description="the attack run by the nodes.malicious nodes; its detector gives the ASR"),
    ] = None
    defense: Annotated[
        DefenseConfig | None,
        Field(description="the defense chain and reputation policy of the honest nodes"),
    ] = None

    @model_validator(mode="before")
    @classmethod
    def _partial_sampling(cls, data: Any) -> Any:
        return fill_section(data, "sampling", DEFAULT_SAMPLING)

    @model_validator(mode="after")
    def _adversary_for_malicious(self) -> Scenario:
        if self.nodes.malicious and self.adversary is None:
            raise ValueError("nodes.malicious > 0 needs an [adversary] section (e.g. name = 'text')")
        if self.defense is not None:
            check_sampler(self.defense.chain, self.round.sampler, "round.sampler")
        return self

    def node_rollout(self) -> RolloutConfig:
        """Per-node work from the global B and G (paper, sec. 3): horizontal, G/m completions of all B
        prompts; vertical, G completions of B/m own prompts."""
        m = self.nodes.count
        r = self.round
        if r.split == "horizontal":
            if r.group_size % m:
                raise ConfigError(f"horizontal split: group_size {r.group_size} is not divisible by {m} nodes")
            return RolloutConfig(
                split="horizontal",
                prompts_per_round=r.prompts_per_round,
                completions_per_prompt=r.group_size // m,
                sampler=r.sampler,
            )
        if r.prompts_per_round % m:
            raise ConfigError(f"vertical split: prompts_per_round {r.prompts_per_round} not divisible by {m}")
        return RolloutConfig(
            split="vertical",
            prompts_per_round=r.prompts_per_round // m,
            completions_per_prompt=r.group_size,
            sampler=r.sampler,
        )

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
