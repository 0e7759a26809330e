"""The run configuration, split by concern; imports neither torch nor transformers.

- :mod:`~dgrpo.config.run`: :class:`RunConfig`, what a node does in a round (shared by daemons and scenarios);
- its sections: task, model (and LoRA), learner, rollout (split, sampler, per-node work), defense (chain and
  reputation), adversary, logging (TensorBoard); sampling parameters and limits come from :mod:`dgrpo.protocol`
  (they are on the wire).
"""

from dgrpo.config.adversary import AdversaryConfig, parse_adversary_spec
from dgrpo.config.defense import (
    SAME_MODEL_DEFENSES,
    DefenseConfig,
    ReputationConfig,
    check_sampler,
    needs_seeded_sampler,
    parse_defense_spec,
)
from dgrpo.config.learner import LOSS_TYPES, LearnerConfig, LossType
from dgrpo.config.logs import LoggingConfig
from dgrpo.config.model import LoraConfig, ModelConfig
from dgrpo.config.rollout import RolloutConfig, Sampler
from dgrpo.config.run import RunConfig
from dgrpo.config.sections import Section, fill_section
from dgrpo.config.task import TaskConfig

__all__ = [
    "LOSS_TYPES",
    "SAME_MODEL_DEFENSES",
    "AdversaryConfig",
    "DefenseConfig",
    "LearnerConfig",
    "LoggingConfig",
    "LoraConfig",
    "LossType",
    "ModelConfig",
    "ReputationConfig",
    "RolloutConfig",
    "RunConfig",
    "Sampler",
    "Section",
    "TaskConfig",
    "check_sampler",
    "fill_section",
    "needs_seeded_sampler",
    "parse_adversary_spec",
    "parse_defense_spec",
]
