"""``length``: reject length outliers within a prompt's group, and anything over a cap.

Aimed at the DoS attack ("Hail to the Thief", sec. 4: the attacker publishes the longest of its highest-reward
samples, and honest completion length more than doubles). Within a group, a completion is an outlier when it
is longer than ``ratio`` times the group's median length and more than ``mad_z`` robust standard deviations
(1.4826 x median absolute deviation) above the median; the second condition keeps naturally spread groups
from losing their long tail. Lengths are in characters, what every node measures the same way.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Sequence
from typing import Annotated

from pydantic import Field

from dgrpo.config import Section
from dgrpo.defense.base import ACCEPT, Candidate, Defense, DefenseContext, Verdict
from dgrpo.defense.registry import DEFENSES


class LengthOptions(Section):
    max_chars: Annotated[int | None, Field(ge=1, description="hard cap in characters; None: no cap")] = None
    ratio: Annotated[float, Field(gt=1.0, description="outlier: longer than ratio x the group median")] = 1.5
    mad_z: Annotated[
        float, Field(ge=0.0, description="outlier: also more than mad_z robust std devs above the median")
    ] = 3.0
    min_group: Annotated[int, Field(ge=2, description="groups smaller than this skip the outlier test")] = 4


def outliers(lengths: Sequence[int], ratio: float, mad_z: float) -> list[bool]:
    """Which lengths are outliers of their group (see the module docstring)."""
    median = statistics.median(lengths)
    mad = statistics.median(abs(n - median) for n in lengths)
    return [n > ratio * median and n - median > mad_z * 1.4826 * mad for n in lengths]


@DEFENSES.register("length")
class LengthDefense(Defense):
    name = "length"
    cost = 1
    Options = LengthOptions

    def check(self, ctx: DefenseContext, candidates: Sequence[Candidate]) -> list[Verdict]:
        opts = self.options
        verdicts: list[Verdict] = [ACCEPT] * len(candidates)
        groups: dict[str, list[int]] = defaultdict(list)
        for i, c in enumerate(candidates):
            groups[c.prompt.id].append(i)
        for members in groups.values():
            lengths = [len(candidates[i].text) for i in members]
            median = statistics.median(lengths) or 1
            flags = (
                outliers(lengths, opts.ratio, opts.mad_z) if len(members) >= opts.min_group else [False] * len(members)
            )
            for i, n, flag in zip(members, lengths, flags, strict=True):
                if opts.max_chars is not None and n > opts.max_chars:
                    verdicts[i] = self.reject("over_cap", n / opts.max_chars)
                elif flag:
                    verdicts[i] = self.reject("group_outlier", n / median)
        return verdicts
