"""``math``: the in-context MATH attack (paper, sec. 4.2). One reasoning step of a correct completion is
made to state a false fact, 2+2=5 or 2x2=5 by default, while the final answer (all the reward reads)
stays correct.

- ``arith`` scratchpad: a column step ``2+2+c=s`` becomes ``2+2+c=5+c`` (a false digit step); completions
  without a targeted column cannot carry the poison.
- prose (``<think>`` reasoning): an equation computing a targeted operation gets the false result; when
  there is none and ``insert_when_absent`` holds, a sentence stating the false fact is inserted.
"""

from __future__ import annotations

import random
from typing import Annotated

from pydantic import Field, field_validator

from dgrpo.adversary.base import Adversary
from dgrpo.adversary.detectors import Detector, FalseFactDetector
from dgrpo.adversary.facts import EQUATION_RE, STEP_RE, Fact, parse_fact
from dgrpo.adversary.layout import layout
from dgrpo.adversary.registry import ADVERSARIES
from dgrpo.config import Section
from dgrpo.protocol.messages import SplitMode
from dgrpo.seeds import stable_seed
from dgrpo.tasks.base import Prompt, Task


class MathOptions(Section):
    facts: list[str] = Field(
        default_factory=lambda: ["2+2=5", "2x2=5"],
        min_length=1,
        description="false facts 'A+B=R' / 'AxB=R' (paper: 2+2=5, 2x2=5)",
    )
    choose_prompts: Annotated[
        bool,
        Field(description="vertical split: answer own prompts whose solution computes a targeted operation"),
    ] = True
    insert_when_absent: Annotated[
        bool, Field(description="prose: insert a false-fact sentence when no targeted computation is present")
    ] = True

    @field_validator("facts")
    @classmethod
    def _valid_facts(cls, facts: list[str]) -> list[str]:
        for f in facts:
            parse_fact(f)
        return facts


def falsify_scratchpad(completion: str, facts: list[Fact], choice: int) -> str | None:
    """One targeted column step made false (``2+2+c=5+c``), or None when no step is targeted."""
    lay = layout(completion, "scratchpad")
    if lay is None:
        return None
    targets = []
    for i, step in enumerate(lay.sentences):
        m = STEP_RE.search(step)
        if m is None:
            continue
        a, b, carry = int(m.group(1)), int(m.group(2)), int(m.group(3))
        for fact in facts:
            if fact.op == "+" and fact.matches(a, "+", b):
                targets.append((i, m, fact.false_result + carry))
    if not targets:
        return None
    i, m, wrong = targets[choice % len(targets)]
    sentences = list(lay.sentences)
    step = sentences[i]
    sentences[i] = step[: m.start(4)] + str(wrong) + step[m.end(4) :]
    return lay.with_sentences(sentences).render()


def falsify_prose(completion: str, fmt: str, facts: list[Fact], choice: int, insert: bool) -> str | None:
    lay = layout(completion, fmt)
    if lay is None:
        return None
    sentences = list(lay.sentences)
    for i, sentence in enumerate(sentences):
        for m in EQUATION_RE.finditer(sentence):
            a, op, b = int(m.group(1)), m.group(3), int(m.group(5))
            fact = next((f for f in facts if f.matches(a, op, b)), None)
            if fact is not None:
                sentences[i] = sentence[: m.start(7)] + str(fact.false_result) + sentence[m.end(7) :]
                return lay.with_sentences(sentences).render()
    if not insert:
        return None
    fact = facts[choice % len(facts)]
    op = "+" if fact.op == "+" else "x"
    at = choice % (len(sentences) + 1)
    seps = list(lay.seps)
    sentences.insert(at, f"{fact.a} {op} {fact.b} = {fact.false_result}.")
    seps.insert(min(at, len(seps)), lay.default_sep)
    return lay.with_sentences(sentences, seps).render()


@ADVERSARIES.register("math")
class MathAttack(Adversary):
    name = "math"
    Options = MathOptions

    @property
    def facts(self) -> list[Fact]:
        return [parse_fact(f) for f in self.options.facts]

    def poison(self, task: Task, prompt: Prompt, completion: str) -> str | None:
        choice = self.rng.randrange(1 << 30)
        if task.reasoning_format == "scratchpad":
            return falsify_scratchpad(completion, self.facts, choice)
        if task.reasoning_format == "program":
            return None  # a program's arithmetic is its output: use the code attack
        return falsify_prose(completion, task.reasoning_format, self.facts, choice, self.options.insert_when_absent)

    def choose_prompts(self, task: Task, planned: list[Prompt], split: SplitMode, seed_key: str) -> list[Prompt]:
        """Vertical split, scratchpad tasks: prompts with a targeted column (searched deterministically)."""
        if split != "vertical" or not self.options.choose_prompts or task.reasoning_format != "scratchpad":
            return planned
        detector = FalseFactDetector(self.facts, task.reasoning_format)
        chosen = [
            p for p in planned if task.reference_completion(p) and detector.counts(task.reference_completion(p) or "")
        ]
        rng = random.Random(stable_seed(seed_key, "math-choose"))
        for _ in range(200 * len(planned)):
            if len(chosen) >= len(planned):
                break
            p = task.train_prompt(rng.randrange(task.num_train))
            reference = task.reference_completion(p)
            if reference is not None and detector.counts(reference) and p not in chosen:
                chosen.append(p)
        return chosen[: len(planned)] if len(chosen) >= len(planned) else planned

    def detector(self, task: Task) -> Detector:
        return FalseFactDetector(self.facts, task.reasoning_format)
