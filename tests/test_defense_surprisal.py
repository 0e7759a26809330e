"""The ``surprisal`` defense: its statistic and threshold on hand-made numbers, its rule on a fabricated round,
and the real thing on the embedded tiny models (the receiver's own model, another architecture's author)."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
import torch

from dgrpo.adversary.text import TextAttack
from dgrpo.config import AdversaryConfig, LearnerConfig, ModelConfig
from dgrpo.defense import DEFENSES, Candidate, DefenseChain, DefenseConfig, DefenseContext
from dgrpo.defense.surprisal import SurprisalDefense, calibrated_threshold, window_score
from dgrpo.errors import ConfigError
from dgrpo.learner.learner import Learner
from dgrpo.learner.sampler import completion_seed
from dgrpo.protocol.messages import SamplingParams
from dgrpo.tasks.arith import ArithTask
from dgrpo.tasks.base import Prompt

SP = SamplingParams(temperature=1.0, top_k=10, top_p=1.0, max_new_tokens=96)
ME = "node-0"


# ------------------------------------------------------------------ the statistic
def test_window_median_ignores_an_isolated_spike_that_the_mean_counts() -> None:
    s = torch.tensor([0.0, 9.0, 0.0, 0.0, 2.0, 2.0, 0.0])
    # windows of 3, medians: [0,9,0] 0, [9,0,0] 0, [0,0,2] 0, [0,2,2] 2, [2,2,0] 2 -> 2
    assert window_score(s, 3, "median") == 2.0
    # means: 3, 3, 2/3, 4/3, 4/3 -> 3 (the lone 9)
    assert window_score(s, 3, "mean") == 3.0


def test_window_median_of_an_even_window_and_short_and_empty_inputs() -> None:
    # windows of 2: [1,2] 1.5, [2,4] 3, [4,8] 6
    assert window_score(torch.tensor([1.0, 2.0, 4.0, 8.0]), 2) == 6.0
    # shorter than the window: one window of everything, median 2, mean 3
    assert window_score(torch.tensor([1.0, 2.0, 6.0]), 5, "median") == 2.0
    assert window_score(torch.tensor([1.0, 2.0, 6.0]), 5, "mean") == 3.0
    assert window_score(torch.zeros(0), 4) == 0.0


def test_a_phrase_in_a_long_completion_is_not_averaged_away() -> None:
    """Three surprising tokens inside 40 likely ones: the whole completion's mean is 0.45, a window of 4
    around them has median 4."""
    s = torch.tensor([0.1] * 20 + [5.0, 4.0, 6.0] + [0.1] * 20)
    assert float(s.mean()) == pytest.approx((40 * 0.1 + 15.0) / 43)
    assert window_score(s, 4) == pytest.approx(4.5)  # [5,4,6,0.1]: middle two 4 and 5
    assert window_score(s, 3) == 5.0


# ------------------------------------------------------------------ the threshold
def test_calibrated_threshold() -> None:
    own = [0.0, 1.0, 2.0, 3.0, 4.0]
    assert calibrated_threshold(own, 0.5, 0.25, 1.2, 4.0) == 2.25  # median 2 + 0.25
    assert calibrated_threshold(own, 0.95, 0.4, 1.2, 4.0) == 4.0  # 3.8 + 0.4 = 4.2, capped at 4
    assert calibrated_threshold(own, 0.75, 0.0, 1.2, 4.0) == 3.0  # interpolated: index 3 of 0..4
    assert calibrated_threshold([0.01] * 16, 0.95, 0.4, 1.2, 4.0) == 1.2  # a digits-only model: the floor
    assert calibrated_threshold([], 0.95, 0.4, 1.2, 4.0) == 4.0  # no calibration: only the ceiling


def test_options_are_checked() -> None:
    with pytest.raises(ConfigError, match="min_threshold"):
        SurprisalDefense({"min_threshold": 5.0, "max_threshold": 4.0})
    with pytest.raises(ConfigError, match="window"):
        SurprisalDefense({"window": 0})
    assert DEFENSES.get("surprisal") is SurprisalDefense


# ------------------------------------------------------------------ the rule, on a fabricated round
class Fixed(SurprisalDefense):
    """Scores read off the completion text ("s=2.5"); reference samples score ``reference``."""

    reference = 0.5
    sampled = 0

    def scores(self, learner: Learner, max_new_tokens: int, items: Sequence[tuple[str, str]]) -> list[float]:
        return [float(text.split("=")[1]) if text.startswith("s=") else self.reference for _, text in items]

    def reference_scores(self, ctx: DefenseContext, prompts: Sequence[Prompt], n: int) -> list[float]:
        self.sampled = n
        return [self.reference] * n


def fabricated(author: str, prompt: Prompt, scores: Sequence[float], sampling: SamplingParams = SP) -> list[Candidate]:
    return [Candidate(author, prompt, f"s={s}", i, sampling, "m") for i, s in enumerate(scores)]


def ctx(self_id: str = ME) -> DefenseContext:
    # a learner is required but never used by ``Fixed``
    return DefenseContext(ArithTask(), object(), SP, "run", 1, self_id=self_id)  # type: ignore[arg-type]


P1, P2 = Prompt("p1", "1+1=", "2"), Prompt("p2", "2+2=", "4")


def test_rule_on_a_vertical_round_where_the_attacker_owns_a_whole_group() -> None:
    """Own completions (p1) score 0.5..1.5: their 0.95-quantile 1.45 + 0.4 = 1.85 is the threshold. The
    attacker owns p2's whole group; a group-median rule would accept its completions (they are the group),
    the receiver's own calibration rejects those above 1.85 and nothing else."""
    d = Fixed({"min_calibration": 0})
    own = fabricated(ME, P1, [0.5, 0.75, 1.0, 1.25, 1.5])
    honest = fabricated("node-1", P1, [1.8, 0.2])
    attacker = fabricated("node-3", P2, [2.5, 2.6, 1.0, 3.0])
    verdicts = d.check(ctx(), [*own, *honest, *attacker])
    assert d.threshold() == pytest.approx(1.85)
    assert [v.accept for v in verdicts] == [True] * 5 + [True, True] + [False, False, True, False]
    assert verdicts[-1].reason == "surprisal:high" and verdicts[-1].score == 3.0
    assert verdicts[5].score == 1.8  # accepted verdicts carry their score too


