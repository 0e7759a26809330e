"""``surprisal``: a cross-model check for heterogeneous networks, with no judge model.

"Hail to the Thief" (sec. 6) has two defenses: the logit check, which needs the author's weights (homogeneous
networks only), and an LLM judge, for any network but costly (a 14B model in the paper). This one sits
between them: the receiver reads each received completion with its OWN model, whatever model wrote it, and
rejects a completion that holds a run of tokens its model finds unlikely. Injected out-of-context text (the
TEXT attack's phrase, the CODE attack's ``from calc import ...``) is unlikely under every honest model, while
an honest completion of another model is mostly text any model of the task would write.

**Statistic.** The per-token surprisal ``-log p(token | prompt, earlier tokens)`` under the receiver's model
at temperature 1 (its raw distribution: the question is whether the receiver's model would write this text,
not whether the author's sampler could have), and the completion's score is the largest, over windows of
``window`` consecutive tokens, of the window's median surprisal. A window so that a short phrase inside a
long normal completion is not averaged away; the median so that an honest completion's isolated unlikely
tokens (where the author's sampler took a rare branch, or its model differs from ours on one digit) do not
count, while an injected phrase raises most tokens of its window. GRAIL's validator reads the same signal
over a whole rollout (median chosen-token probability <= 0.30, i.e. surprisal >= 1.2 nats); the window
makes it local.

**Rule.** A score is compared with a threshold calibrated on the receiver's OWN completions: the
``quantile`` of the scores of its last ``calibration_size`` completions, plus ``margin``, clamped to
[``min_threshold``, ``max_threshold``] nats. Why the receiver's own writing and not the group's: in the
vertical split a prompt's whole group may be the attacker's, and in the horizontal split the attacker sets
its share of the group by over-publishing, so a group median is the attacker's to move; nothing the attacker
sends changes what the receiver itself writes. The scale differs a lot between models (a digits-only model
finds every letter ~10 nats unlikely, a model that has read English finds English words ~2 nats), which a
fixed threshold cannot serve and the receiver's own scores measure. The node's own completions reach the
chain with the others (``DefenseContext.self_id`` names them); where there are too few of them (a context
without ``self_id``), the defense samples its own reference completions for the round's prompts.

**Heterogeneous by design.** The author's claimed sampling is not checked (``ModelDefense`` rejects a
mismatch because its check assumes the author's sampler; this one assumes nothing about the author), and a
completion that re-encodes to more than ``max_new_tokens`` tokens is not rejected as an overflow: tokenizers
differ, so the receiver's token count says nothing about the author's. The check covers exactly the tokens
the receiver would train on (its first ``max_new_tokens`` tokens, and EOS when the text stops before).

What it cannot stop: attacks whose poison is text the receiver's model would write itself. MATH's false digit
is one unlikely token (the median ignores it; ``arith-check`` stops MATH), DoS publishes the attacker's own
samples, and an injected phrase that is ordinary text for the receiver (a model trained to write English
words where the phrase goes) scores like honest text.
"""

from __future__ import annotations

import logging
import math
from collections import deque
from collections.abc import Sequence
from typing import Annotated, Any, Literal

import torch
from pydantic import Field, model_validator

from dgrpo.config import Section
from dgrpo.defense.base import Candidate, Defense, DefenseContext, Verdict
from dgrpo.defense.forward import teacher_force
from dgrpo.defense.registry import DEFENSES
from dgrpo.learner.learner import Learner
from dgrpo.seeds import stable_seed
from dgrpo.tasks.base import Prompt

log = logging.getLogger(__name__)

Statistic = Literal["median", "mean"]


class SurprisalOptions(Section):
    window: Annotated[
        int,
        Field(
            ge=1,
            description="tokens per window: about the length of the shortest injection to catch (the tiny "
            "character-level models spell 'All hail to the thief' in 21 tokens; a BPE model in ~6)",
        ),
    ] = 16
    statistic: Annotated[
        Statistic, Field(description="a window's score: median (ignores isolated unlikely tokens) or mean")
    ] = "median"
    quantile: Annotated[
        float, Field(ge=0.0, le=1.0, description="quantile of the receiver's own completions' scores")
    ] = 0.95
    margin: Annotated[float, Field(ge=0.0, description="nats added to that quantile")] = 0.4
    min_threshold: Annotated[
        float,
        Field(ge=0.0, description="nats: never accept less surprising text as suspect (GRAIL: median p 0.30)"),
    ] = 1.2
    max_threshold: Annotated[
        float,
        Field(ge=0.0, description="nats: always reject a window this surprising, whatever the calibration says"),
    ] = 4.0
    calibration_size: Annotated[int, Field(ge=1, description="own completions' scores kept (the latest)")] = 256
    min_calibration: Annotated[
        int,
        Field(ge=0, description="fewer own scores than this: sample reference completions to reach it"),
    ] = 8
    micro_batch: Annotated[int, Field(ge=1, description="completions per forward pass")] = 32

    @model_validator(mode="after")
    def _ordered(self) -> SurprisalOptions:
        if self.min_threshold > self.max_threshold:
            raise ValueError(f"min_threshold {self.min_threshold} is above max_threshold {self.max_threshold}")
        return self


