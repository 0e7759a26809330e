"""The run configuration: everything that decides what a node does in a round, shared by a daemon's settings
(:class:`dgrpo.daemon.settings.NodeSettings`) and a simulation's scenario
(:class:`dgrpo.simulations.scenario.Scenario`), which both extend it with what only they need. One
:func:`dgrpo.round.build.build_node` turns it into a node for either.

The TOML sections are the field names: ``[task]``, ``[model]``, ``[learner]``, ``[sampling]``, ``[rollout]``,
``[defense]``, ``[adversary]``, ``[limits]``, ``[federated]`` (federated mode), ``[logging]`` (TensorBoard).
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from dgrpo.config.adversary import AdversaryConfig
from dgrpo.config.defense import DefenseConfig, check_sampler
from dgrpo.config.federated import FederatedConfig
from dgrpo.config.learner import LearnerConfig
from dgrpo.config.logs import LoggingConfig
from dgrpo.config.model import ModelConfig
from dgrpo.config.rollout import RolloutConfig
from dgrpo.config.sections import fill_section
from dgrpo.config.task import TaskConfig
from dgrpo.protocol.limits import Limits
from dgrpo.protocol.messages import DEFAULT_SAMPLING, SamplingParams


class RunConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True)

    task: TaskConfig = TaskConfig()
    model: ModelConfig = ModelConfig()
    learner: LearnerConfig = LearnerConfig()
    sampling: Annotated[
        SamplingParams, Field(description="the run's agreed sampling parameters (every node samples alike)")
    ] = DEFAULT_SAMPLING
    rollout: RolloutConfig = RolloutConfig()
    defense: Annotated[
        DefenseConfig, Field(description="the defense chain (empty: no defense) and the reputation policy")
    ] = DefenseConfig()
    adversary: Annotated[
        AdversaryConfig | None,
        Field(description="run as an attacker (research): its published completions pass through this attack"),
    ] = None
    limits: Annotated[Limits, Field(description="what the node accepts from peers (docs/protocol.md, Limits)")] = (
        Limits()
    )
    federated: Annotated[
        FederatedConfig | None,
        Field(description="federated mode (Fed-GRPO, docs/federated.md): share model updates, not completions"),
    ] = None
    logging: Annotated[
        LoggingConfig,
        Field(description="where the run logs besides its own files: TensorBoard (a node's own, never the run's)"),
    ] = LoggingConfig()

    @model_validator(mode="before")
    @classmethod
    def _partial_sampling(cls, data: Any) -> Any:
        return fill_section(data, "sampling", DEFAULT_SAMPLING)

    @model_validator(mode="after")
    def _sampler_for_proofs(self) -> RunConfig:
        check_sampler(self.defense.chain, self.rollout.sampler, "rollout.sampler")
        return self

    @model_validator(mode="after")
    def _schedule_has_a_span(self) -> RunConfig:
        if self.learner.lr_schedule != "constant" and self.lr_rounds() is None:
            raise ValueError(
                f"learner.lr_schedule = {self.learner.lr_schedule!r} needs the rounds it spans: set "
                "learner.lr_rounds, or run a fixed number of rounds (a daemon's rounds.max_rounds)"
            )
        return self

    def run_rounds(self) -> int | None:
        """How many rounds the run lasts, where it is fixed (a scenario's ``rounds``, a daemon's
        ``rounds.max_rounds``)."""
        return None

    def lr_rounds(self) -> int | None:
        """The rounds a learning-rate schedule spans: ``learner.lr_rounds``, else the run's."""
        return self.learner.lr_rounds or self.run_rounds()
