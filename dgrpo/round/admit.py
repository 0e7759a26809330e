"""The admit stage: every structural check of a received rollout, in one place, driven by one
:class:`~dgrpo.protocol.limits.Limits` and the run's plan (:mod:`dgrpo.round.binding`).

The wire layer has already checked each message on its own (size, schema, run, sizes against the limits,
timestamp, signature, replay: :mod:`dgrpo.protocol.validator`). What is checked here needs the round: two
moments, one set of rules and one set of counters.

- **On arrival** (the receive stage, while rounds are open): ``closed_round`` (its round is over),
  ``future_round`` (more than ``limits.rounds_ahead`` ahead), ``bad_part`` (part not below parts),
  ``duplicate_part`` (the first message for an (author, part) wins), ``over_quota`` (an author holding its
  plan's parts already: a flood, evidence at once), ``round_full`` (``limits.messages_per_round``).
- **At round close**, per rollout: ``wrong_round``, ``wrong_split``, ``blacklisted`` (the reputation policy
  stopped listening to its author), ``duplicate_part`` (the round's own rollouts and what arrived, together),
  ``unknown_prompt`` (not a training prompt of the task), ``prompt_mismatch`` (the prompt text differs from
  the task's), then the plan binding (``wrong_parts``, ``off_plan``, ``over_share``, ``bad_index``,
  ``withheld``) and ``non_canonical`` (a completion that is not ``decode(encode(text))`` under the receiver's
  tokenizer: the reward would read another string than the learner and the model checks see); per author:
  ``duplicate_prompt`` (a second rollout for one prompt) and ``incomplete`` (its rollouts do not cover its
  whole plan). Receivers rebuild every prompt from its id: a peer's copy of a question or answer is never used.

Every rejection is counted by reason and by author (``statistics``), for ``/status`` and ``/metrics``; authors
are authenticated (the validator checked their signatures) but an attacker can make up as many as it has keys,
so at most ``limits.max_tracked_peers`` of them are kept, the least recently rejected forgotten first. A
rejected peer's completions are reported as dropped, with the reason, so that simulations count them as
stopped. The reasons an honest author never earns (``EVIDENCE_REASONS``) are evidence for the reputation
policy.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable, Container, Sequence
from dataclasses import dataclass, field

from dgrpo.protocol.counting import PeerReasons
from dgrpo.protocol.limits import Limits
from dgrpo.protocol.messages import Rollout, SplitMode
from dgrpo.round.binding import ROLLOUT_REASONS, ROUND_REASONS, RoundPlan
from dgrpo.round.outcome import Admission, Admitted, Checked
from dgrpo.tasks.base import Prompt, Task

ARRIVAL_REASONS = ("closed_round", "future_round", "bad_part", "duplicate_part", "over_quota", "round_full")
# An honest author sends its plan's parts once per round (gossip delivers each message once): more is a flood,
# evidence at once, before it can fill the round for everyone (``round_full``) or the receiver's memory.
ARRIVAL_EVIDENCE = frozenset({"over_quota"})
CLOSE_REASONS = (
    "wrong_round", "wrong_split", "blacklisted", "duplicate_part", "unknown_prompt", "prompt_mismatch",
    *ROLLOUT_REASONS, "non_canonical", *ROUND_REASONS,
)  # fmt: skip
# What an honest author never does, whatever the network does to its messages (``incomplete`` can be a lost
# message; the round and split reasons a misconfigured peer): evidence of a poisoner, never diluted.
EVIDENCE_REASONS = frozenset({"prompt_mismatch", *ROLLOUT_REASONS, "non_canonical", "duplicate_prompt"})
Canonical = Callable[[str], str]


@dataclass(frozen=True)
class AdmissionStatistics:
    rejected_by_reason: dict[str, int]
    rejected_by_author: dict[str, int]
    rejected_by_author_reason: dict[str, dict[str, int]] = field(default_factory=dict)  # author -> reason -> n


def arrival_reason(
    rollout: Rollout,
    current_round: int,
    held: int,
    seen: Container[tuple[str, int]],
    limits: Limits,
    author_held: int = 0,
    quota: int | None = None,
    staleness: int = 0,
    ahead: int | None = None,
) -> str | None:
    """Whether a rollout arriving while ``current_round`` is open is kept (None) or why not. ``held``:
    messages already kept for its round; ``seen``: their (author, part) keys; ``author_held``: those of its
    author; ``quota``: the most one author may hold for a round (its plan's parts; None: no cap);
    ``staleness``: rounds before the current one still taken (async mode's S; 0 in sync mode); ``ahead``:
    the latest round kept when that is past ``current_round + rounds_ahead`` (async mode: the horizon)."""
    if rollout.round < current_round - staleness:
        return "closed_round"
    if rollout.round > max(current_round + limits.rounds_ahead, ahead if ahead is not None else 0):
        return "future_round"
    if rollout.part >= rollout.parts:
        return "bad_part"
    if (rollout.author, rollout.part) in seen:
        return "duplicate_part"
    if quota is not None and author_held >= quota:
        return "over_quota"
    if held >= limits.messages_per_round:
        return "round_full"
    return None


class Admitter:
    """The admission rules of one node: its task (prompts), its split, its limits, the run's plan (None: no
    plan binding, for tests of the other rules) and its tokenizer's round trip (None: no canonical-text
    rule, for a node without a model)."""

    def __init__(
        self,
        task: Task,
        split: SplitMode,
        limits: Limits,
        self_id: str,
        plan: RoundPlan | None = None,
        canonical: Canonical | None = None,
    ) -> None:
        self.task = task
        self.split = split
        self.limits = limits
        self.self_id = self_id
        self.plan = plan
        self.canonical = canonical
        self._by_reason: Counter[str] = Counter()
        self._by_author = PeerReasons(limits.max_tracked_peers)
        self._lock = threading.Lock()
        self.on_evidence: Callable[[str, str], None] | None = None
        # The draw stage's seniority weight of an author (set by a node with a bounded draw): the admitted
        # rollouts are indexed by it here, with the other per-message work, so that the draw samples in
        # proportion to weight without a pass over everything offered (:mod:`dgrpo.round.draw`).
        self.draw_weight: Callable[[str], float] | None = None

    # ------------------------------------------------------------------ on arrival
    def on_arrival(
        self,
        rollout: Rollout,
        current_round: int,
        held: int,
        seen: Container[tuple[str, int]],
        author_held: int = 0,
        staleness: int = 0,
        ahead: int | None = None,
    ) -> str | None:
        """Whether the receive stage keeps ``rollout`` (None) or why not; counted, and evidence reported to
        ``on_evidence(author, reason)`` (the daemon blacklists on it)."""
        quota = self.plan.parts if self.plan is not None else None
        reason = arrival_reason(rollout, current_round, held, seen, self.limits, author_held, quota, staleness, ahead)
        if reason is not None:
            self._count(reason, rollout.author)
            if reason in ARRIVAL_EVIDENCE and self.on_evidence is not None and rollout.author != self.self_id:
                self.on_evidence(rollout.author, reason)
        return reason

    def count(self, reason: str, author: str, n: int = 1) -> None:
        """Count ``n`` rejections of ``author``'s messages (the receive stage dropping buffered ones)."""
        self._count(reason, author, n)

    # ------------------------------------------------------------------ at round close
    def admit(
        self, rollouts: Sequence[Rollout], round_idx: int, blacklisted: Callable[[str], bool], staleness: int = 0
    ) -> Admission:
        """Admit the round's rollouts (ours and the received ones) in a canonical order: nodes holding the same
        weights and receiving the same strings then make the same update. ``staleness`` (async mode's S): the
        step at ``round_idx`` also admits rollouts of the S rounds before it, each checked against its own
        round's plan."""
        ordered = sorted(rollouts, key=lambda r: (r.prompt_id, r.author, r.round, r.part))
        passed: list[Admitted] = []
        rejected: Counter[str] = Counter()
        by_author: Counter[str] = Counter()
        by_author_reason: Counter[tuple[str, str]] = Counter()
        dropped: list[Checked] = []
        evidence: Counter[str] = Counter()

        def reject(r: Rollout, reason: str) -> None:
            rejected[reason] += 1
            by_author[r.author] += 1
            by_author_reason[(r.author, reason)] += 1
            if reason in EVIDENCE_REASONS and r.author != self.self_id:
                evidence[r.author] += 1
            if r.author != self.self_id:
                dropped.extend(Checked(r.author, r.prompt_id, text, False, reason) for text in r.completions)

        seen: set[tuple[str, int, int]] = set()
        for r in ordered:
            if r.author != self.self_id and blacklisted(r.author):
                reject(r, "blacklisted")
                continue
            key = (r.author, r.round, r.part)
            prompt, reason = (None, "duplicate_part") if key in seen else self._check(r, round_idx, staleness)
            seen.add(key)
            if prompt is None:
                reject(r, reason or "invalid")
            else:
                passed.append(Admitted(r, prompt))
        admitted = self._bind(passed, reject)
        with self._lock:
            self._by_reason.update(rejected)
            for (author, reason), n in by_author_reason.items():
                self._by_author.add(author, reason, n)
        own = tuple(k for k, a in enumerate(admitted) if a.rollout.author == self.self_id)
        by_weight: dict[float, list[int]] | None = None
        if self.draw_weight is not None:
            by_weight, weigh = {}, self.draw_weight
            for k, a in enumerate(admitted):
                if a.rollout.author != self.self_id:
                    by_weight.setdefault(weigh(a.rollout.author), []).append(k)
        return Admission(
            messages=len(rollouts),
            completions_received=sum(len(r.completions) for r in rollouts),
            admitted=tuple(admitted),
            offered=sum(len(a.rollout.completions) for a in admitted)
            - sum(len(admitted[k].rollout.completions) for k in own),
            own=own,
            rejected=dict(rejected),
            rejected_by_author=dict(by_author),
            dropped=tuple(dropped),
            evidence_by_author=dict(evidence),
            by_weight={w: tuple(ks) for w, ks in by_weight.items()} if by_weight is not None else None,
        )

    def _bind(self, passed: Sequence[Admitted], reject: Callable[[Rollout, str], None]) -> list[Admitted]:
        """The per-author rules, per (author, round): one rollout per prompt, and an author's rollouts cover
        its plan for that round or none of them is admitted."""
        if self.plan is None:
            return list(passed)
        first: dict[tuple[str, int, str], Admitted] = {}
        for a in sorted(passed, key=lambda a: (a.rollout.author, a.rollout.round, a.rollout.part)):
            key = (a.rollout.author, a.rollout.round, a.rollout.prompt_id)  # the lowest part wins
            if key in first:
                reject(a.rollout, "duplicate_prompt")
            else:
                first[key] = a
        covered: dict[tuple[str, int], set[str]] = {}
        for author, round_idx, prompt_id in first:
            covered.setdefault((author, round_idx), set()).add(prompt_id)
        admitted = []
        for a in passed:
            r = a.rollout
            if first.get((r.author, r.round, r.prompt_id)) is not a:
                continue
            if covered[(r.author, r.round)] != self.plan.ids(r.author, r.round):
                reject(r, "incomplete")
            else:
                admitted.append(a)
        return admitted

    def _check(self, rollout: Rollout, round_idx: int, staleness: int = 0) -> tuple[Prompt | None, str | None]:
        """(the task's prompt, None) to admit, or (None, reason)."""
        if not round_idx - staleness <= rollout.round <= round_idx:
            return None, "wrong_round"
        if rollout.split != self.split:
            return None, "wrong_split"
        prompt = self.task.prompt_by_id(rollout.prompt_id)
        if prompt is None:
            return None, "unknown_prompt"
        if prompt.text != rollout.prompt:
            return None, "prompt_mismatch"
        if self.plan is not None and (reason := self.plan.reason(rollout)) is not None:
            return None, reason
        if self.canonical is not None and any(self.canonical(c) != c for c in rollout.completions):
            return None, "non_canonical"
        return prompt, None

    # ------------------------------------------------------------------ counters
    def _count(self, reason: str, author: str, n: int = 1) -> None:
        with self._lock:
            self._by_reason[reason] += n
            self._by_author.add(author, reason, n)

    def statistics(self) -> AdmissionStatistics:
        """Every rejection so far, on arrival and at close (a snapshot)."""
        with self._lock:
            return AdmissionStatistics(dict(self._by_reason), self._by_author.by_peer(), self._by_author.snapshot())
