"""The receive stage: buffering per round, quorum, and the arrival rules of the admit stage."""

from __future__ import annotations

import trio
import trio.testing

from dgrpo.protocol.limits import Limits
from dgrpo.protocol.messages import Rollout, SamplingParams
from dgrpo.round.receive import RoundInbox


def rollout(author: str, round_idx: int, part: int = 0, parts: int = 1) -> Rollout:
    return Rollout(
        author=author,
        round=round_idx,
        part=part,
        parts=parts,
        prompt_id="arith/10+15",
        prompt="10+15=",
        completions=("x",),
        model_id="m",
        indices=(0,),
        weights="",
        sampling=SamplingParams(),
        split="horizontal",
    )


def test_quorum_needs_every_part_of_every_peer() -> None:
    inbox = RoundInbox()
    inbox.open(1)
    assert inbox.add(rollout("a", 1, 0, 2)) is None
    assert not inbox.complete(1, {"a"})
    assert inbox.add(rollout("a", 1, 1, 2)) is None
    assert inbox.complete(1, {"a"})
    assert not inbox.complete(1, {"a", "b"})


def test_closed_future_duplicate_and_bad_part() -> None:
    inbox = RoundInbox(limits=Limits(rounds_ahead=2))
    inbox.open(5)
    assert inbox.add(rollout("a", 4)) == "closed_round"
    assert inbox.add(rollout("a", 8)) == "future_round"
    assert inbox.add(rollout("a", 7)) is None  # a faster peer: kept until its round opens
    assert inbox.add(rollout("a", 5)) is None
    assert inbox.add(rollout("a", 5)) == "duplicate_part"
    assert inbox.add(rollout("b", 5, part=3, parts=2)) == "bad_part"
    assert [r.author for r in inbox.take(5)] == ["a"]
    assert inbox.add(rollout("c", 5)) == "closed_round"  # after the round closed
    inbox.open(7)
    assert [r.round for r in inbox.take(7)] == [7]
    assert inbox.rejected == {"closed_round": 2, "future_round": 1, "duplicate_part": 1, "bad_part": 1}


def test_wait_complete_wakes_on_arrival_and_deadline_closes_round() -> None:
    async def main() -> None:
        inbox = RoundInbox()
        inbox.open(0)
        done = trio.Event()

        async def waiter() -> None:
            await inbox.wait_complete(0, {"a", "b"})
            done.set()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(waiter)
            await trio.testing.wait_all_tasks_blocked()
            inbox.add(rollout("a", 0))
            await trio.testing.wait_all_tasks_blocked()
            assert not done.is_set()
            inbox.add(rollout("b", 0))
        assert done.is_set()

        # A vanished peer: the deadline closes the round with what arrived (fake clock, no real sleep).
        inbox.open(1)
        inbox.add(rollout("a", 1))
        with trio.move_on_after(30) as scope:
            await inbox.wait_complete(1, {"a", "gone"})
        assert scope.cancelled_caught
        assert [r.author for r in inbox.take(1)] == ["a"]

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))


def test_before_its_first_round_a_node_keeps_the_newest_rounds_it_hears_of() -> None:
    # A late joiner does not know the network's round yet: it keeps what arrives for the newest rounds, so
    # that the round it joins at is whole even if peers published it while it was still deciding.
    inbox = RoundInbox(limits=Limits(rounds_ahead=2))
    assert inbox.add(rollout("a", 15)) is None
    assert inbox.add(rollout("a", 16)) is None
    assert inbox.add(rollout("a", 12)) == "closed_round"  # older than the newest round minus rounds_ahead
    assert inbox.add(rollout("b", 18)) is None  # the network moved on: round 15 falls out
    inbox.open(16)
    assert inbox.complete(16, {"a"})
    assert [r.round for r in inbox.take(16)] == [16]
    assert inbox.rejected == {"closed_round": 2}
    assert inbox.add(rollout("a", 20)) == "future_round"  # opened: the usual bound again


def test_a_round_says_whether_it_closed_at_quorum_or_at_its_deadline() -> None:
    """The daemon's log line for expected peers it trained nothing from depends on it: "closed at its deadline"
    was logged for a round that closed at quorum (every peer delivered, then its rollouts were rejected)."""
    from dataclasses import dataclass
    from typing import Any, cast

    from dgrpo.round.outcome import RoundOutcome
    from dgrpo.round.run import run_round

    @dataclass
    class Listener:  # a node that publishes nothing and trains on nothing: only the round's timing is tested
        def produce(self, round_idx: int, limiter: Any = None) -> list[Rollout]:
            return []

        def consume(self, round_idx: int, rollouts: Any, limiter: Any = None) -> RoundOutcome:
            none = cast(Any, None)
            return RoundOutcome("me", round_idx, none, none, None, none, None, 0.0)

    async def main() -> None:
        inbox = RoundInbox()
        node, transport = cast(Any, Listener()), cast(Any, None)

        async def arrive() -> None:
            await trio.sleep(1.0)  # once the round is open
            inbox.add(rollout("a", 1))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(arrive)
            outcome = await run_round(node, transport, inbox, 1, {"a"}, 30.0)
        assert not outcome.at_deadline
        outcome = await run_round(node, transport, inbox, 2, {"a"}, 30.0)  # "a" never sends round 2
        assert outcome.at_deadline

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0.1))
