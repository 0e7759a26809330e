"""A node waiting for its network before the first round (``rounds.min_peers``, by default one peer).

A node started alone used to train alone: a creator whose second node came up minutes later had run 182 rounds
by itself, and at ``start_timeout_seconds`` a node without peers only logged and went on alone. Now it waits,
says so every :data:`LOG_EVERY` seconds (with how long, and the command another node joins it with), shows
``waiting`` in ``/status``, and when the time is up stops with one line naming the cause and the fix
(:class:`NoPeersError`, exit status 2). ``dgrpo node run --solo`` (``min_peers = 0``) is a lone node on purpose.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

import trio

from dgrpo.errors import DgrpoError

log = logging.getLogger("dgrpo.daemon")

LOG_EVERY = 10.0  # seconds between "waiting for peers" lines
POLL = 0.2


class NoPeersError(DgrpoError):
    """Fewer than ``rounds.min_peers`` peers came within ``rounds.start_timeout_seconds``."""


def join_address(addrs: Sequence[str]) -> str | None:
    """The address to give another node: a direct TCP one, one that another machine can reach where there is
    one (not loopback), else the first."""
    direct = [a for a in addrs if "/tcp/" in a and "/p2p-circuit" not in a]
    routable = [a for a in direct if not a.startswith(("/ip4/127.", "/ip6/::1/"))]
    return next(iter(routable or direct or addrs), None)


def how_to_join(addrs: Sequence[str], manifest_sha256: str | None) -> str:
    """The command another node joins this one with (what the waiting lines and the error show)."""
    addr = join_address(addrs) or "<this node's address, in node.json>"
    pin = f" --manifest-sha256 {manifest_sha256}" if manifest_sha256 else ""
    return f"dgrpo node join {addr}{pin}"


async def wait_for_peers(
    peers: Callable[[], int], needed: int, timeout: float, join: Callable[[], str], bootstrap: Sequence[str] = ()
) -> None:
    """Return once ``peers()`` reaches ``needed``; log the wait every :data:`LOG_EVERY` seconds;
    :class:`NoPeersError` after ``timeout`` seconds. ``join()``: the command another node joins with;
    ``bootstrap``: the addresses this node dials (a joiner: those are what it waits for)."""
    start = trio.current_time()
    next_line = start
    with trio.move_on_after(timeout):
        while (have := peers()) < needed:
            now = trio.current_time()
            if now >= next_line:
                next_line = now + LOG_EVERY
                what = "dialling its bootstrap peers" if bootstrap else f"another node joins with: {join()}"
                log.info("waiting for peers (%d/%d), %.0f s; %s", have, needed, now - start, what)
            await trio.sleep(POLL)
        return
    have = peers()
    got = "no peer" if have == 0 else f"only {have} of {needed} peers"
    if bootstrap:
        fix = (
            f"check that a bootstrap peer is up and reachable ({', '.join(bootstrap[:3])}), or raise "
            "rounds.start_timeout_seconds"
        )
    else:
        fix = f"start another node with `{join()}`, or pass --solo to train alone"
    raise NoPeersError(f"{got} joined within {timeout:g} s (rounds.start_timeout_seconds); {fix}")