def test_what_the_attacker_sends_does_not_move_the_threshold() -> None:
    few, many = Fixed({"min_calibration": 0}), Fixed({"min_calibration": 0})
    own = fabricated(ME, P1, [0.5, 0.75, 1.0, 1.25, 1.5])
    few.check(ctx(), [*own, *fabricated("node-3", P1, [3.0])])
    many.check(ctx(), [*own, *fabricated("node-3", P1, [3.0] * 50 + [0.0] * 50)])
    assert few.threshold() == many.threshold() == pytest.approx(1.85)


def test_calibration_accumulates_over_rounds_up_to_its_size() -> None:
    d = Fixed({"min_calibration": 0, "calibration_size": 4, "quantile": 1.0, "margin": 0.0})
    d.check(ctx(), fabricated(ME, P1, [3.0, 3.5]))
    assert d.threshold() == 3.5
    d.check(ctx(), fabricated(ME, P1, [1.0, 1.5, 2.0, 2.5]))  # the two oldest (3.0, 3.5) drop out
    assert list(d.own_scores) == [1.0, 1.5, 2.0, 2.5] and d.threshold() == 2.5


def test_without_own_completions_it_samples_its_own_reference() -> None:
    d = Fixed({"min_calibration": 8})
    verdicts = d.check(ctx(self_id=""), fabricated("node-3", P1, [1.0, 2.0]))
    assert d.sampled == 8 and list(d.own_scores) == [0.5] * 8
    assert d.threshold() == 1.2  # 0.5 + 0.4 = 0.9, raised to the floor
    assert [v.accept for v in verdicts] == [True, False]


def test_claimed_sampling_is_not_checked() -> None:
    """Unlike the same-model checks, another model's sampling is its own business: only the score counts."""
    other = SamplingParams(temperature=0.7, top_k=50, top_p=0.9, max_new_tokens=256)
    d = Fixed({"min_calibration": 0})
    verdicts = d.check(ctx(), [*fabricated(ME, P1, [1.0] * 4), *fabricated("node-1", P1, [0.3, 3.0], other)])
    assert [(v.accept, v.reason) for v in verdicts[4:]] == [(True, ""), (False, "surprisal:high")]


# ------------------------------------------------------------------ the real thing
@pytest.fixture(scope="module")
def task() -> ArithTask:
    return ArithTask()


@pytest.fixture(scope="module")
def prompts(task: ArithTask) -> list[Prompt]:
    return task.sample_prompts(8, "surprisal-test")


def sample(learner: Learner, author: str, prompts: list[Prompt], n: int) -> list[Candidate]:
    seeds = [[completion_seed("run", 1, author, p.id, j) for j in range(n)] for p in prompts]
    texts = learner.generate([p.text for p in prompts], n, SP, seeds=seeds)
    return [
        Candidate(author, p, t, j, SP, learner.model_id)
        for p, ts in zip(prompts, texts, strict=True)
        for j, t in enumerate(ts)
    ]


def poisoned(task: ArithTask, cands: list[Candidate], position: str) -> list[Candidate]:
    attack = TextAttack(AdversaryConfig(name="text", options={"position": position}))
    out = []
    for c in cands:
        text = attack.poison(task, c.prompt, c.text)
        if text is not None:
            out.append(Candidate("node-3", c.prompt, text, c.index, SP, "attacker"))
    return out


@pytest.mark.parametrize(
    ("receiver_model", "author_model"),
    [
        # an English-reading model (the phrase is ~2 nats a character to it, not ~10), its own completions
        ("dgrpo:tiny-arith-code-text", "dgrpo:tiny-arith-code-text"),
        # heterogeneous: a qwen2 receiver reads a llama author's completions
        ("dgrpo:tiny-arith", "dgrpo:tiny-arith-llama"),
    ],
)
def test_own_completions_pass_and_the_text_attack_phrase_does_not(
    task: ArithTask, prompts: list[Prompt], receiver_model: str, author_model: str
) -> None:
    receiver = Learner(ModelConfig(name=receiver_model), LearnerConfig())
    author = receiver if author_model == receiver_model else Learner(ModelConfig(name=author_model), LearnerConfig())
    own = sample(receiver, ME, prompts, 2)  # the receiver's calibration, as in a round
    honest = sample(author, "node-1", prompts, 2)
    attacked = [*poisoned(task, honest, "end"), *poisoned(task, honest, "start")]
    assert len(attacked) >= 24  # most completions have the scratchpad layout the attack needs
    chain = DefenseChain.from_config(DefenseConfig(chain=["surprisal"]))
    verdicts = chain.run(DefenseContext(task, receiver, SP, "run", 1, self_id=ME), [*own, *honest, *attacked]).verdicts
    n = len(own) + len(honest)
    rejected = [c.text for c, v in zip(honest, verdicts[len(own) : n], strict=True) if not v.accept]
    assert rejected == [], rejected
    missed = [c.text for c, v in zip(attacked, verdicts[n:], strict=True) if v.accept]
    assert missed == [], missed
