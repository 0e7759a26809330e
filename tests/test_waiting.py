"""A node waits for its network (dgrpo.daemon.waiting): it says so while it waits, and stops with one line
naming the cause and the fix when nobody came, instead of training alone."""

from __future__ import annotations

import logging

import pytest
import trio

from dgrpo.daemon import waiting
from dgrpo.daemon.waiting import NoPeersError, how_to_join, join_address, wait_for_peers
from dgrpo.errors import DgrpoError

ADDRS = [
    "/ip4/1.2.3.4/tcp/4001/p2p/R/p2p-circuit/p2p/ME",
    "/ip4/127.0.0.1/tcp/4001/p2p/ME",
    "/ip4/192.168.1.5/tcp/4001/p2p/ME",
]


def test_the_join_address_is_a_direct_one_another_machine_can_reach() -> None:
    assert join_address(ADDRS) == "/ip4/192.168.1.5/tcp/4001/p2p/ME"
    assert join_address(ADDRS[:2]) == "/ip4/127.0.0.1/tcp/4001/p2p/ME"
    assert join_address([]) is None
    assert how_to_join(ADDRS[1:2], "ab" * 32) == f"dgrpo node join {ADDRS[1]} --manifest-sha256 {'ab' * 32}"


def test_no_peer_in_time_is_one_line_with_the_fix(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="dgrpo"), pytest.raises(NoPeersError) as error:
        trio.run(wait_for_peers, lambda: 0, 1, 0.5, lambda: "dgrpo node join /ip4/1.2.3.4/tcp/4001/p2p/ME")
    message = str(error.value)
    assert isinstance(error.value, DgrpoError) and "\n" not in message
    assert message.startswith("no peer joined within 0.5 s (rounds.start_timeout_seconds); ")
    assert "`dgrpo node join /ip4/1.2.3.4/tcp/4001/p2p/ME`" in message and "--solo" in message
    assert "waiting for peers (0/1), 0 s; another node joins with: dgrpo node join /ip4/1.2.3.4" in caplog.text


def test_a_joiner_is_told_to_check_its_bootstrap() -> None:
    with pytest.raises(NoPeersError, match=r"only 1 of 2 peers joined .*bootstrap peer is up .*/ip4/9\.9\.9\.9"):
        trio.run(wait_for_peers, lambda: 1, 2, 0.3, lambda: "unused", ["/ip4/9.9.9.9/tcp/1/p2p/X"])


def test_the_wait_ends_when_the_peers_come_and_logs_every_few_seconds(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(waiting, "LOG_EVERY", 0.3)
    peers = [0]

    async def main() -> float:
        async def arrive() -> None:
            await trio.sleep(1.0)
            peers[0] = 1

        start = trio.current_time()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(arrive)
            await wait_for_peers(lambda: peers[0], 1, 30.0, lambda: "dgrpo node join X")
        return trio.current_time() - start

    with caplog.at_level(logging.INFO, logger="dgrpo"):
        waited = trio.run(main)
    assert 0.9 < waited < 5.0
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("waiting for peers (0/1)")]
    assert 3 <= len(lines) <= 5, lines
