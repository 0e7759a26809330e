"""Plan binding, canonical text, the group rule, evidence and routing (issue 12): every rule with its reason,
worked by hand, and each exchange adversary against the real tiny model and the real sampling proof."""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from dgrpo.adversary import build_adversary
from dgrpo.config import AdversaryConfig, DefenseConfig, LearnerConfig, ModelConfig, ReputationConfig, RolloutConfig
from dgrpo.defense.base import ACCEPT, Candidate, DefenseContext, Verdict
from dgrpo.defense.chain import DefenseChain
from dgrpo.defense.reputation import Reputation
from dgrpo.errors import ConfigError
from dgrpo.learner.learner import Learner
from dgrpo.protocol.limits import Limits
from dgrpo.protocol.messages import Rollout, SamplingParams
from dgrpo.round.admit import EVIDENCE_REASONS, Admitter
from dgrpo.round.binding import RoundPlan, planned_prompts, rollout_reason
from dgrpo.round.defend import defend, group_rule
from dgrpo.round.generate import generate
from dgrpo.simulations.scenario import build_scenario
from dgrpo.tasks.arith import ArithTask
from dgrpo.tasks.base import Prompt

TASK = ArithTask()
RUN, ROUND = "run", 3
SP = SamplingParams(temperature=1.0, top_k=10, top_p=1.0, max_new_tokens=48)
HORIZONTAL = RolloutConfig(prompts_per_round=3, completions_per_prompt=2, sampler="seeded")
PLAN = RoundPlan(TASK, HORIZONTAL, RUN)
DOC = Path(__file__).resolve().parent.parent / "docs" / "protocol.md"


def rollout(author: str, prompt: Prompt, part: int, **kw: Any) -> Rollout:
    fields: dict[str, Any] = {
        "author": author, "round": ROUND, "part": part, "parts": 3, "prompt_id": prompt.id, "prompt": prompt.text,
        "completions": ("a", "b"), "model_id": "m", "weights": "", "sampling": SP, "split": "horizontal",
    }  # fmt: skip
    fields.update(kw)
    fields.setdefault("indices", tuple(range(len(fields["completions"]))))
    return Rollout.model_validate(fields)


def honest(author: str) -> list[Rollout]:
    return [rollout(author, p, i) for i, p in enumerate(PLAN.prompts(author, ROUND))]


# ------------------------------------------------------------------------------------------ the plan
def test_plan_test_vectors_match_the_protocol_document() -> None:
    doc = DOC.read_text()

    def vector(name: str) -> str:
        match = re.search(rf"<!-- test-vector: {name} -->\n`([^`]*)`", doc)
        assert match is not None, name
        return match.group(1)

    fmt = ", ".join
    h = planned_prompts(TASK, RolloutConfig(prompts_per_round=3), "demo-run", "node-1", 7)
    v = planned_prompts(TASK, RolloutConfig(prompts_per_round=3, split="vertical"), "demo-run", "node-1", 7)
    assert vector("plan-horizontal") == fmt(f"{p.id} ({p.text})" for p in h)
    assert vector("plan-vertical") == fmt(f"{p.id} ({p.text})" for p in v)
    # The horizontal plan is everyone's; the vertical one is the author's own.
    assert h == planned_prompts(TASK, RolloutConfig(prompts_per_round=3), "demo-run", "node-2", 7)
    other = planned_prompts(TASK, RolloutConfig(prompts_per_round=3, split="vertical"), "demo-run", "node-2", 7)
    assert {p.id for p in other} != {p.id for p in v}


