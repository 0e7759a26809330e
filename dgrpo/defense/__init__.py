"""Defenses: filters between receive and learn ("Hail to the Thief", sec. 6), and the reputation policy.

Importing this package registers the built-in defenses: ``length``, ``arith-check`` and ``code-policy``
(cheap, task-aware), ``logit`` (the paper's, homogeneous), ``sampling-proof`` (ours, homogeneous),
``surprisal`` (ours, heterogeneous: the receiver's own model reads every completion), ``repetition`` (ours,
any setting: the same words implanted in many of one author's completions) and ``judge`` (the paper's
LLM-as-a-judge, any setting).
"""

from dgrpo.config import DefenseConfig, ReputationConfig, parse_defense_spec
from dgrpo.defense import arith_check as arith_check
from dgrpo.defense import arith_pattern as arith_pattern
from dgrpo.defense import code_policy as code_policy
from dgrpo.defense import judge as judge
from dgrpo.defense import length as length
from dgrpo.defense import length_shift as length_shift
from dgrpo.defense import logit as logit
from dgrpo.defense import meaning as meaning
from dgrpo.defense import repetition as repetition
from dgrpo.defense import sampling_proof as sampling_proof
from dgrpo.defense import surprisal as surprisal
from dgrpo.defense.base import ACCEPT, Candidate, Defense, DefenseContext, Verdict
from dgrpo.defense.chain import ChainResult, DefenseChain
from dgrpo.defense.registry import DEFENSES
from dgrpo.defense.reputation import Reputation

__all__ = [
    "ACCEPT",
    "DEFENSES",
    "Candidate",
    "ChainResult",
    "Defense",
    "DefenseChain",
    "DefenseConfig",
    "DefenseContext",
    "Reputation",
    "ReputationConfig",
    "Verdict",
    "parse_defense_spec",
]
