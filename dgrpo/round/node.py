"""A node: its parts (task, learner, rollout settings, adversary, defenses, admission rules), and its round
as two halves around the network.

``produce`` is the generate stage; the transport publishes and receives; ``consume`` is the line that calls
the other stages in order::

    admit -> draw -> defend -> score -> advantages -> update

The daemon and the simulations call exactly these (through :func:`dgrpo.round.run.run_round`). A node never
trusts a peer's reward or its copy of a prompt.
"""

from __future__ import annotations

import hashlib
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import replace

from dgrpo.adversary.base import Adversary
from dgrpo.config import RolloutConfig
from dgrpo.defense.base import DefenseContext
from dgrpo.defense.chain import DefenseChain
from dgrpo.defense.reputation import Reputation
from dgrpo.defense.seniority import Seniority
from dgrpo.learner.learner import Learner
from dgrpo.protocol.limits import Limits
from dgrpo.protocol.messages import Rollout, SamplingParams
from dgrpo.round.admit import Admitter
from dgrpo.round.advantages import advantages
from dgrpo.round.binding import RoundPlan
from dgrpo.round.defend import defend
from dgrpo.round.draw import DrawRules, draw, private_rng
from dgrpo.round.fill import fill
from dgrpo.round.generate import generate, plan
from dgrpo.round.group_memory import GroupMemory
from dgrpo.round.outcome import Admitted, Produced, RoundOutcome, StageCpu
from dgrpo.round.score import score
from dgrpo.round.update import update
from dgrpo.tasks.base import Prompt, Task


