"""Async mode (``rollout.mode = "async"``, issue 24): the staleness window of the receive and admit stages, late
arrivals, the plan binding per round, and the sampling proof against a stale policy. Worked by hand: S = 2, a step
at round 5 takes rounds 3, 4 and 5."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest

from dgrpo.config import DefenseConfig, LearnerConfig, ModelConfig, RolloutConfig
from dgrpo.daemon.launch import open_daemon
from dgrpo.defense.base import DefenseContext
from dgrpo.defense.chain import DefenseChain
from dgrpo.learner.learner import Learner
from dgrpo.protocol.limits import Limits
from dgrpo.protocol.messages import Rollout, SamplingParams
from dgrpo.round.admit import Admitter
from dgrpo.round.binding import RoundPlan
from dgrpo.round.defend import defend
from dgrpo.round.fill import FillTracker
from dgrpo.round.generate import generate
from dgrpo.round.receive import RoundInbox
from dgrpo.tasks.arith import ArithTask
from dgrpo.tasks.base import Prompt

TASK = ArithTask()
RUN = "run"
SP = SamplingParams(temperature=1.0, top_k=10, top_p=1.0, max_new_tokens=48)
CFG = RolloutConfig(prompts_per_round=2, completions_per_prompt=2, sampler="seeded", mode="async", max_staleness=2)
PLAN = RoundPlan(TASK, CFG, RUN)


def rollout(author: str, round_idx: int, prompt: Prompt, part: int, **kw: Any) -> Rollout:
    fields: dict[str, Any] = {
        "author": author, "round": round_idx, "part": part, "parts": 2, "prompt_id": prompt.id,
        "prompt": prompt.text, "completions": ("a", "b"), "indices": (0, 1), "model_id": "m", "weights": "",
        "sampling": SP, "split": "horizontal",
    }  # fmt: skip
    fields.update(kw)
    return Rollout.model_validate(fields)


def honest(author: str, round_idx: int) -> list[Rollout]:
    return [rollout(author, round_idx, p, i) for i, p in enumerate(PLAN.prompts(author, round_idx))]


def inbox(staleness: int = 2) -> RoundInbox:
    return RoundInbox(Admitter(TASK, "horizontal", Limits(rounds_ahead=2), "me", PLAN), staleness=staleness)


def test_the_window_keeps_s_rounds_back_and_drops_older() -> None:
    box = inbox()
    box.open(5)
    assert box.add(honest("a", 2)[0]) == "closed_round"  # 5 - 2 = 3 is the oldest round taken
    for r in (3, 4, 5, 7):  # 7: two ahead, kept for a later step
        assert box.add(honest("a", r)[0]) is None
        assert box.add(honest("a", r)[1]) is None
    assert box.add(honest("a", 8)[0]) == "future_round"
    assert sorted({r.round for r in box.drain(5)}) == [3, 4, 5]
    box.open(6)  # nothing older than 4 was left to drop; round 7 waits
    assert box.drain(6) == []
    box.open(9)  # S = 2: round 7 is still in the window of step 9
    assert [r.round for r in box.drain(9)] == [7, 7]
    # Behind its peers, an async node keeps their rollouts up to the horizon (it moves up to their round at
    # its next step), not only rounds_ahead past its own round.
    box.horizon = 14
    assert box.add(honest("b", 13)[0]) is None
    assert box.add(honest("b", 15)[0]) == "future_round"
    # With S = 0 (sync mode) the same arrival at round 5 of a round-4 rollout is closed.
    sync = inbox(staleness=0)
    sync.open(5)
    assert sync.add(honest("a", 4)[0]) == "closed_round"


def test_a_late_author_counts_in_the_step_where_it_arrives_whole() -> None:
    box = inbox()
    box.open(5)
    first, second = honest("late", 5)
    assert box.add(first) is None
    assert box.drain(5) == []  # incomplete: its other part is in flight, kept
    box.open(6)
    assert box.add(second) is None  # arrives during step 6: counted there, at staleness 1
    assert sorted((r.round, r.part) for r in box.drain(6)) == [(5, 0), (5, 1)]
    # What was drained is remembered: the same message again is a duplicate, not a second use.
    assert box.add(first) == "duplicate_part"
    # An author that never completes its round is dropped when the round leaves the window.
    assert box.add(honest("half", 6)[0]) is None
    box.open(9)
    assert box.drain(9) == []
    assert box.rejected["closed_round"] == 1


def test_a_step_takes_at_most_the_bound_of_one_peers_rounds_newest_first() -> None:
    """A straggler hears several rounds of each fast peer between two of its steps: with the bound (1, the
    default) it trains on each peer's newest complete round only, as a sync round would, and the older ones wait
    for a later step until they leave the window (without it the step took all three: 3x the work)."""
    box = inbox(staleness=3)
    box.open(6)
    for r in (4, 5, 6):
        for part in honest("fast", r):
            assert box.add(part) is None
    assert box.add(honest("slow", 5)[0]) is None  # incomplete: not counted against the bound
    for part in honest("other", 3):
        assert box.add(part) is None
    drained = box.drain(6, per_author=1)
    assert sorted({(r.author, r.round) for r in drained}) == [("fast", 6), ("other", 3)]
    assert [r.round for r in drained] == sorted(r.round for r in drained)  # oldest first, as before
    # The older ones wait: the next step (nothing newer from "fast") takes round 5, then round 4 has left.
    box.open(7)
    assert {(r.author, r.round) for r in box.drain(7, per_author=1)} == {("fast", 5)}
    box.open(8)  # S = 3: round 4 is still in the window of step 7 but not of step 8
    assert box.drain(8, per_author=1) == []
    # Without the bound everything complete in the window is taken at once.
    unbounded = inbox(staleness=3)
    unbounded.open(6)
    for r in (4, 5, 6):
        for part in honest("fast", r):
            unbounded.add(part)
    assert sorted(r.round for r in unbounded.drain(6)) == [4, 4, 5, 5, 6, 6]


def test_admission_takes_the_window_each_against_its_own_plan() -> None:
    admitter = Admitter(TASK, "horizontal", Limits(), "me", PLAN)
    stale_ok = [*honest("a", 3), *honest("a", 4), *honest("b", 5)]
    too_old = honest("c", 2)
    # b's round-4 parts bound to round 5's plan: off plan (the binding is per author and round).
    p5 = PLAN.prompts("b", 5)
    mixed = [rollout("d", 4, p5[0], 0), rollout("d", 4, p5[1], 1)]
    admission = admitter.admit([*stale_ok, *too_old, *mixed], 5, lambda _: False, staleness=2)
    assert Counter((a.rollout.author, a.rollout.round) for a in admission.admitted) == {
        ("a", 3): 2, ("a", 4): 2, ("b", 5): 2,
    }  # fmt: skip
    assert {p.id for p in PLAN.prompts("d", 4)} != {p.id for p in p5}
    assert admission.rejected_by_author["d"] == 2 and admission.evidence_by_author["d"] == 2  # off_plan
    assert admission.rejected["wrong_round"] == 2  # c's round 2 is beyond S
    # The same rollouts in sync mode: only round 5 is admitted.
    sync = admitter.admit(stale_ok, 5, lambda _: False, staleness=0)
    assert {a.rollout.round for a in sync.admitted} == {5} and sync.rejected == {"wrong_round": 4}


def test_one_author_two_rounds_is_two_plans_not_a_duplicate() -> None:
    admitter = Admitter(TASK, "horizontal", Limits(), "me", PLAN)
    both = [*honest("a", 4), *honest("a", 5)]
    admission = admitter.admit(both, 5, lambda _: False, staleness=1)
    assert len(admission.admitted) == 4 and admission.rejected == {}
    # Within one round the old rules stand: a part sent twice is a duplicate.
    again = admitter.admit([*honest("a", 5), honest("a", 5)[0]], 5, lambda _: False, staleness=1)
    assert again.rejected == {"duplicate_part": 1}


@pytest.fixture(scope="module")
def learner() -> Learner:
    return Learner(ModelConfig(), LearnerConfig())


def test_the_sampling_proof_never_checks_a_stale_rollout_against_newer_weights(learner: Learner) -> None:
    """A rollout sampled two steps ago announces the weights it was sampled with; the receiver has trained since.
    The proof is run only against weights the receiver holds: the stale rollout goes to the foreign chain, which
    here (a homogeneous chain without one) rejects it as route:foreign_model. It is never passed by a proof
    against other weights, and never accepted unchecked."""
    old = learner.weights_digest()
    stale = generate(TASK, learner, CFG, SP, RUN, "peer", 3, None, old)
    before = {k: v.detach().clone() for k, v in learner.model.state_dict().items()}
    try:
        with_grad = [p for p in learner.model.parameters() if p.requires_grad]
        for p in with_grad[:1]:  # "train": any change of the weights changes their digest
            p.data.add_(0.01)
        new = learner.weights_digest()
        assert new != old
        fresh = generate(TASK, learner, CFG, SP, RUN, "peer", 5, None, new)
        admitter = Admitter(TASK, "horizontal", Limits(), "me", PLAN, learner.canonical_text)
        admission = admitter.admit([*stale, *fresh], 5, lambda _: False, staleness=2)
        assert len(admission.admitted) == 4
        ctx = DefenseContext(TASK, learner, SP, RUN, 5, learner.model_id, new, "me")
        chain = DefenseChain.from_config(DefenseConfig(chain=["sampling-proof"]))
        kept, outcome = defend(chain, None, ctx, admission.admitted, "me")
        assert outcome is not None
        by_round = {r.prompt_id: r.round for r in [*stale, *fresh]}
        verdicts = {(by_round.get(c.prompt_id, -1), c.reason) for c in outcome.checked}
        assert {reason for rnd, reason in verdicts if rnd == 3} == {"route:foreign_model"}
        assert len(kept) == 4  # the fresh round's completions pass the proof against the weights they announce
    finally:
        learner.model.load_state_dict(before)


def test_windowed_advantages_by_hand() -> None:
    from dgrpo.learner.grpo import group_advantages
    from dgrpo.round.group_memory import GroupMemory, windowed_advantages

    # One completion of prompt p this step (reward 1), three of p from earlier steps (0, 0, 1): the group is
    # {1, 0, 0, 1}, mean 0.5, unbiased std sqrt(1/3) = 0.5774, so A = 0.5 / 0.5774 = 0.8660.
    assert windowed_advantages([1.0], ["p"], {"p": [0.0, 0.0, 1.0]}, eps=0.0) == pytest.approx([0.8660254])
    # Alone in its step it would get 0 (a group of one).
    assert group_advantages([1.0], ["p"]) == [0.0]
    # Unscaled (Dr. GRPO): r - mean = 0.5; no history: GRPO's own group advantage.
    assert windowed_advantages([1.0], ["p"], {"p": [0.0, 0.0, 1.0]}, scale=False) == [0.5]
    r, g = [1.0, 0.0, 0.5, 0.5], ["a", "a", "b", "c"]
    assert windowed_advantages(r, g, {}) == group_advantages(r, g)
    # The memory keeps S + 1 steps: a step at round 4 with S = 2 sees what was scored at rounds 2 and 3.
    memory = GroupMemory(window=3)
    memory.remember(1, [1.0], ["p"])
    memory.remember(2, [0.0, 1.0], ["p", "q"])
    memory.remember(3, [0.0], ["p"])
    assert memory.history(4) == {"p": [0.0, 0.0], "q": [1.0]}
    assert memory.history(6) == {}


def test_a_simulation_refuses_async_mode_with_a_clear_error() -> None:
    from dgrpo.errors import ConfigError
    from dgrpo.simulations.scenario import load_scenario

    with pytest.raises(ConfigError, match="lock-step"):
        load_scenario(overrides=["rollout.mode='async'"])


def test_an_async_node_ahead_of_the_network_waits_for_half_of_it_never_for_a_straggler(tmp_path: Any) -> None:
    """``Daemon._keep_pace``: at round 10 with ``rounds_ahead`` 2, a node waits while the upper median of its peers'
    progress is below 8, and goes on as soon as it reaches 8; one straggler far behind does not hold it (the
    upper median of two peers is the more advanced one); with nothing heard (0) it never waits; the wait is
    bounded by ``deadline_seconds``."""
    import trio

    from dgrpo.daemon.settings import load_node_settings

    sets = [f"state_dir={str(tmp_path)!r}", "status.enabled=false", "rollout.mode='async'",
            "rounds.deadline_seconds=3"]  # fmt: skip
    daemon = open_daemon(load_node_settings(None, sets))
    peers = {"a": 7, "b": 7}
    daemon.network_round = lambda: sorted(peers.values())[len(peers) // 2]  # type: ignore[method-assign]
    daemon.round = 10

    async def main() -> list[float]:
        marks = []
        async with trio.open_nursery() as nursery:
            nursery.start_soon(daemon._keep_pace)
            await trio.sleep(0.5)
            marks.append(daemon.paced_steps)  # still waiting: nothing counted yet
            peers["b"] = 8  # with a straggler at 7, the front is at 8: within reach
        marks.append(daemon.paced_steps)
        return marks

    assert trio.run(main) == [0, 1]
    assert 0.4 < daemon.paced_seconds < 2.0
    peers.update(a=0, b=0)  # nothing heard: no wait
    trio.run(daemon._keep_pace)
    assert daemon.paced_steps == 1
    peers.update(a=3, b=4)  # far behind, and stays so: the wait ends at the deadline
    trio.run(daemon._keep_pace)
    assert daemon.paced_steps == 2 and daemon.paced_seconds > 3.0


def test_the_fill_tracker_counts_what_a_step_lacks_against_a_full_one() -> None:
    # share 16 a peer and round. Two peers on time (bunched: a's two rounds, then none), then a straggler z heard
    # once: a full step is 16 from every peer heard in the window (3 steps here), whatever arrived in one step.
    tracker = FillTracker(window=3)
    steps = [{"a": 16, "b": 16}, {"a": 32, "b": 16}, {"b": 16}, {"a": 16, "z": 16}, {"a": 16}, {"a": 16}, {"a": 16}]
    assert [tracker.deficit(d, 16) for d in steps] == [0, 0, 16, 16, 32, 16, 0]
    # the 5th: a, b and z heard in the last 3 steps (48), 16 came; the 7th: only a left in the window
    assert FillTracker().deficit({}, 16) == 0  # a node that hears nobody fills nothing: it has no peers to stand in for


def test_a_filled_step_trains_on_new_own_completions_past_the_published_ones(learner: Learner) -> None:
    """The fill writes the deficit (rounded up to whole prompts) as the node's own for the step's prompts, at
    indices past its published share and with seeds of their own (new samples, not copies); consume trains on
    them with the rest (they are the node's own: the draw always keeps them) and never admits them."""
    from dgrpo.round.node import Node

    node = Node("me", RUN, TASK, learner, CFG, SP)
    own = node.produce(4)
    local = node.fill(4, 3)  # 3 over 2 prompts: 2 each
    assert [a.rollout.indices for a in local] == [(2, 3), (2, 3)]
    assert [a.prompt.id for a in local] == [r.prompt_id for r in own]
    assert all(a.rollout.author == "me" and a.rollout.round == 4 for a in local)
    seeded = generate(TASK, learner, CFG.model_copy(update={"completions_per_prompt": 4}), SP, RUN, "me", 4)
    assert [a.rollout.completions for a in local] == [r.completions[2:] for r in seeded]  # the seeded sampler's
    outcome = node.consume(4, own, local)
    assert outcome.filled == 4
    assert len(outcome.scoring.scored) == 8  # 4 published + 4 filled, every one the node's own
    assert outcome.admission.messages == 2  # only the published rollouts went through admission
    assert node.fill(5, 0) == []
