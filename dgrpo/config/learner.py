"""How a node's GRPO learner updates its model (the loss follows TRL's GRPO losses)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, model_validator

from dgrpo.config.sections import Section

LossType = Literal["grpo", "dr_grpo", "dapo"]
LOSS_TYPES: tuple[LossType, ...] = ("grpo", "dr_grpo", "dapo")
LrSchedule = Literal["constant", "cosine"]


class LearnerConfig(Section):
    lr: Annotated[float, Field(gt=0.0, description="learning rate (paper: Adam 2e-5)")] = 5e-5
    lr_schedule: Annotated[
        LrSchedule,
        Field(
            description="constant, or cosine: from lr at round 1 to lr x lr_final at round lr_rounds "
            "(dgrpo/learner/schedule.py)"
        ),
    ] = "constant"
    lr_final: Annotated[float, Field(ge=0.0, le=1.0, description="cosine: the last round's lr over lr")] = 0.1
    lr_rounds: Annotated[
        int | None,
        Field(ge=1, description="cosine: rounds it spans; None: the run's (scenario rounds, rounds.max_rounds)"),
    ] = None
    optimizer: Annotated[
        Literal["adam", "adamw", "sgd"],
        Field(
            description="optimizer; sgd gives updates whose energy sits in few entries, which top-k "
            "sparsification keeps (docs/federated.md); adam moves every active weight by about lr"
        ),
    ] = "adam"
    momentum: Annotated[
        float, Field(ge=0.0, lt=1.0, description="heavy-ball momentum of sgd (0: plain SGD); sgd only")
    ] = 0.0
    weight_decay: Annotated[float, Field(ge=0.0, description="AdamW weight decay")] = 0.0
    loss_type: Annotated[LossType, Field(description="grpo | dr_grpo | dapo, with TRL's meanings")] = "dapo"
    beta: Annotated[float, Field(ge=0.0, description="KL weight (paper: 0)")] = 0.0
    epsilon: Annotated[
        float | None,
        Field(
            gt=0.0,
            description="PPO clip epsilon; None: no clipping. Acts only with updates_per_round > 1: the first "
            "update's ratio is exactly 1",
        ),
    ] = None
    epsilon_high: Annotated[float | None, Field(gt=0.0, description="upper clip (DAPO); None: = epsilon")] = None
    scale_rewards: Annotated[bool, Field(description="divide advantages by the group std")] = True
    advantage_eps: Annotated[float, Field(gt=0.0, description="eps in (r - mean) / (std + eps)")] = 1e-4
    updates_per_round: Annotated[
        int,
        Field(
            ge=1,
            description="optimizer updates on each batch of rollouts (TRL's num_iterations, GRPO's mu), each with "
            "the ratio taken against the log-probs of the weights that generated them: from the second update the "
            "ratio leaves 1 and epsilon clips. 1: on-policy, the paper's setting",
        ),
    ] = 1
    micro_batch_size: Annotated[int, Field(ge=1, description="sequences per forward/backward pass")] = 32
    max_grad_norm: Annotated[float | None, Field(gt=0.0, description="gradient clipping; None: off")] = 1.0
    seed: Annotated[int, Field(ge=0, description="seed for initialisation and sampling")] = 0

    @model_validator(mode="after")
    def _momentum_is_sgds(self) -> LearnerConfig:
        # Adam keeps its own first moment; a momentum set with it would be silently ignored.
        if self.momentum and self.optimizer != "sgd":
            raise ValueError(f"learner.momentum is sgd's; optimizer is {self.optimizer!r}")
        return self
