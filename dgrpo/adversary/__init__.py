"""Adversaries: pluggable attacks on the completion exchange ("Hail to the Thief", sec. 4).

Importing this package registers the built-in attacks: ``text`` and ``dos`` (out-of-context), ``math`` and
``code`` (in-context), the paper's four; and the attacks on the exchange itself, ``select``,
``over-publish``, ``repeat-part``, ``off-plan`` and ``non-canonical`` (:mod:`dgrpo.adversary.exchange`).
:func:`build_adversary` makes one from its configuration.
"""

from dgrpo.adversary import code_calc as code_calc
from dgrpo.adversary import dos as dos
from dgrpo.adversary import false_carry as false_carry
from dgrpo.adversary import junk as junk
from dgrpo.adversary import math_step as math_step
from dgrpo.adversary import non_canonical as non_canonical
from dgrpo.adversary import off_plan as off_plan
from dgrpo.adversary import over_publish as over_publish
from dgrpo.adversary import repeat_part as repeat_part
from dgrpo.adversary import select as select
from dgrpo.adversary import text as text
from dgrpo.adversary.base import Adversary, AttackContext
from dgrpo.adversary.registry import ADVERSARIES
from dgrpo.config import AdversaryConfig, parse_adversary_spec


def build_adversary(cfg: AdversaryConfig) -> Adversary:
    """The attack named in ``cfg`` (an unknown name is an error listing the known ones)."""
    return ADVERSARIES.get(cfg.name)(cfg)


__all__ = ["ADVERSARIES", "Adversary", "AdversaryConfig", "AttackContext", "build_adversary", "parse_adversary_spec"]
