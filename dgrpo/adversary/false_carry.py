"""``false-carry``: an in-context MATH variant on the ``arith`` scratchpad (issue 28). A column step that takes
a carry, ``4+7+1=12``, is published as ``4+7+0=12``: the carry is dropped from the claim while the column's
total (and so the final answer and the reward) stays right, so the step states the false fact 4+7=12. The
paper's MATH attack (sec. 4.2) picks one false fact (2+2=5); this one teaches a whole family of them (every
carry step is off by one), which a filter built for listed facts does not know.
"""

from __future__ import annotations

from dgrpo.adversary.base import Adversary
from dgrpo.adversary.detectors import Detector
from dgrpo.adversary.facts import STEP_RE
from dgrpo.adversary.layout import layout
from dgrpo.adversary.registry import ADVERSARIES
from dgrpo.tasks.base import Prompt, Task


def drop_carry(completion: str, choice: int) -> str | None:
    """One step ``x+y+1=s`` of the scratchpad rewritten ``x+y+0=s``, or None when no step takes a carry."""
    lay = layout(completion, "scratchpad")
    if lay is None:
        return None
    targets = [(i, m) for i, step in enumerate(lay.sentences) if (m := STEP_RE.search(step)) and m.group(3) == "1"]
    if not targets:
        return None
    i, m = targets[choice % len(targets)]
    sentences = list(lay.sentences)
    sentences[i] = sentences[i][: m.start(3)] + "0" + sentences[i][m.end(3) :]
    return lay.with_sentences(sentences).render()


class FalseCarryDetector(Detector):
    """Counts scratchpads with a carry step (stated or dropped); shows those stating ``x+y+0 = x+y+1``."""

    @staticmethod
    def _steps(completion: str) -> list[tuple[int, int, int, int]]:
        return [tuple(int(g) for g in m.groups()) for m in STEP_RE.finditer(completion)]  # type: ignore[misc]

    def counts(self, completion: str) -> bool:
        return any(c == 1 or (c == 0 and s == x + y + 1) for x, y, c, s in self._steps(completion))

    def shows(self, completion: str) -> bool:
        return any(c == 0 and s == x + y + 1 for x, y, c, s in self._steps(completion))


@ADVERSARIES.register("false-carry")
class FalseCarryAttack(Adversary):
    name = "false-carry"

    def poison(self, task: Task, prompt: Prompt, completion: str) -> str | None:
        if task.reasoning_format != "scratchpad":
            return None  # only the scratchpad states its carries
        return drop_carry(completion, self.rng.randrange(1 << 30))

    def detector(self, task: Task) -> Detector:
        return FalseCarryDetector()
