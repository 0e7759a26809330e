"""Adversaries: pluggable attacks on the completion exchange ("Hail to the Thief", sec. 4).

Importing this package registers the built-in attacks: ``text`` and ``dos`` (out-of-context), ``math`` and
``code`` (in-context). :func:`build_adversary` makes one from its configuration.
"""

from dgrpo.adversary import code_calc as code_calc
from dgrpo.adversary import dos as dos
from dgrpo.adversary import math_step as math_step
from dgrpo.adversary import text as text
from dgrpo.adversary.base import Adversary, AttackContext
from dgrpo.adversary.registry import ADVERSARIES
from dgrpo.config import AdversaryConfig, parse_adversary_spec


def build_adversary(cfg: AdversaryConfig) -> Adversary:
    """The attack named in ``cfg`` (an unknown name is an error listing the known ones)."""
    return ADVERSARIES.get(cfg.name)(cfg)


__all__ = ["ADVERSARIES", "Adversary", "AdversaryConfig", "AttackContext", "build_adversary", "parse_adversary_spec"]
