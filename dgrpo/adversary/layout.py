"""Where a completion's reasoning is, split into sentences, so that attacks can edit it in place.

The out-of-context TEXT attack inserts its payload "inside the reasoning" (paper, sec. 4.1) and the MATH
attack rewrites one reasoning step; both must leave the rest (tags, final answer, program output) intact so
that the verifiable reward stays at 1. A :class:`Layout` is ``prefix + sep.join(sentences) + suffix`` with
the sentences being the editable part:

- ``scratchpad`` (arith): the steps before ``>``, separated by ``,``; the suffix is ``>answer``;
- ``think``: the text inside ``<think>...</think>``, split after sentence ends and line breaks;
- ``program``: the lines of the program (inside its fenced block when there is one); text goes in comments;
- ``text``: the whole completion, split like ``think``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

SENTENCE_END_RE = re.compile(r"(?<=[.!?])[ \t]+|\n+")
THINK_RE = re.compile(r"\A(\s*<think>)(.*?)(</think>.*)\Z", re.DOTALL)
FENCE_RE = re.compile(r"\A(.*?```[ \t]*(?:python3?|py)?[ \t]*\n)(.*?)(\n?```.*)\Z", re.DOTALL | re.IGNORECASE)


@dataclass(frozen=True)
class Layout:
    prefix: str
    sentences: tuple[str, ...]
    seps: tuple[str, ...]  # seps[i] sits between sentences[i] and sentences[i + 1]
    suffix: str
    kind: str

    def render(self) -> str:
        body = "".join(s + sep for s, sep in zip(self.sentences, (*self.seps, ""), strict=True))
        return self.prefix + body + self.suffix

    def with_sentences(self, sentences: list[str], seps: list[str] | None = None) -> Layout:
        if seps is None:
            if len(sentences) != len(self.sentences):
                raise ValueError("changing the number of sentences needs new separators")
            seps = list(self.seps)
        return replace(self, sentences=tuple(sentences), seps=tuple(seps))

    @property
    def default_sep(self) -> str:
        return {"scratchpad": ",", "program": "\n"}.get(self.kind, " ")


def _split_sentences(text: str) -> tuple[list[str], list[str]]:
    """Sentences of stripped ``text`` and the separators between them (empty sentences merged away)."""
    pieces = re.split(f"({SENTENCE_END_RE.pattern})", text)
    sentences, seps = [pieces[0]], []
    for sep, sentence in zip(pieces[1::2], pieces[2::2], strict=True):
        if sentence:
            seps.append(sep)
            sentences.append(sentence)
        elif seps:
            seps[-1] += sep
        else:
            sentences[0] += sep
    return sentences, seps


def _prose(prefix: str, text: str, suffix: str, kind: str) -> Layout | None:
    lead = text[: len(text) - len(text.lstrip())]
    trail = text[len(text.rstrip()) :]
    core = text.strip()
    if not core:
        return None
    sentences, seps = _split_sentences(core)
    return Layout(prefix + lead, tuple(sentences), tuple(seps), trail + suffix, kind)


def layout(completion: str, kind: str) -> Layout | None:
    """The layout of ``completion`` in format ``kind``, or None when it has no editable reasoning."""
    if not isinstance(completion, str) or not completion.strip():
        return None
    if kind == "scratchpad":
        reasoning, sep, answer = completion.rpartition(">")
        if not sep or not reasoning:
            return None
        steps = reasoning.split(",")
        return Layout("", tuple(steps), (",",) * (len(steps) - 1), ">" + answer, kind)
    if kind == "think":
        m = THINK_RE.match(completion)
        return _prose(m.group(1), m.group(2), m.group(3), kind) if m else None
    if kind == "program":
        m = FENCE_RE.match(completion)
        prefix, code, suffix = (m.group(1), m.group(2), m.group(3)) if m else ("", completion, "")
        lines = code.split("\n")
        return Layout(prefix, tuple(lines), ("\n",) * (len(lines) - 1), suffix, kind)
    return _prose("", completion, "", kind)
