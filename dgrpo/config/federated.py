"""Federated mode (Fed-GRPO, Guo et al. 2026, arXiv 2610.11502): clients train GRPO locally on private,
non-IID prompts and share model updates, never completions. ``docs/federated.md`` gives every formula the
constants below enter; the paper's exact formulas are not public, so each is a documented choice.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, model_validator

from dgrpo.config.sections import Section

Weighting = Literal["samples", "signal", "relative-gain", "uniform"]
Method = Literal["federated", "centralized", "local"]
Topology = Literal["star", "decentralised"]
ValueDtype = Literal["float32", "float16"]


class WeightsConfig(Section):
    """How the aggregator weighs clients (docs/federated.md, "Aggregation weights")."""

    temperature: Annotated[
        float,
        Field(gt=0.0, description="signal: w_k ~ (sigma_k + eps)^(1/temperature); 1 is proportional to sigma_k"),
    ] = 1.0
    eps: Annotated[float, Field(gt=0.0, description="signal: added to every sigma_k (no client weighs 0)")] = 0.01
    gain_temperature: Annotated[
        float, Field(gt=0.0, description="relative-gain: w_k ~ exp(gain_k / gain_temperature)")
    ] = 0.1
    gain_momentum: Annotated[
        float,
        Field(ge=0.0, lt=1.0, description="relative-gain: h_k <- m h_k + (1 - m) mu_k, the client's own history"),
    ] = 0.5


class CalibrationConfig(Section):
    """Global reward calibration (docs/federated.md, "Calibration"): w_p = clip(1 + strength (mu_g - r_p))."""

    enabled: Annotated[bool, Field(description="re-weight each prompt's advantages by its gap to mu_g")] = False
    strength: Annotated[float, Field(ge=0.0, description="lambda: weight per unit of reward gap")] = 1.0
    low: Annotated[float, Field(ge=0.0, description="smallest prompt weight")] = 0.5
    high: Annotated[float, Field(gt=0.0, description="largest prompt weight")] = 2.0

    @model_validator(mode="after")
    def _ordered(self) -> CalibrationConfig:
        if self.low > self.high:
            raise ValueError(f"calibration.low ({self.low}) must not exceed calibration.high ({self.high})")
        return self


class SparsityConfig(Section):
    """Adaptive sparse communication (docs/federated.md, "Sparse updates"): top-k with error feedback."""

    budget: Annotated[
        float,
        Field(gt=0.0, le=1.0, description="fraction of the update's entries a client sends per round; 1: dense"),
    ] = 1.0
    signal_scaled: Annotated[
        bool, Field(description="scale each client's budget by sigma_k / mean sigma of the last round")
    ] = True
    scale_low: Annotated[float, Field(gt=0.0, description="smallest budget scale")] = 0.5
    scale_high: Annotated[float, Field(gt=0.0, description="largest budget scale")] = 2.0
    values: Annotated[ValueDtype, Field(description="dtype of the sent values (the residual keeps the rest)")] = (
        "float32"
    )


class FedDefenseConfig(Section):
    """What the aggregator trusts of a client's report (docs/federated.md, "Defense")."""

    bound_stats: Annotated[
        bool,
        Field(
            description="clip each reported reward std to what the reward range allows at its reported mean "
            "(Bhatia-Davis: sigma <= sqrt((hi - mu)(mu - lo))) and to max_std_ratio x the median reported std"
        ),
    ] = False
    max_std_ratio: Annotated[
        float, Field(ge=1.0, description="a reported std above this multiple of the median one is clipped")
    ] = 1.5


class FedAttackConfig(Section):
    """Federated adversaries (research): the last ``clients`` clients misreport or poison their updates."""

    name: Annotated[str, Field(description="std-inflate | scale | sign-flip")]
    clients: Annotated[int, Field(ge=1, description="how many clients attack (the last ones)")] = 1
    options: dict[str, Any] = Field(default_factory=dict, description="the attack's options (docs/federated.md)")


class FederatedConfig(Section):
    """The ``[federated]`` section: who trains, how updates are weighted, calibrated, sparsified and merged."""

    method: Annotated[
        Method,
        Field(
            description="federated: clients share updates; centralized: one learner on the union of the clients' "
            "batches (same prompts and steps); local: clients never share"
        ),
    ] = "federated"
    clients: Annotated[int, Field(ge=1, le=64, description="number of clients K")] = 5
    prompts_per_client: Annotated[
        int, Field(ge=1, description="size of each client's private prompt set (its partition)")
    ] = 2000
    local_steps: Annotated[int, Field(ge=1, description="GRPO steps each client takes per round")] = 5
    prompts_per_step: Annotated[int, Field(ge=1, description="prompts in one local step")] = 8
    completions_per_prompt: Annotated[int, Field(ge=2, description="G: completions per prompt (one group)")] = 8
    partition: Annotated[
        str,
        Field(
            description="how prompts are split across clients: iid, arith-carries, arith-digits, gsm8k-steps "
            "(one pool cut by a difficulty key), arith-levels (each client one difficulty level)"
        ),
    ] = "arith-carries"
    noisy_clients: Annotated[
        int, Field(ge=0, description="the last this many clients hold noisy data (label_noise of their prompts)")
    ] = 0
    label_noise: Annotated[
        float,
        Field(ge=0.0, le=1.0, description="fraction of a noisy client's prompts carrying another's reference answer"),
    ] = 0.5
    weighting: Annotated[Weighting, Field(description="samples (FedAvg), signal, relative-gain, uniform")] = "samples"
    weights: WeightsConfig = WeightsConfig()
    aggregator: Annotated[
        str, Field(description="mean, median, trimmed-mean, multi-krum, norm-clip (robust aggregation)")
    ] = "mean"
    aggregator_options: dict[str, Any] = Field(default_factory=dict, description="the aggregator's options")
    server_lr: Annotated[float, Field(gt=0.0, description="global <- global + server_lr x aggregate")] = 1.0
    calibration: CalibrationConfig = CalibrationConfig()
    sparsity: SparsityConfig = SparsityConfig()
    defense: FedDefenseConfig = FedDefenseConfig()
    attack: Annotated[FedAttackConfig | None, Field(description="federated adversaries (research)")] = None
    topology: Annotated[
        Topology,
        Field(description="daemons: star (one aggregator) or decentralised (every node aggregates)"),
    ] = "star"

    @model_validator(mode="after")
    def _noisy_fewer(self) -> FederatedConfig:
        if self.noisy_clients >= self.clients:
            raise ValueError(f"noisy_clients ({self.noisy_clients}) must leave a clean client of {self.clients}")
        return self

    @model_validator(mode="after")
    def _honest_majority(self) -> FederatedConfig:
        if self.attack is not None and self.attack.clients >= self.clients:
            raise ValueError(f"attack.clients ({self.attack.clients}) must leave an honest client of {self.clients}")
        return self
