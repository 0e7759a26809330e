"""Connections whose pubsub stream died are closed after a while (``dgrpo.net.stream_watch``)."""

from __future__ import annotations

from dgrpo.net.stream_watch import StreamWatch


def test_a_connection_that_lost_its_stream_is_closed_after_the_delay() -> None:
    watch = StreamWatch(after=10.0)
    assert watch.update({"a", "b"}, {"a", "b"}, 0.0) == []
    assert watch.update({"a", "b"}, {"a"}, 1.0) == []  # b's stream died; its connection stays
    assert watch.update({"a", "b"}, {"a"}, 10.9) == []
    assert watch.update({"a", "b"}, {"a"}, 11.0) == ["b"]
    assert watch.update({"a", "b"}, {"a"}, 30.0) == []  # asked once: a fresh connection starts over


def test_a_stream_that_comes_back_or_a_peer_that_leaves_resets_the_clock() -> None:
    watch = StreamWatch(after=10.0)
    watch.update({"a"}, {"a"}, 0.0)
    watch.update({"a"}, set(), 1.0)
    watch.update({"a"}, {"a"}, 5.0)  # py-libp2p's own retry reopened it
    assert watch.update({"a"}, set(), 12.0) == []  # the clock restarts at 12
    assert watch.update({"a"}, set(), 22.0) == ["a"]
    watch.update({"b"}, {"b"}, 0.0)
    watch.update(set(), set(), 1.0)  # b disconnected: forgotten
    assert watch.update({"b"}, set(), 50.0) == []  # connected again without a stream yet: never had one since


def test_a_connection_that_never_carried_gossip_is_left_alone() -> None:
    watch = StreamWatch(after=1.0)
    for t in range(10):  # an AutoNAT dial-back, a joiner asking for the manifest
        assert watch.update({"probe"}, set(), float(t)) == []