class Node:
    """A GRPO node. ``adversary``: a malicious node is this same node with an attack transforming what it
    publishes (it receives, scores and trains like any other). ``defense`` and ``reputation``: the filters
    between receive and learn (paper, sec. 6) and the policy that blacklists peers they keep rejecting."""

    def __init__(
        self,
        peer_id: str,
        run_id: str,
        task: Task,
        learner: Learner,
        rollout: RolloutConfig,
        sampling: SamplingParams,
        adversary: Adversary | None = None,
        defense: DefenseChain | None = None,
        reputation: Reputation | None = None,
        limits: Limits | None = None,
        secret: bytes | None = None,
    ) -> None:
        self.peer_id = peer_id
        self.run_id = run_id
        self.task = task
        self.learner = learner
        self.rollout = rollout
        self.sampling = sampling
        self.adversary = adversary
        self.defense = defense
        self.reputation = reputation
        self.admitter = Admitter(
            task, rollout.split, limits or Limits(), peer_id, RoundPlan(task, rollout, run_id), learner.canonical_text
        )
        self._produced = Produced(0, 0.0)
        # The draw's private randomness: the daemon's from its identity key; a simulated node's from its name.
        self.secret = secret if secret is not None else hashlib.sha256(f"dgrpo/sim/{peer_id}".encode()).digest()
        self.draw_rules = DrawRules(rollout.external_per_round, rollout.external_per_author, rollout.young_share)
        self.seniority = Seniority(rollout.young_rounds, (limits or Limits()).max_tracked_peers)
        if rollout.external_per_round is not None:  # the admit stage indexes peers' rollouts by draw weight
            self.admitter.draw_weight = lambda author: self.seniority.weight(author)
        self.weights = ""  # SHA-256 of the weights of the round being played (announced in its rollouts)
        # Async mode: a prompt's group spans the staleness window (:mod:`dgrpo.round.group_memory`).
        self.groups = GroupMemory(rollout.max_staleness + 1) if rollout.mode == "async" else None

    def plan(self, round_idx: int) -> list[Prompt]:
        return plan(self.task, self.rollout, self.run_id, self.peer_id, round_idx, self.adversary)

    def blacklisted(self, peer: str) -> bool:
        return self.reputation is not None and self.reputation.is_blacklisted(peer)

    # ------------------------------------------------------------------ the generate stage
    def produce(self, round_idx: int) -> list[Rollout]:
        """This round's rollout messages (one per prompt)."""
        t0 = time.perf_counter()
        self.weights = self.learner.weights_digest()
        rollouts = generate(
            self.task, self.learner, self.rollout, self.sampling, self.run_id, self.peer_id, round_idx,
            self.adversary, self.weights,
        )  # fmt: skip
        adversary = self.adversary
        stats = adversary.stats if adversary is not None and adversary.stats.last_round == round_idx else None
        self._produced = Produced(
            completions=sum(len(r.completions) for r in rollouts),
            seconds=time.perf_counter() - t0,
            attack=adversary.name if adversary is not None else None,
            poisoned=frozenset(stats.last_poisoned) if stats is not None else frozenset(),
            poisoned_count=stats.last_round_poisoned if stats is not None else 0,
        )
        return rollouts

    # ------------------------------------------------------------------ the rest of the round
    def fill(self, round_idx: int, deficit: int) -> list[Admitted]:
        """Async mode's local batch fill (:mod:`dgrpo.round.fill`): ``deficit`` more own completions for this
        round's prompts, with the weights of this round (call after :meth:`produce`)."""
        return fill(
            self.task, self.learner, self.rollout, self.sampling, self.run_id, self.peer_id, round_idx, deficit,
            self.weights,
        )  # fmt: skip

    def consume(self, round_idx: int, rollouts: Sequence[Rollout], local: Sequence[Admitted] = ()) -> RoundOutcome:
        """Admit the round's rollouts (ours and the received ones), defend, score every kept completion
        ourselves, compute group advantages and update the model. ``local``: own completions generated to fill
        the step (:meth:`fill`), trained on with the rest and never published, so never admitted."""
        t0, c0 = time.perf_counter(), time.thread_time()
        # Async mode (docs/scale.md): this step also admits peers' rollouts of the S rounds before it, each
        # against its own round's plan; older ones never reach here (the receive stage dropped them).
        staleness = self.rollout.max_staleness if self.rollout.mode == "async" else 0
        admission = self.admitter.admit(rollouts, round_idx, self.blacklisted, staleness)
        if local:  # ours, as the own positions the draw always keeps
            first = len(admission.admitted)
            own = (*admission.own, *range(first, first + len(local)))
            admission = replace(admission, admitted=(*admission.admitted, *local), own=own)
        c_admit = time.thread_time()
        if not self.weights:  # a round consumed without producing (tests, a node that only listens)
            self.weights = self.learner.weights_digest()
        context = DefenseContext(
            self.task, self.learner, self.sampling, self.run_id, round_idx, self.learner.model_id, self.weights,
            self.peer_id,
        )  # fmt: skip
        seniors = self.seniority.has_seniors()
        drawn = draw(
            admission.admitted, self.peer_id, self.draw_rules, self.seniority.weight, self.seniority.young,
            private_rng(self.secret, round_idx), top_up=not seniors, offered=admission.offered, own=admission.own,
            per_rollout=self.rollout.completions_per_prompt, everyone_young=not seniors,
            max_weight=self.seniority.max_weight(), by_weight=admission.by_weight,
        )  # fmt: skip
        c1 = time.thread_time()
        kept, defense = defend(
            self.defense, self.reputation, context, drawn.admitted, self.peer_id, admission.evidence_by_author
        )
        c2 = time.thread_time()
        scoring = score(self.task, kept)
        c3 = time.thread_time()
        # Verified work earns seniority: a peer's completion that passed the defense and scored above zero.
        self.seniority.credit(
            round_idx, {s.author for s in scoring.scored if s.author != self.peer_id and s.reward > 0}
        )
        self.learner.begin_round(round_idx)
        history = self.groups.history(round_idx) if self.groups is not None else None
        advantage = advantages(scoring.scored, self.learner.cfg, history)
        if self.groups is not None:
            self.groups.remember(round_idx, [s.reward for s in scoring.scored], [s.prompt.id for s in scoring.scored])
        step = update(self.learner, scoring.scored, advantage, self.sampling)
        c4 = time.thread_time()
        trained = {(k.author, k.prompt.id) for k in scoring.scored if k.author != self.peer_id}
        ages = Counter(
            round_idx - a.rollout.round
            for a in drawn.admitted
            if (a.rollout.author, a.rollout.prompt_id) in trained
            for _ in a.rollout.completions
        )
        return RoundOutcome(
            peer_id=self.peer_id,
            round=round_idx,
            produced=self._produced,
            admission=admission,
            defense=defense,
            scoring=scoring,
            step=step,
            seconds=time.perf_counter() - t0,
            drawn=drawn,
            # CPU seconds of this thread per stage (a worker thread: the time of this node alone, even with
            # other nodes in the process): what grows with the network and what is bounded by J (issue 24).
            cpu=StageCpu(admit=c_admit - c0, draw=c1 - c_admit, defend=c2 - c1, score=c3 - c2, update=c4 - c3),
            staleness=dict(sorted(ages.items())) if staleness else {},
            filled=sum(len(a.rollout.completions) for a in local),
        )

    # ------------------------------------------------------------------ evaluate
    def eval_completions(self, prompts: Sequence[Prompt], greedy: bool = False, seed: int = 0) -> list[str]:
        """One completion per held-out prompt, sampled with the node's sampling and a fixed seed."""
        sampling = self.sampling.model_copy(update={"seed": seed})
        return [c[0] for c in self.learner.generate([p.text for p in prompts], 1, sampling, greedy=greedy)]
