"""The defend stage: the defense chain's verdict on every admitted completion, and the reputation policy.

"Hail to the Thief" (sec. 6) filters between the all-gather and the advantages: a rejected completion leaves
its group before the group's advantages are computed. The node's own completions go through the same chain:
in a homogeneous network every node must train on the same completions, or the weights drift apart (a node
keeping its own completion that the others reject), and group-based filters (``length``) must see the same
whole group everywhere. Per-peer counts and the reputation policy are about peers only.

The group rule: where a proof (``sampling-proof``, :attr:`Defense.proof`) rejects one completion of an
author's group for a prompt, the rest of that group is rejected too (``<defense>:group``). With the plan
binding every index of the share is present, so an author cannot keep the draws that suit it and replace
the others: the whole group goes. Proof failures, and the admission rejections an honest peer never earns,
are evidence for the reputation policy (an absolute count, not a rate).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence

from dgrpo.defense.base import Candidate, DefenseContext, Verdict
from dgrpo.defense.chain import DefenseChain
from dgrpo.defense.reputation import Reputation
from dgrpo.round.outcome import Admitted, Checked, DefenseOutcome, Kept


def stopped(v: Verdict) -> tuple[bool, str]:
    """(accepted or not, why) for metrics: a completion kept with its reward zeroed (the judge's reward mode)
    is stopped as surely as a rejected one."""
    if v.accept and v.reward_scale == 0.0:
        return False, v.reason or "reward_zeroed"
    return v.accept, v.reason


def undefended(admitted: Sequence[Admitted]) -> list[Kept]:
    """Every admitted completion, kept as is (a node without a chain)."""
    return [Kept(a.rollout.author, a.prompt, text) for a in admitted for text in a.rollout.completions]


def group_rule(candidates: Sequence[Candidate], verdicts: list[Verdict], proofs: frozenset[str]) -> list[Verdict]:
    """Every completion of an (author, prompt) group in which a proof rejected one, rejected."""
    failed: dict[tuple[str, str], str] = {}
    for c, v in zip(candidates, verdicts, strict=True):
        name = v.reason.split(":", 1)[0]
        if not v.accept and name in proofs:
            failed.setdefault((c.author, c.prompt.id), name)
    if not failed:
        return verdicts
    return [
        Verdict(False, f"{failed[(c.author, c.prompt.id)]}:group") if v.accept and (c.author, c.prompt.id) in failed
        else v
        for c, v in zip(candidates, verdicts, strict=True)
    ]  # fmt: skip


def defend(
    chain: DefenseChain | None,
    reputation: Reputation | None,
    ctx: DefenseContext,
    admitted: Sequence[Admitted],
    self_id: str,
    evidence: Mapping[str, int] | None = None,
) -> tuple[list[Kept], DefenseOutcome | None]:
    """The completions that go on to be scored (in the admitted order), and what the chain did (None
    without a chain). The reputation policy records this round (``evidence``: the admit stage's, per
    author) and says whom to blacklist from now on."""
    if chain is None:
        return undefended(admitted), None
    candidates = [
        Candidate(
            a.rollout.author,
            a.prompt,
            text,
            index,
            a.rollout.sampling,
            a.rollout.model_id,
            a.rollout.weights,
            a.rollout.tokens[j] if a.rollout.tokens else None,
        )
        for a in admitted
        for j, (index, text) in enumerate(zip(a.rollout.indices, a.rollout.completions, strict=True))
    ]
    result = chain.run(ctx, candidates)
    proofs = chain.proof_names()
    result.verdicts = group_rule(candidates, result.verdicts, proofs)
    proof_failures: Counter[str] = Counter(evidence or {})
    kept: list[Kept] = []
    checked: list[Checked] = []
    by_reason: Counter[str] = Counter()
    checked_by: Counter[str] = Counter()
    rejected_by: Counter[str] = Counter()
    for c, v in zip(candidates, result.verdicts, strict=True):
        if v.accept:
            kept.append(Kept(c.author, c.prompt, c.text, v.reward_scale))
        if c.author == self_id:
            continue  # per-peer counts and reputation are about peers
        checked.append(Checked(c.author, c.prompt.id, c.text, *stopped(v)))
        checked_by[c.author] += 1
        if not v.accept:
            by_reason[v.reason] += 1
            rejected_by[c.author] += 1
            name, _, why = v.reason.partition(":")
            if name in proofs and why != "group":
                proof_failures[c.author] += 1
    blacklisted: list[str] = []
    if reputation is not None:
        for author in sorted(set(checked_by) | set(proof_failures)):
            reputation.record(ctx.round, author, checked_by[author], rejected_by[author], proof_failures[author])
        blacklisted = reputation.update(ctx.round)
    outcome = DefenseOutcome(
        names=tuple(chain.names),
        checked=tuple(checked),
        rejected=dict(by_reason),
        checked_by_author=dict(checked_by),
        rejected_by_author=dict(rejected_by),
        seconds=dict(result.seconds),
        blacklisted_now=tuple(blacklisted),
    )
    return kept, outcome