def window_score(surprisal: torch.Tensor, window: int, statistic: Statistic = "median") -> float:
    """The largest, over windows of ``window`` consecutive entries of the 1-D ``surprisal``, of the window's
    median (the mean of the two middle values for an even window) or mean. Shorter than the window: one
    window of all of it; empty: 0."""
    if surprisal.numel() == 0:
        return 0.0
    windows = surprisal.double().unfold(0, min(window, surprisal.numel()), 1)
    per_window = windows.quantile(0.5, dim=-1) if statistic == "median" else windows.mean(-1)
    return float(per_window.max())


def calibrated_threshold(
    own: Sequence[float], quantile: float, margin: float, min_threshold: float, max_threshold: float
) -> float:
    """``quantile`` of ``own`` (linear interpolation) + ``margin``, clamped to [min_threshold, max_threshold];
    ``max_threshold`` when there is no calibration at all."""
    if not own:
        return max_threshold
    q = float(torch.tensor(list(own), dtype=torch.float64).quantile(quantile))
    return min(max_threshold, max(min_threshold, q + margin))


def token_surprisal(
    learner: Learner, items: Sequence[tuple[str, str]], max_new_tokens: int, micro_batch: int
) -> list[torch.Tensor]:
    """Per-token surprisal (nats, temperature 1) of each (prompt text, completion text) under ``learner``."""
    out: list[torch.Tensor] = [torch.zeros(0)] * len(items)
    # slack 0 and the overflow flag ignored: exactly the tokens the receiver would train on (module docstring).
    for batch in teacher_force(learner, items, max_new_tokens, micro_batch):
        logp = torch.log_softmax(batch.logits, dim=-1).gather(-1, batch.ids.unsqueeze(-1)).squeeze(-1)
        for r, row in enumerate(batch.rows):
            out[row] = -logp[r][batch.mask[r]]
    return out


@DEFENSES.register("surprisal")
class SurprisalDefense(Defense):
    name = "surprisal"
    cost = 55
    needs_model = True
    Options = SurprisalOptions

    def __init__(self, options: dict[str, Any] | None = None) -> None:
        super().__init__(options)
        # One chain per node, so this is the receiver's own calibration, kept across rounds: its model moves
        # as it trains, and the latest scores follow it.
        self.own_scores: deque[float] = deque(maxlen=self.options.calibration_size)

    def scores(self, learner: Learner, max_new_tokens: int, items: Sequence[tuple[str, str]]) -> list[float]:
        opts = self.options
        return [
            window_score(s, opts.window, opts.statistic)
            for s in token_surprisal(learner, items, max_new_tokens, opts.micro_batch)
        ]

    def threshold(self) -> float:
        opts = self.options
        return calibrated_threshold(
            list(self.own_scores), opts.quantile, opts.margin, opts.min_threshold, opts.max_threshold
        )

    def check(self, ctx: DefenseContext, candidates: Sequence[Candidate]) -> list[Verdict]:
        if ctx.learner is None:
            raise RuntimeError("the surprisal defense needs the node's model")
        max_new = ctx.sampling.max_new_tokens
        scores = self.scores(ctx.learner, max_new, [(c.prompt.text, c.text) for c in candidates])
        self.own_scores.extend(
            s for c, s in zip(candidates, scores, strict=True) if ctx.self_id and c.author == ctx.self_id
        )
        missing = self.options.min_calibration - len(self.own_scores)
        if missing > 0 and candidates:
            self.own_scores.extend(self.reference_scores(ctx, [c.prompt for c in candidates], missing))
        limit = self.threshold()
        log.debug(
            "surprisal %s round %d: threshold %.3f nats from %d own scores; %d of %d above",
            ctx.self_id,
            ctx.round,
            limit,
            len(self.own_scores),
            sum(s > limit for s in scores),
            len(scores),
        )
        return [self.reject("high", s) if s > limit else Verdict(True, score=s) for s in scores]

    def reference_scores(self, ctx: DefenseContext, prompts: Sequence[Prompt], n: int) -> list[float]:
        """Scores of ``n`` (or a few more) completions the receiver samples itself for the round's prompts,
        with the run's sampling and a seed of its own."""
        assert ctx.learner is not None
        distinct = list({p.id: p for p in prompts}.values())[:n]
        per_prompt = math.ceil(n / len(distinct))
        seed = stable_seed("dgrpo/surprisal-calibration/1", ctx.run_id, ctx.round, ctx.self_id)
        sampling = ctx.sampling.model_copy(update={"seed": seed})
        texts = ctx.learner.generate([p.text for p in distinct], per_prompt, sampling)
        items = [(p.text, t) for p, ts in zip(distinct, texts, strict=True) for t in ts]
        return self.scores(ctx.learner, ctx.sampling.max_new_tokens, items)
