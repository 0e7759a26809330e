"""A per-author message nonce that only increases, also across restarts and crashes.

Receivers deduplicate by (author, nonce) and remember what they saw across their own restarts
(:mod:`dgrpo.protocol.replay`), so an author that reused a nonce after a restart would have its fresh
messages dropped as replays. py-libp2p's pubsub seqno (wall clock in seconds) has exactly that problem,
which is why dgrpo signs its own nonce.

Crash safety follows the usual "reserve, then hand out" scheme: before giving out nonces the counter
persists ``reserved_upto`` (atomically: temp file, fsync, rename, fsync of the folder) and then hands out
values up to it from memory. A process killed with SIGKILL loses at most the unused part of its
reservation; on restart the counter starts above the persisted reservation, so no value is ever reused.

A new state file starts at the current unix time in microseconds, and a loaded one at the larger of that
and the reservation: a node whose state file was deleted (or restored from an old backup) is still very
unlikely to reuse nonces it handed out before, unless it published more than one message per microsecond
on average or its clock went backwards. 2**64 microseconds is about 584,000 years, so the range cannot run
out in practice.
"""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path
from typing import Protocol

from dgrpo.atomic import write_atomically
from dgrpo.errors import DgrpoError

NONCE_LIMIT = 2**64  # nonces are msgpack uint64 on the wire
_STATE_VERSION = 1


class NonceStateError(DgrpoError):
    """The nonce state file cannot be read, is corrupt, or the nonce range is exhausted."""


def _now_micros() -> int:
    return time.time_ns() // 1000


class NonceCounter:
    """Hands out strictly increasing nonces, persisting a reservation of ``reserve`` values at a time.

    Thread-safe. ``reserve`` trades disk writes (one fsync per ``reserve`` messages) against the nonces
    skipped after a crash, which cost nothing.
    """

    def __init__(self, path: str | os.PathLike[str], reserve: int = 1024) -> None:
        if reserve < 1:
            raise ValueError(f"reserve must be >= 1, got {reserve}")
        self.path = Path(path)
        self.reserve = reserve
        self._lock = threading.Lock()
        persisted = self._read_reservation()
        start = _now_micros() if persisted is None else max(persisted + 1, _now_micros())
        self._next = start
        self._reserved_upto = start - 1  # nothing reserved yet in this process: the first next() persists

    def _read_reservation(self) -> int | None:
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError:
            return None
        except OSError as e:
            raise NonceStateError(f"cannot read nonce state {self.path}: {e}") from e
        try:
            state = json.loads(raw)
            value = state["reserved_upto"]
            if state.get("version") != _STATE_VERSION or type(value) is not int or not 0 <= value < NONCE_LIMIT:
                raise ValueError(f"unexpected content {state!r}")
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            # Refuse to guess: restarting from the clock could reuse nonces if the clock is behind.
            raise NonceStateError(f"corrupt nonce state {self.path}: {e}; delete it only if you must") from e
        return value

    def _persist(self, reserved_upto: int) -> None:
        payload = json.dumps({"version": _STATE_VERSION, "reserved_upto": reserved_upto}).encode()
        try:
            write_atomically(self.path, payload)
        except OSError as e:
            raise NonceStateError(f"cannot write nonce state {self.path}: {e}") from e

    def next(self) -> int:
        """Return a nonce larger than every one returned before, by this or any earlier process."""
        with self._lock:
            value = self._next
            if value >= NONCE_LIMIT:
                raise NonceStateError("nonce range exhausted (2**64)")
            if value > self._reserved_upto:
                upto = min(value + self.reserve - 1, NONCE_LIMIT - 1)
                self._persist(upto)  # persist BEFORE handing out, or a crash could reuse value
                self._reserved_upto = upto
            self._next = value + 1
            return value

    def peek(self) -> int:
        """The nonce the next call to :meth:`next` returns (nothing is consumed or written)."""
        with self._lock:
            return self._next

    @property
    def reserved_upto(self) -> int:
        """The highest nonce persisted as reserved (below the first value a restarted process may use)."""
        with self._lock:
            return self._reserved_upto


class VolatileNonceCounter:
    """Strictly increasing nonces kept in memory only: for identities that live as long as their process (a
    simulation's nodes), where no restart can reuse a nonce. Starts at the clock in microseconds."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._next = _now_micros()

    def next(self) -> int:
        with self._lock:
            value = self._next
            self._next += 1
            return value


class NonceSource(Protocol):
    """What a signer draws nonces from: :class:`NonceCounter` (persisted) or :class:`VolatileNonceCounter`."""

    def next(self) -> int: ...
