"""What of a completion its task does not account for: the free text, where an out-of-context payload lives.

A verifiable reward reads the answer (and the format), never the words around the working; those words are
the attacker's freedom ("Hail to the Thief", sec. 4.1: the phrase goes inside the reasoning of a correct
answer). The units returned here are what a cross-model defense compares across completions:

- ``scratchpad`` (arith): everything but the column steps ``a+b+c=s``, the separators and ``>answer``, as ONE
  unit: a payload split over the steps is read whole again;
- ``program``: the comments, as one unit (a program's code is checked by ``code-policy``);
- prose (``think``, ``text``): each sentence of the reasoning holding a letter-word, numbers and all: an
  honest reasoning's sentences are about their own question, and a payload sentence is not.

:func:`pieces` cuts the units into short word windows too: what a payload of a few words looks like whole.
"""

from __future__ import annotations

import re

from dgrpo.defense.repetition import WORD_RE
from dgrpo.tasks.arith import STEP_RE

COMMENT_RE = re.compile(r"#(.*)$", re.MULTILINE)
THINK_RE = re.compile(r"<think>(.*?)</think>", re.DOTALL)
SENTENCE_END_RE = re.compile(r"(?<=[.!?])[ \t]+|\n+")
MAX_UNITS = 32  # bounds the work on hostile text
MAX_UNIT_CHARS = 400
MAX_PIECES = 96


def free_text(completion: str, fmt: str) -> list[str]:
    """The free-text units of ``completion`` (format ``fmt``); empty when it has none."""
    if fmt == "scratchpad":
        reasoning = completion.rpartition(">")[0] if ">" in completion else completion
        words = WORD_RE.findall(STEP_RE.sub(" ", reasoning))
        return [" ".join(words)[:MAX_UNIT_CHARS]] if words else []
    if fmt == "program":
        words = WORD_RE.findall(" ".join(COMMENT_RE.findall(completion)))
        return [" ".join(words)[:MAX_UNIT_CHARS]] if words else []
    m = THINK_RE.search(completion) if fmt == "think" else None
    sentences = SENTENCE_END_RE.split(m.group(1) if m else completion)
    units = [" ".join(s.split())[:MAX_UNIT_CHARS] for s in sentences if WORD_RE.search(s)]
    return units[:MAX_UNITS]


def pieces(units: list[str], sizes: tuple[int, ...] = (2, 3, 4)) -> list[str]:
    """Each unit and every window of ``sizes`` consecutive words shorter than it (at most ``MAX_PIECES``): a
    payload of a few words inside a longer unit (the honest words around it) is one of its windows, whole."""
    out: list[str] = []
    for unit in units:
        words = unit.split()
        out.append(unit)
        out += [" ".join(words[i : i + k]) for k in sizes if k < len(words) for i in range(len(words) - k + 1)]
    return out[:MAX_PIECES]
