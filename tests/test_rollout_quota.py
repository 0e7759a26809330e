"""The per-author rollout quota at gossipsub's validation (``Libp2pTransport``) together with the receive stage:
a message that is rejected must not use up its author's quota (docs/protocol.md, "Admission")."""

from __future__ import annotations

import types
from typing import Any, cast

from dgrpo.config.rollout import RolloutConfig
from dgrpo.net.p2p import OVER_QUOTA, Libp2pTransport
from dgrpo.protocol.envelope import Signer, decode, to_rollout
from dgrpo.protocol.limits import Limits
from dgrpo.round.admit import Admitter
from dgrpo.round.binding import RoundPlan
from dgrpo.round.receive import RoundInbox
from dgrpo.tasks import get_task
from tests.protocol_helpers import ALICE, BOB, RUN, FakeClock, make_rollout, memory_signer, validator

TASK = get_task("arith")
PLAN = RoundPlan(TASK, RolloutConfig(prompts_per_round=2, completions_per_prompt=2), RUN)


class Node:
    """One receiver: its gossipsub validator (the transport's quota) and its receive stage, wired as the daemon
    wires them. ``deliver`` is what happens to one message from the wire up to the inbox."""

    def __init__(self) -> None:
        self.clock = FakeClock()
        quiet = types.SimpleNamespace(oversize_rpc=0, dropped=0, dropped_to_peers=0)  # the gossip layer's counters
        gossip = types.SimpleNamespace(
            peer_id=ALICE.peer_id, rejections_of=lambda peer: 0, rejections_by_peer=dict, statistics=lambda: quiet
        )
        signer = memory_signer(self.clock, ALICE)
        self.transport = Libp2pTransport(cast(Any, gossip), signer, validator(self.clock), RUN)
        self.transport.rollout_quota = PLAN.parts
        self.inbox = RoundInbox(Admitter(TASK, "horizontal", Limits(), ALICE.peer_id, plan=PLAN))
        self.inbox.on_rejected = self.transport.release_quota
        self.check = self.transport._validator("rollout")
        self.author: Signer = memory_signer(self.clock, BOB)

    def deliver(self, round_idx: int, part: int, parts: int = PLAN.parts) -> str | None:
        """None: kept; else the reason it was not (refused inside gossipsub, or at arrival)."""
        rollout = make_rollout(BOB, round=round_idx, part=part, parts=parts)
        data = self.author.sign_rollout(rollout)
        if not self.check(data, BOB.peer_id, BOB.peer_id):
            return OVER_QUOTA
        return self.inbox.add(to_rollout(decode(data)))

    def over_quota(self) -> int:
        return self.transport.statistics().rejected_by_reason.get(OVER_QUOTA, 0)


def test_a_rollout_rejected_as_future_round_gives_its_slot_back() -> None:
    """Before: the rollout for a round too far ahead took a quota slot at gossipsub's validation although the
    receive stage dropped it, so the author's honest parts of that round were later ``over_quota``, its round
    incomplete, and every node waited for the deadline."""
    node = Node()
    node.inbox.open(1)
    assert node.deliver(1 + Limits().rounds_ahead + 1, 0) == "future_round"
    assert node.deliver(0, 1) == "closed_round"  # a round already closed: no slot either
    node.inbox.open(4)
    assert [node.deliver(4, part) for part in range(PLAN.parts)] == [None] * PLAN.parts
    assert node.inbox.complete(4, {BOB.peer_id})
    assert node.over_quota() == 0


def test_a_second_copy_of_a_part_is_refused_without_taking_a_slot() -> None:
    """Slots are per part: a re-signed copy of a part already let through is refused inside gossipsub (not
    forwarded, a penalty) and leaves the author's other parts their slots."""
    node = Node()
    node.inbox.open(3)
    assert node.deliver(3, 0) is None
    assert node.deliver(3, 0) == OVER_QUOTA
    assert node.deliver(3, 1) is None
    assert node.inbox.complete(3, {BOB.peer_id})
    assert node.deliver(3, 5, parts=6) == OVER_QUOTA  # a new part once the quota (the plan's parts) is taken
    assert node.over_quota() == 2
    assert node.transport.statistics().rejected_by_peer_reason[BOB.peer_id] == {OVER_QUOTA: 2}


def test_a_duplicate_part_at_arrival_keeps_the_first_copys_slot() -> None:
    node = Node()
    node.inbox.open(3)
    assert node.deliver(3, 0) is None
    node.transport.release_quota(make_rollout(BOB, round=3, part=0, parts=PLAN.parts), "duplicate_part")
    assert node.deliver(3, 0) == OVER_QUOTA  # the slot is still the kept copy's
