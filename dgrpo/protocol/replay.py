"""Per-author sliding anti-replay window over message nonces, persisted across restarts.

This is the IPsec anti-replay window (RFC 4303 sec. 3.4.3; the bitmap form of RFC 6479): for each author
we keep the highest nonce seen (``top``) and a bitmap of which of the ``window`` nonces ``top``,
``top - 1``, ..., ``top - window + 1`` were seen. A nonce above ``top`` is new; one inside the window is
new unless its bit is set ("replay"); one below the window cannot be judged any more and is rejected
("stale_nonce"). Authors may therefore publish out of order by up to ``window`` nonces.

Memory bound: ``max_authors`` authors of ``window / 8`` bytes each plus a small constant (about 600 bytes
per author for the default window of 4096; ~6 MB for 10,000 authors). When more authors appear the least
recently seen is forgotten; its old messages could then be accepted again, but the receiver's timestamp
check (clock-skew window) still rejects anything older than a few minutes.

Equivocation: the guard also keeps a digest of the signed content of the last ``max_digests`` accepted
messages (16 bytes each, see :func:`dgrpo.protocol.envelope.content_digest`), keyed by (author, nonce). A
second message with a known (author, nonce) but another digest is ``"equivocation"``, not a replay: the
author signed two contents under one nonce, which an honest node never does (its nonces only increase).
Equivocating messages must both pass the timestamp check, so digests only need to outlive the clock-skew
window: the default 16,384 covers 68 accepted messages a second for 4 minutes in about 4 MB. Every digest
kept is of a message the author really signed, so a digest stays valid evidence even after its nonce left
the window or its author was forgotten; where no digest is known (evicted, or a state file written before
digests existed) a repeated nonce is a plain replay, as before.
"""

from __future__ import annotations

import json
import os
import threading
from collections import OrderedDict
from pathlib import Path
from typing import Any

from dgrpo.atomic import write_atomically
from dgrpo.errors import DgrpoError

REPLAY = "replay"
EQUIVOCATION = "equivocation"
STALE_NONCE = "stale_nonce"
DIGEST_BYTES = 16
DEFAULT_MAX_DIGESTS = 16_384
_STATE_VERSION = 1  # "digests" was added without a version bump: older files simply have none


class ReplayStateError(DgrpoError):
    """A saved replay state cannot be read or is corrupt."""


