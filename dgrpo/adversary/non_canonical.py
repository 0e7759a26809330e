"""``non-canonical``: change a completion's reward without changing its tokens.

Completions travel as strings; the learner and the model checks see ``encode(text)``, the reward reads the
string. A character the receiver's tokenizer drops (a tab or a non-ASCII letter for the tiny models'
vocabulary) placed inside the final answer leaves the tokens those of a genuine seeded draw, so
``sampling-proof`` accepts it, while the answer no longer parses: a correct draw earns reward 0 and GRPO
pushes the honest nodes away from their own right answers. Receivers now require
``text == decode(encode(text))`` (``non_canonical``).

The attacker searches, from the end of each rewarded draw backwards, for one insertion of one of
``characters`` that its tokenizer drops and that lowers the reward; draws where none does are sent as they
are. Byte-level BPE tokenizers (SmolLM2's) drop nothing, so there this attack finds no insertion.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated

from pydantic import Field

from dgrpo.adversary.base import AttackContext
from dgrpo.adversary.exchange import ExchangeAttack
from dgrpo.adversary.registry import ADVERSARIES
from dgrpo.config import Section
from dgrpo.tasks.base import Prompt


class NonCanonicalOptions(Section):
    characters: Annotated[list[str], Field(min_length=1, description="characters to try inserting (one at a time)")] = (
        Field(default_factory=lambda: ["\t", "\u00e9", "\u200b", "\u00a0", "\x0b"])
    )
    positions: Annotated[int, Field(ge=1, description="insertion points tried, from the end of the text")] = 12


@ADVERSARIES.register("non-canonical")
class NonCanonicalAttack(ExchangeAttack):
    name = "non-canonical"
    Options = NonCanonicalOptions

    def rewrite(self, ctx: AttackContext, prompt: Prompt, text: str, reward: float) -> str | None:
        """``text`` with one dropped character inserted where it lowers the reward, or None."""
        characters: list[str] = self.options.characters
        for pos in range(len(text), max(-1, len(text) - self.options.positions), -1):
            for ch in characters:
                candidate = text[:pos] + ch + text[pos:]
                if (
                    ctx.canonical(candidate) == ctx.canonical(text)
                    and ctx.task.rewards(prompt, [candidate])[0] < reward
                ):
                    return candidate
        return None

    def attack(self, ctx: AttackContext, prompts: Sequence[Prompt], own: Sequence[Sequence[str]]) -> list[list[str]]:
        self.begin_round(ctx.round)
        out = []
        for prompt, texts in zip(prompts, own, strict=True):
            rewards = ctx.task.rewards(prompt, list(texts))
            group = []
            for text, reward in zip(texts, rewards, strict=True):
                rewritten = self.rewrite(ctx, prompt, text, reward) if reward > 0 else None
                if rewritten is not None:
                    self.record_poison(prompt.id, [rewritten])
                group.append(rewritten if rewritten is not None else text)
            out.append(group)
        return out