def test_each_rollout_rule_by_hand() -> None:
    planned = {"p1", "p2", "p3"}
    base = rollout("x", TASK.train_prompt(0), 0, prompt_id="p1")
    assert rollout_reason(base, planned, 3, 2) is None
    assert rollout_reason(base.model_copy(update={"parts": 4}), planned, 3, 2) == "wrong_parts"
    assert rollout_reason(base.model_copy(update={"prompt_id": "p9"}), planned, 3, 2) == "off_plan"
    three = base.model_copy(update={"completions": ("a", "b", "c"), "indices": (0, 1, 2)})
    assert rollout_reason(three, planned, 3, 2) == "over_share"
    assert rollout_reason(base.model_copy(update={"indices": (0, 0)}), planned, 3, 2) == "bad_index"
    assert rollout_reason(base.model_copy(update={"indices": (0, 2)}), planned, 3, 2) == "bad_index"
    assert rollout_reason(base.model_copy(update={"indices": (1, 0)}), planned, 3, 2) is None  # any order
    one = base.model_copy(update={"completions": ("a",), "indices": (1,)})
    assert rollout_reason(one, planned, 3, 2) == "withheld"  # index 0 is missing: withholding is visible


def test_admission_binds_every_author_to_its_plan() -> None:
    admitter = Admitter(TASK, "horizontal", Limits(), "me", PLAN, canonical=lambda t: t.replace("\t", ""))
    p = PLAN.prompts("", ROUND)
    off = next(q for q in TASK.sample_prompts(12, "elsewhere") if q.id not in {x.id for x in p})
    rollouts = [
        *honest("me"),
        *honest("a"),
        *[rollout("b", q, i) for i, q in enumerate([p[0], p[1], off])],  # answers another prompt than p[2]
        *[rollout("c", q, i, **({"completions": ("a", "b", "c")} if i == 0 else {})) for i, q in enumerate(p)],
        *[rollout("d", q, i, parts=4) for i, q in enumerate(p)],
        *[rollout("e", q, i) for i, q in enumerate([p[0], p[0], p[1]])],  # p[0] twice, p[2] missing
        *[rollout("f", q, i, **({"completions": ("a",), "indices": (1,)} if i == 1 else {})) for i, q in enumerate(p)],
        *[rollout("g", q, i, **({"completions": ("4\t2", "b")} if i == 2 else {})) for i, q in enumerate(p)],
        *[rollout("h", q, i) for i, q in enumerate(p[:2])],  # its last part never arrived
    ]
    admission = admitter.admit(rollouts, ROUND, blacklisted=lambda _: False)
    assert Counter(a.rollout.author for a in admission.admitted) == {"me": 3, "a": 3}
    assert admission.rejected == {
        "off_plan": 1, "over_share": 1, "wrong_parts": 3, "duplicate_prompt": 1, "withheld": 1, "non_canonical": 1,
        "incomplete": 2 + 2 + 2 + 2 + 2 + 2,  # b, c, e, f, g: the rest of their round; h: both parts
    }  # fmt: skip
    assert admission.rejected_by_author == {"b": 3, "c": 3, "d": 3, "e": 3, "f": 3, "g": 3, "h": 2}
    # Evidence: what no honest peer does; an incomplete round may be the network's doing.
    assert admission.evidence_by_author == {"b": 1, "c": 1, "d": 3, "e": 1, "f": 1, "g": 1}
    assert "incomplete" not in EVIDENCE_REASONS
    # Every rejected completion is reported with its reason (simulations count it as stopped).
    assert sum(1 for c in admission.dropped if c.author == "c") == 3 + 2 + 2


def test_quorum_counts_the_plan_not_the_announced_parts() -> None:
    from dgrpo.round.receive import RoundInbox

    inbox = RoundInbox(Admitter(TASK, "horizontal", Limits(), "me", PLAN))
    inbox.open(ROUND)
    for r in honest("a")[:2]:
        assert inbox.add(r) is None
    liar = [rollout("z", q, 0, parts=1) for q in PLAN.prompts("", ROUND)[:1]]  # announces a round of one part
    assert inbox.add(liar[0]) is None
    assert not inbox.complete(ROUND, ["a"]) and not inbox.complete(ROUND, ["z"])
    inbox.add(honest("a")[2])
    assert inbox.complete(ROUND, ["a"])