class ReplayGuard:
    """Remembers which (author, nonce) pairs were seen. Thread-safe: a daemon writes its checkpoint (``to_dict``)
    in a worker thread while the validator records nonces in the network's thread; iterating the dicts while
    they change raised ``OrderedDict mutated during iteration`` and took a daemon down (the SIGKILL soak)."""

    def __init__(
        self, window: int = 4096, *, max_authors: int = 10_000, max_digests: int = DEFAULT_MAX_DIGESTS
    ) -> None:
        if window < 1:
            raise ValueError(f"window must be >= 1, got {window}")
        if max_authors < 1:
            raise ValueError(f"max_authors must be >= 1, got {max_authors}")
        if max_digests < 0:
            raise ValueError(f"max_digests must be >= 0, got {max_digests}")
        self.window = window
        self.max_authors = max_authors
        self.max_digests = max_digests
        # author -> (top, bitmap); bit i of bitmap set <=> nonce top - i was seen. Ordered by last record().
        self._authors: OrderedDict[str, tuple[int, int]] = OrderedDict()
        # (author, nonce) -> digest of the content accepted under it; ordered by record(), oldest first.
        self._digests: OrderedDict[tuple[str, int], bytes] = OrderedDict()
        self._lock = threading.RLock()

    def check(self, author: str, nonce: int, digest: bytes | None = None) -> str | None:
        """``"equivocation"``, ``"replay"``, ``"stale_nonce"``, or None if the nonce is new. Records nothing.

        ``digest`` is the content digest of the message being checked; it is ``"equivocation"`` when another
        digest is known for (author, nonce), whatever the window says (the known digest proves the author
        signed other content under this nonce). The caller must have verified the signature first, or a
        forger could make any author look like an equivocator.
        """
        with self._lock:
            return self._check_unlocked(author, nonce, digest)

    def record(self, author: str, nonce: int, digest: bytes | None = None) -> None:
        """Mark ``nonce`` seen, with the content ``digest`` if given. Call only after :meth:`check` returned None
        (recording twice is harmless)."""
        with self._lock:
            self._record_unlocked(author, nonce, digest)

    def merge(self, other: ReplayGuard) -> None:
        """Add everything ``other`` has seen (e.g. the copy in a checkpoint); a nonce seen by either stays seen.

        Both windows are aligned on the higher ``top``; positions ``other`` could not judge (its window is
        smaller than ours) are marked seen, as in :meth:`from_dict`.
        """
        with self._lock:
            self._merge_unlocked(other)

    def to_dict(self) -> dict[str, Any]:
        """JSON-compatible state; authors in least-recently-seen-first order, bitmaps and digests as hex strings."""
        with self._lock:
            return self._to_dict_unlocked()

    def __len__(self) -> int:
        return len(self._authors)

    def highest(self, author: str) -> int | None:
        """The highest nonce recorded for ``author``, or None if unknown (or forgotten)."""
        entry = self._authors.get(author)
        return None if entry is None else entry[0]

    def digest(self, author: str, nonce: int) -> bytes | None:
        """The content digest recorded for (``author``, ``nonce``), or None if unknown."""
        return self._digests.get((author, nonce))

    def _check_unlocked(self, author: str, nonce: int, digest: bytes | None = None) -> str | None:
        if digest is not None:
            known = self._digests.get((author, nonce))
            if known is not None and known != digest:
                return EQUIVOCATION
        entry = self._authors.get(author)
        if entry is None:
            return None
        top, bitmap = entry
        if nonce > top:
            return None
        offset = top - nonce
        if offset >= self.window:
            return STALE_NONCE
        return REPLAY if (bitmap >> offset) & 1 else None

    def _record_unlocked(self, author: str, nonce: int, digest: bytes | None = None) -> None:
        if digest is not None and self.max_digests > 0:
            self._digests.pop((author, nonce), None)
            self._digests[(author, nonce)] = digest  # (re)inserted last: the newest is forgotten last
            while len(self._digests) > self.max_digests:
                self._digests.popitem(last=False)
        mask = (1 << self.window) - 1
        entry = self._authors.pop(author, None)
        if entry is None:
            top, bitmap = nonce, 1
        else:
            top, bitmap = entry
            if nonce > top:
                shift = nonce - top
                bitmap = ((bitmap << shift) | 1) & mask if shift < self.window else 1
                top = nonce
            elif top - nonce < self.window:
                bitmap |= 1 << (top - nonce)
        self._authors[author] = (top, bitmap)  # (re)inserted last: most recently seen
        while len(self._authors) > self.max_authors:
            self._authors.popitem(last=False)

    def _merge_unlocked(self, other: ReplayGuard) -> None:
        mask = (1 << self.window) - 1
        unknown = mask & ~((1 << other.window) - 1)
        for author, (o_top, o_bitmap) in other._authors.items():
            o_bitmap |= unknown
            mine = self._authors.pop(author, None)
            if mine is None:
                top, bitmap = o_top, o_bitmap & mask
            else:
                top = max(mine[0], o_top)
                bitmap = ((mine[1] << (top - mine[0])) | (o_bitmap << (top - o_top))) & mask
            self._authors[author] = (top, bitmap)
        while len(self._authors) > self.max_authors:
            self._authors.popitem(last=False)
        # Theirs first (older), then ours; on a conflict ours wins, being at least as new as a checkpoint's copy.
        merged = OrderedDict((key, d) for key, d in other._digests.items() if key not in self._digests)
        merged.update(self._digests)
        self._digests = merged
        while len(self._digests) > self.max_digests:
            self._digests.popitem(last=False)

    def _to_dict_unlocked(self) -> dict[str, Any]:
        return {
            "version": _STATE_VERSION,
            "window": self.window,
            "authors": [[a, top, format(bitmap, "x")] for a, (top, bitmap) in self._authors.items()],
            "digests": [[a, nonce, digest.hex()] for (a, nonce), digest in self._digests.items()],
        }

    @classmethod
    def from_dict(
        cls,
        data: Any,
        *,
        window: int | None = None,
        max_authors: int = 10_000,
        max_digests: int = DEFAULT_MAX_DIGESTS,
    ) -> ReplayGuard:
        """Rebuild a guard; ``window`` (default: the saved one) may differ from the saved window.

        Growing the window marks the newly covered, never observed positions as seen: rejecting a few old
        nonces is harmless, accepting a replay is not. A state without ``"digests"`` (written before they
        existed) loads with none: its repeated nonces are replays, never equivocations.
        """
        try:
            if data.get("version") != _STATE_VERSION:
                raise ValueError(f"unsupported version {data.get('version')!r}")
            saved_window = data["window"]
            if type(saved_window) is not int or saved_window < 1:
                raise ValueError(f"bad window {saved_window!r}")
            guard = cls(saved_window if window is None else window, max_authors=max_authors, max_digests=max_digests)
            new_mask = (1 << guard.window) - 1
            unknown = new_mask & ~((1 << saved_window) - 1)
            for author, top, bitmap_hex in data["authors"]:
                if type(author) is not str or type(top) is not int or top < 0 or type(bitmap_hex) is not str:
                    raise ValueError(f"bad entry {author!r}")
                bitmap = (int(bitmap_hex, 16) | unknown) & new_mask
                guard._authors[author] = (top, bitmap)
            for author, nonce, digest_hex in data.get("digests", []):
                if type(author) is not str or type(nonce) is not int or nonce < 0 or type(digest_hex) is not str:
                    raise ValueError(f"bad digest entry {author!r}")
                digest = bytes.fromhex(digest_hex)
                if len(digest) != DIGEST_BYTES:
                    raise ValueError(f"bad digest length {len(digest)} for {author!r}")
                guard._digests[(author, nonce)] = digest
        except (AttributeError, KeyError, TypeError, ValueError) as e:
            raise ReplayStateError(f"corrupt replay state: {e}") from e
        while len(guard._authors) > guard.max_authors:
            guard._authors.popitem(last=False)
        while len(guard._digests) > guard.max_digests:
            guard._digests.popitem(last=False)
        return guard

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write the state atomically (temp file, fsync, rename) as JSON."""
        try:
            write_atomically(Path(path), json.dumps(self.to_dict(), separators=(",", ":")).encode())
        except OSError as e:
            raise ReplayStateError(f"cannot write replay state {path}: {e}") from e

    @classmethod
    def load(
        cls,
        path: str | os.PathLike[str],
        *,
        window: int | None = None,
        max_authors: int = 10_000,
        max_digests: int = DEFAULT_MAX_DIGESTS,
    ) -> ReplayGuard:
        try:
            raw = Path(path).read_bytes()
        except OSError as e:
            raise ReplayStateError(f"cannot read replay state {path}: {e}") from e
        try:
            data = json.loads(raw)
        except ValueError as e:
            raise ReplayStateError(f"corrupt replay state {path}: {e}") from e
        return cls.from_dict(data, window=window, max_authors=max_authors, max_digests=max_digests)

    @classmethod
    def load_or_create(
        cls,
        path: str | os.PathLike[str],
        *,
        window: int = 4096,
        max_authors: int = 10_000,
        max_digests: int = DEFAULT_MAX_DIGESTS,
    ) -> ReplayGuard:
        """:meth:`load` if ``path`` exists, else a new empty guard (a node's first start)."""
        if not Path(path).exists():
            return cls(window, max_authors=max_authors, max_digests=max_digests)
        return cls.load(path, window=window, max_authors=max_authors, max_digests=max_digests)
