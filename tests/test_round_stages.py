"""Each stage of the round alone, with inputs made by hand: admit, defend, score, advantages, update."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import ClassVar

import pytest

from dgrpo.config import LearnerConfig, ModelConfig, ReputationConfig
from dgrpo.defense.base import Candidate, Defense, DefenseContext, Verdict
from dgrpo.defense.chain import DefenseChain
from dgrpo.defense.reputation import Reputation
from dgrpo.learner.learner import Learner
from dgrpo.protocol.limits import Limits
from dgrpo.protocol.messages import DEFAULT_SAMPLING, Rollout
from dgrpo.round.admit import ARRIVAL_REASONS, CLOSE_REASONS, Admitter, arrival_reason
from dgrpo.round.advantages import advantages
from dgrpo.round.defend import defend
from dgrpo.round.outcome import Admitted, Kept, ScoredCompletion
from dgrpo.round.score import score
from dgrpo.round.update import update
from dgrpo.tasks.arith import ArithTask
from dgrpo.tasks.base import Prompt

TASK = ArithTask()
P0, P1 = TASK.train_prompt(0), TASK.train_prompt(1)


def rollout(author: str, of: Prompt, round_idx: int = 3, part: int = 0, parts: int = 1, **kw: object) -> Rollout:
    fields: dict[str, object] = {
        "author": author,
        "round": round_idx,
        "part": part,
        "parts": parts,
        "prompt_id": of.id,
        "prompt": of.text,
        "completions": ("a", "b"),
        "model_id": "m",
        "weights": "",
        "sampling": DEFAULT_SAMPLING,
        "split": "horizontal",
    }
    fields.update(kw)
    fields.setdefault("indices", tuple(range(len(fields["completions"]))))  # type: ignore[arg-type]
    return Rollout.model_validate(fields)


# ---------------------------------------------------------------------------------------------- admit
def test_arrival_reasons_in_order() -> None:
    limits = Limits(rounds_ahead=1, messages_per_round=2)
    seen = {("a", 0)}
    assert arrival_reason(rollout("b", P0, round_idx=2), 3, 0, seen, limits) == "closed_round"
    assert arrival_reason(rollout("b", P0, round_idx=5), 3, 0, seen, limits) == "future_round"
    assert arrival_reason(rollout("b", P0, round_idx=4), 3, 0, seen, limits) is None  # one ahead: kept
    bad = rollout("b", P0).model_copy(update={"part": 2, "parts": 1})  # (built past the model's own check)
    assert arrival_reason(bad, 3, 0, seen, limits) == "bad_part"
    assert arrival_reason(rollout("a", P0), 3, 1, seen, limits) == "duplicate_part"
    assert arrival_reason(rollout("b", P0), 3, 2, seen, limits) == "round_full"
    assert arrival_reason(rollout("b", P0), 3, 1, seen, limits) is None
    # An author holding its quota (its plan's parts) already: a flood, caught before round_full.
    assert arrival_reason(rollout("b", P0), 3, 2, seen, limits, author_held=8, quota=8) == "over_quota"
    assert arrival_reason(rollout("b", P0), 3, 0, seen, limits, author_held=7, quota=8) is None


def test_a_flooding_author_is_held_to_its_plan_and_reported_as_evidence() -> None:
    """One peer sending far more rollouts than its plan's parts must neither fill the round for the others
    (before: a global cap of 10,000 messages, so a flood made honest peers' rollouts ``round_full``) nor go
    unreported: each message over its quota is ``over_quota``, counted by author and reported as evidence."""
    from dgrpo.config.rollout import RolloutConfig
    from dgrpo.round.binding import RoundPlan
    from dgrpo.round.receive import RoundInbox

    plan = RoundPlan(TASK, RolloutConfig(prompts_per_round=2, completions_per_prompt=2), "run")
    admitter = Admitter(TASK, "horizontal", Limits(messages_per_round=50), "me", plan=plan)
    evidence: list[tuple[str, str]] = []
    admitter.on_evidence = lambda author, reason: evidence.append((author, reason))
    inbox = RoundInbox(admitter)
    inbox.open(3)
    flood = [rollout("x", P0, part=i, parts=1000) for i in range(200)]
    reasons = Counter(inbox.add(r) for r in flood)
    assert reasons == {None: 2, "over_quota": 198}
    honest = [rollout("h", P0, part=0, parts=2), rollout("h", P1, part=1, parts=2)]
    assert [inbox.add(r) for r in honest] == [None, None]  # the round still has room for everyone else
    assert evidence == [("x", "over_quota")] * 198
    stats = admitter.statistics()
    assert stats.rejected_by_reason["over_quota"] == 198 and stats.rejected_by_author == {"x": 198}
    assert inbox.complete(3, {"h"})


def test_admission_at_close_counts_every_reason_by_author() -> None:
    admitter = Admitter(TASK, "horizontal", Limits(), "me")
    rollouts = [
        rollout("me", P0),
        rollout("a", P0),
        rollout("a", P0),  # the same (author, part) again
        rollout("b", P1, round_idx=4),
        rollout("c", P1, split="vertical"),
        rollout("d", P1, prompt_id="arith/nope", prompt="x"),
        rollout("e", P1, prompt="a different question"),
        rollout("f", P1),  # blacklisted
    ]
    admission = admitter.admit(rollouts, 3, blacklisted=lambda peer: peer == "f")
    assert [(a.rollout.author, a.prompt.id) for a in admission.admitted] == [("a", P0.id), ("me", P0.id)]
    assert admission.rejected == {
        "duplicate_part": 1,
        "wrong_round": 1,
        "wrong_split": 1,
        "unknown_prompt": 1,
        "prompt_mismatch": 1,
        "blacklisted": 1,
    }
    assert admission.rejected_by_author == {"a": 1, "b": 1, "c": 1, "d": 1, "e": 1, "f": 1}
    # Every rejected peer's completions are reported as dropped, with the reason (simulations count them).
    assert Counter((c.author, c.reason) for c in admission.dropped) == {
        ("a", "duplicate_part"): 2, ("b", "wrong_round"): 2, ("c", "wrong_split"): 2, ("d", "unknown_prompt"): 2,
        ("e", "prompt_mismatch"): 2, ("f", "blacklisted"): 2,
    }  # fmt: skip
    assert admission.evidence_by_author == {"e": 1}  # a forged prompt text is evidence; the others may be accidents
    assert (admission.messages, admission.completions_received) == (8, 16)
    # Without a plan and a tokenizer (tests/test_binding.py has those rules), the structural reasons only.
    assert set(admission.rejected) == set(CLOSE_REASONS[:6])
    # The admitted prompt is the task's own object, never the peer's copy.
    assert admission.admitted[0].prompt == TASK.prompt_by_id(P0.id)
    # Arrival and close share the counters.
    admitter.on_arrival(rollout("g", P0, round_idx=1), 3, 0, set())
    stats = admitter.statistics()
    assert stats.rejected_by_reason["closed_round"] == 1 and stats.rejected_by_author["g"] == 1
    assert set(ARRIVAL_REASONS) >= {"closed_round"}


# ---------------------------------------------------------------------------------------------- defend
class RejectB(Defense):
    """Rejects the completion ``b``, halves the reward of ``h``."""

    name: ClassVar[str] = "reject-b"

    def check(self, ctx: DefenseContext, candidates: Sequence[Candidate]) -> list[Verdict]:
        return [
            self.reject("is-b") if c.text == "b" else Verdict(True, reward_scale=0.5 if c.text == "h" else 1.0)
            for c in candidates
        ]


def test_defend_filters_our_own_completions_but_counts_only_peers() -> None:
    admitted = [
        Admitted(rollout("me", P0, completions=("a", "b")), P0),
        Admitted(rollout("x", P0, completions=("b", "h", "b")), P0),
    ]
    ctx = DefenseContext(TASK, None, DEFAULT_SAMPLING, "run", 3)
    reputation = Reputation(ReputationConfig(min_completions=3, threshold=0.6))
    kept, outcome = defend(DefenseChain([RejectB()]), reputation, ctx, admitted, "me")
    assert [(k.author, k.text, k.reward_scale) for k in kept] == [("me", "a", 1.0), ("x", "h", 0.5)]
    assert outcome is not None
    assert outcome.checked_by_author == {"x": 3} and outcome.rejected_by_author == {"x": 2}
    assert outcome.rejected == {"reject-b:is-b": 2}
    assert [(c.text, c.accepted) for c in outcome.checked] == [("b", False), ("h", True), ("b", False)]
    assert outcome.blacklisted_now == ("x",)  # 2/3 >= 0.6 over 3 completions
    assert reputation.is_blacklisted("x")


def test_without_a_chain_everything_admitted_is_kept() -> None:
    admitted = [Admitted(rollout("x", P0, completions=("a", "b")), P0)]
    kept, outcome = defend(None, None, DefenseContext(TASK, None, DEFAULT_SAMPLING, "run", 3), admitted, "me")
    assert outcome is None
    assert [(k.author, k.text, k.reward_scale) for k in kept] == [("x", "a", 1.0), ("x", "b", 1.0)]


# ---------------------------------------------------------------------------------------------- score
def test_score_uses_our_reward_and_the_reward_scale() -> None:
    right = TASK.reference_completion(P0)
    assert right is not None
    kept = [Kept("x", P0, right), Kept("y", P0, right, 0.5), Kept("y", P0, "garbage"), Kept("x", P1, right)]
    scoring = score(TASK, kept)
    assert [s.reward for s in scoring.scored] == [1.0, 0.5, 0.0, 0.0]  # the last: P0's answer to P1
    assert scoring.mean_reward == pytest.approx(1.5 / 4)
    assert scoring.mean_reward_of("y") == pytest.approx(0.25)
    assert scoring.seconds >= 0.0


# ---------------------------------------------------------------------------------------------- advantages
def test_advantages_are_group_relative_with_the_sample_std() -> None:
    scored = [ScoredCompletion("a", P0, t, r) for t, r in zip("wxyz", (1.0, 0.0, 1.0, 1.0), strict=True)]
    scored.append(ScoredCompletion("a", P1, "v", 1.0))  # a group of one: no spread, advantage 0
    # P0: mean 0.75, sample std sqrt((3 * 0.25^2 + 0.75^2) / 3) = 0.5
    eps = 1e-4
    expected = [0.25 / (0.5 + eps), -0.75 / (0.5 + eps), 0.25 / (0.5 + eps), 0.25 / (0.5 + eps), 0.0]
    assert advantages(scored, LearnerConfig(advantage_eps=eps)) == pytest.approx(expected)
    unscaled = advantages(scored, LearnerConfig(scale_rewards=False))
    assert unscaled == pytest.approx([0.25, -0.75, 0.25, 0.25, 0.0])


# ---------------------------------------------------------------------------------------------- update
def test_update_trains_on_the_scored_completions(random_model_dir: Path) -> None:
    learner = Learner(ModelConfig(name=str(random_model_dir)), LearnerConfig(lr=1e-2))
    before = learner.weights_digest()
    assert update(learner, [], [], DEFAULT_SAMPLING) is None
    assert learner.weights_digest() == before
    scored = [ScoredCompletion("a", P0, "12", 1.0), ScoredCompletion("b", P0, "99", 0.0)]
    step = update(learner, scored, [1.0, -1.0], DEFAULT_SAMPLING)
    assert step is not None and step.sequences == 2
    assert learner.weights_digest() != before


def test_admission_counters_by_author_and_reason_keep_a_bounded_number_of_authors() -> None:
    # Authors are authenticated but free to make (one key each): a flood of made-up authors must not grow the
    # per-author table past limits.max_tracked_peers, and the by-reason totals still count every rejection.
    admitter = Admitter(TASK, "horizontal", Limits(max_tracked_peers=3), "self")
    for i in range(50):
        admitter.on_arrival(rollout(f"sybil-{i}", P0, round_idx=1), 3, 0, set())
    admitter.admit([rollout("sybil-49", P0, round_idx=2)], 3, lambda author: False)
    stats = admitter.statistics()
    assert stats.rejected_by_reason == {"closed_round": 50, "wrong_round": 1}
    assert stats.rejected_by_author == {"sybil-47": 1, "sybil-48": 1, "sybil-49": 2}
    assert stats.rejected_by_author_reason == {
        "sybil-47": {"closed_round": 1},
        "sybil-48": {"closed_round": 1},
        "sybil-49": {"closed_round": 1, "wrong_round": 1},
    }