# ------------------------------------------------------------------------------------- group rule
def test_a_failed_proof_rejects_the_authors_whole_group() -> None:
    p, q = TASK.train_prompt(0), TASK.train_prompt(1)
    cands = [Candidate(a, pr, t, i, SP, "m") for a, pr, t, i in
             [("x", p, "1", 0), ("x", p, "2", 1), ("x", q, "3", 0), ("y", p, "4", 0)]]  # fmt: skip
    verdicts = [ACCEPT, Verdict(False, "sampling-proof:diverged"), ACCEPT, ACCEPT]
    out = group_rule(cands, verdicts, frozenset({"sampling-proof"}))
    assert [v.reason for v in out] == ["sampling-proof:group", "sampling-proof:diverged", "", ""]
    # A rejection by a filter that is not a proof (honest FPR above 0) leaves the group alone.
    assert group_rule(cands, [ACCEPT, Verdict(False, "length:long"), ACCEPT, ACCEPT], frozenset()) == [
        ACCEPT, Verdict(False, "length:long"), ACCEPT, ACCEPT,
    ]  # fmt: skip


# -------------------------------------------------------------------------------------- reputation
def test_evidence_is_not_diluted_by_honest_completions() -> None:
    rep = Reputation(ReputationConfig(window=5, threshold=0.5, min_completions=8, max_evidence=3))
    for r in range(1, 3):
        rep.record(r, "x", received=100, rejected=1, evidence=1)  # 1% rejected: far under the rate threshold
        assert rep.update(r) == []
    rep.record(3, "x", received=100, rejected=1, evidence=1)
    assert rep.update(3) == ["x"] and rep.snapshot()["x"]["evidence"] == 3
    restored = Reputation(rep.cfg)
    restored.load(rep.to_dict())
    assert restored.evidence == {"x": 3} and restored.is_blacklisted("x")
    # Without evidence the same rejection rate never blacklists.
    plain = Reputation(rep.cfg)
    for r in range(1, 30):
        plain.record(r, "y", received=100, rejected=1)
        assert plain.update(r) == []


# ----------------------------------------------------------------------------------------- routing
class Everything:
    """A context whose own model is ``m`` with weights ``w``."""

    ctx = DefenseContext(TASK, None, SP, RUN, ROUND, "m", "a" * 64)


def test_same_model_checks_only_see_authors_with_our_weights() -> None:
    p = TASK.train_prompt(0)
    mine = Candidate("x", p, "1+1=2", 0, SP, "m", "a" * 64)
    foreign = Candidate("y", p, "1+1=2", 0, SP, "m", "b" * 64)
    other_model = Candidate("z", p, "1+1=2", 0, SP, "other", "a" * 64)
    chain = DefenseChain.from_config(DefenseConfig(chain=["length", "logit"]))
    # No model is needed to route: logit would raise without one, so only routing can keep these verdicts.
    verdicts = chain.run(Everything.ctx, [foreign, other_model]).verdicts
    assert [v.reason for v in verdicts] == ["route:foreign_model"] * 2
    routed = DefenseChain.from_config(DefenseConfig(chain=["logit"], foreign=["length"]))
    assert routed.run(Everything.ctx, [foreign]).verdicts == [ACCEPT]
    assert routed.run(Everything.ctx, [mine]).verdicts[0].reason == "logit:error"  # it did reach logit
    # A chain without same-model checks treats every author alike.
    assert DefenseChain.from_config(DefenseConfig(chain=["length"])).run(Everything.ctx, [foreign]).verdicts == [ACCEPT]


def test_model_checks_are_configuration_errors_where_they_cannot_apply() -> None:
    with pytest.raises(ValueError, match="same-model check"):
        DefenseConfig(chain=["length"], foreign=["sampling-proof"])
    with pytest.raises(ConfigError, match="heterogeneous network") as info:
        build_scenario({"nodes": {"mode": "heterogeneous"}, "defense": {"chain": ["logit"]}})
    assert "own model and weights" in str(info.value)
    build_scenario({"nodes": {"mode": "heterogeneous"}, "defense": {"chain": ["length"]}})  # fine


def test_the_same_model_flags_match_the_configuration_list() -> None:
    from dgrpo.config import SAME_MODEL_DEFENSES
    from dgrpo.defense.registry import DEFENSES

    flagged = {name for name in DEFENSES.names() if DEFENSES.get(name).same_model}
    assert flagged == set(SAME_MODEL_DEFENSES)


# ------------------------------------------------------------------- the exchange adversaries, for real
@pytest.fixture(scope="module")
def learner() -> Learner:
    return Learner(ModelConfig(), LearnerConfig())


def publish(learner: Learner, name: str, rollout_cfg: RolloutConfig = HORIZONTAL, **options: Any) -> list[Rollout]:
    adversary = build_adversary(AdversaryConfig(name=name, options=options))
    return generate(TASK, learner, rollout_cfg, SP, RUN, "node-3", ROUND, adversary, learner.weights_digest())


def receive(learner: Learner, rollouts: list[Rollout], chain: list[str] | None = None) -> tuple[Any, Any]:
    """Admission and the defend stage of an honest receiver holding the same weights."""
    admitter = Admitter(TASK, "horizontal", Limits(), "me", PLAN, learner.canonical_text)
    admission = admitter.admit(rollouts, ROUND, blacklisted=lambda _: False)
    ctx = DefenseContext(TASK, learner, SP, RUN, ROUND, learner.model_id, learner.weights_digest())
    cfg = DefenseConfig(chain=chain or ["sampling-proof"])
    rep = Reputation(ReputationConfig())
    admitted = admission.admitted
    _, outcome = defend(DefenseChain.from_config(cfg), rep, ctx, admitted, "me", admission.evidence_by_author)
    return admission, outcome


def proof_of(learner: Learner, rollouts: list[Rollout]) -> list[bool]:
    """Whether ``sampling-proof`` alone accepts each completion, given its claimed index (no binding)."""
    chain = DefenseChain.from_config(DefenseConfig(chain=["sampling-proof"]))
    ctx = DefenseContext(TASK, learner, SP, RUN, ROUND, learner.model_id, learner.weights_digest())
    cands = [
        Candidate(r.author, TASK.prompt_by_id(r.prompt_id) or TASK.train_prompt(0), t, i, r.sampling, r.model_id,
                  r.weights)
        for r in rollouts for i, t in zip(r.indices, r.completions, strict=True)
    ]  # fmt: skip
    return [v.accept for v in chain.run(ctx, cands).verdicts]


def test_honest_rollouts_pass_every_rule_and_the_proof(learner: Learner) -> None:
    rollouts = generate(TASK, learner, HORIZONTAL, SP, RUN, "node-3", ROUND, None, learner.weights_digest())
    admission, outcome = receive(learner, rollouts)
    assert len(admission.admitted) == 3 and admission.rejected == {}
    assert outcome.rejected == {} and outcome.blacklisted_now == ()
    # Completions are the decoding of sampled tokens: canonical.
    assert all(learner.canonical_text(c) == c for r in rollouts for c in r.completions)


def test_select_withholding_a_draw_is_rejected(learner: Learner) -> None:
    rollouts = publish(learner, "select", keep=1)
    assert all(len(r.completions) == 1 for r in rollouts)
    assert all(proof_of(learner, rollouts))  # each string is a genuine draw: the proof alone cannot see it
    admission, _ = receive(learner, rollouts)
    assert admission.admitted == () and admission.rejected == {"withheld": 3}


def test_select_substituting_a_draw_loses_the_whole_group(learner: Learner) -> None:
    four = HORIZONTAL.model_copy(update={"completions_per_prompt": 4})
    rollouts = publish(learner, "select", four, keep=1, mode="substitute")
    changed = [r for r in rollouts if len(set(r.completions)) < len(set(generate(
        TASK, learner, four, SP, RUN, "node-3", ROUND)[r.part].completions))]  # fmt: skip
    assert changed, "the attacker substituted nothing"
    admitter = Admitter(TASK, "horizontal", Limits(), "me", RoundPlan(TASK, four, RUN), learner.canonical_text)
    admission = admitter.admit(rollouts, ROUND, blacklisted=lambda _: False)
    assert len(admission.admitted) == 3  # binding cannot tell: every index is present
    ctx = DefenseContext(TASK, learner, SP, RUN, ROUND, learner.model_id, learner.weights_digest())
    chain = DefenseChain.from_config(DefenseConfig(chain=["sampling-proof"]))
    _, outcome = defend(chain, Reputation(ReputationConfig()), ctx, admission.admitted, "me")
    assert outcome is not None
    rejected = {c.prompt_id for c in outcome.checked if not c.accepted}
    assert rejected == {r.prompt_id for r in changed}
    for r in changed:  # the whole group goes: the substituted indices by the proof, the kept draw by the rule
        reasons = [c.reason for c in outcome.checked if c.prompt_id == r.prompt_id]
        assert len(reasons) == 4 and "sampling-proof:group" in reasons and "sampling-proof:diverged" in reasons


def test_over_publishing_genuine_draws_is_rejected(learner: Learner) -> None:
    rollouts = publish(learner, "over-publish", factor=4)
    assert [r.indices for r in rollouts] == [tuple(range(8))] * 3
    assert all(proof_of(learner, rollouts))  # indices 2..7 are genuine draws too
    admission, outcome = receive(learner, rollouts)
    assert admission.rejected == {"over_share": 3} and admission.evidence_by_author == {"node-3": 3}
    assert outcome.blacklisted_now == ("node-3",)  # 3 pieces of evidence in one round


@pytest.mark.parametrize(("mode", "reasons"), [
    ("extra", {"wrong_parts": 12}),
    ("replace", {"duplicate_prompt": 1, "incomplete": 2}),
])  # fmt: skip
def test_repeating_a_draw_in_extra_parts_is_rejected(learner: Learner, mode: str, reasons: dict[str, int]) -> None:
    rollouts = publish(learner, "repeat-part", copies=3 if mode == "extra" else 1, mode=mode)
    assert len(rollouts) == (12 if mode == "extra" else 3)
    admission, _ = receive(learner, rollouts)
    assert admission.admitted == () and admission.rejected == reasons


def test_off_plan_prompts_are_rejected(learner: Learner) -> None:
    rollouts = publish(learner, "off-plan")
    assert not {r.prompt_id for r in rollouts} & PLAN.ids("", ROUND)
    assert all(proof_of(learner, rollouts))  # genuine seeded draws for the prompts it chose
    admission, _ = receive(learner, rollouts)
    assert admission.rejected == {"off_plan": 3}


def test_non_canonical_text_is_rejected(learner: Learner) -> None:
    cfg = HORIZONTAL.model_copy(update={"completions_per_prompt": 4, "prompts_per_round": 4})
    rollouts = publish(learner, "non-canonical", cfg)
    rewritten = [c for r in rollouts for c in r.completions if learner.canonical_text(c) != c]
    assert rewritten, "no rewarded draw to rewrite"
    assert all(proof_of(learner, rollouts))  # the tokens are those of genuine draws ...
    for r in rollouts:  # ... while the reward of each rewritten one fell to 0
        prompt = TASK.prompt_by_id(r.prompt_id)
        assert prompt is not None
        for c in r.completions:
            if learner.canonical_text(c) != c:
                assert TASK.reward(prompt, c) == 0.0 and TASK.reward(prompt, learner.canonical_text(c)) == 1.0
    admitter = Admitter(TASK, "horizontal", Limits(), "me", RoundPlan(TASK, cfg, RUN), learner.canonical_text)
    admission = admitter.admit(rollouts, ROUND, blacklisted=lambda _: False)
    assert admission.rejected["non_canonical"] == len({r.part for r in rollouts if any(
        learner.canonical_text(c) != c for c in r.completions)})  # fmt: skip
