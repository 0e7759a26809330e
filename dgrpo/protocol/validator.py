"""Checks every received message and returns a verdict; never raises for hostile input.

The checks run cheapest first and in the order of ``docs/protocol.md`` ("Validation"), so a flood of junk
costs no signature verification and no replay-state update: size, decoding and schema, version, run,
kind (topic), limits, timestamp, signature, author versus the gossipsub source, replay (and equivocation).
Only a message that passes every check has its nonce recorded, with a digest of its signed content.

Blacklisting policy: every rejection is counted by reason and by peer, but only rejections that prove a
peer misbehaves count towards blacklisting, and only where the peer is authenticated. Replays, stale
nonces and clock skew are left out because an honest peer produces them (gossip re-delivery after our
restart, a slow clock). The peer is authenticated when ``source_peer`` is given (gossipsub's strict
signing checked it) or when the envelope's signature verified; without that a forger could get any
author blacklisted by sending junk in its name.

Equivocation (one author, one nonce, two signed contents) is decided at the replay check, after the
signature verified: it proves misbehaviour, so a single one flags the author for blacklisting. Only the
first of the two messages is accepted. gossipsub's own equivocation check (py-libp2p's
``equivocation_detection``) cannot hide ours: it keys on the pubsub ``(from, seqno)``, while our nonce is
inside the signed payload; every publish takes a fresh seqno, so two envelopes with the same dgrpo nonce
travel as two distinct pubsub messages and both reach this validator. (A sender that also reuses the
seqno gets whichever copy arrives second at a node dropped there as already seen, before validation: every
node then validates, and accepts, at most one of the two anyway, but cannot flag the sender.)
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import Counter, OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from dgrpo.protocol.counting import PeerReasons
from dgrpo.protocol.envelope import (
    Envelope,
    HeartbeatBody,
    PeerNaming,
    ProtocolError,
    RolloutBody,
    author_peer_id,
    canonical_bytes,
    content_digest,
    decode,
    verify_signature,
)
from dgrpo.protocol.identity import peer_id_from_public_bytes
from dgrpo.protocol.limits import Limits
from dgrpo.protocol.messages import MAX_ID_CHARS
from dgrpo.protocol.replay import EQUIVOCATION, ReplayGuard
from dgrpo.protocol.topics import validate_run_id
from dgrpo.protocol.update_bodies import MAX_CLIENT_CHARS, GlobalBody

# Every reason code, in validation order (documented in docs/protocol.md).
REASONS = (
    "oversize",
    "malformed",
    "unsupported_version",
    "schema",
    "wrong_run",
    "wrong_kind",
    "too_many_completions",
    "completion_too_long",
    "prompt_too_long",
    "string_too_long",
    "too_many_chunks",
    "update_too_large",
    "stale",
    "future",
    "bad_signature",
    "wrong_author",
    "replay",
    "equivocation",
    "stale_nonce",
)
# Honest peers produce these (re-delivered gossip, clock skew): counted, but never a reason to blacklist.
BENIGN_REASONS = frozenset({"stale", "future", "replay", "stale_nonce"})
UNKNOWN_PEER = "unknown"
INTERNAL_ERROR = "internal_error"  # a bug in the validator, not a protocol reason; never penalised
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class MessageVerdict:
    ok: bool
    reason: str | None = None
    # The decoded envelope; on a rejection after decoding it is there for diagnostics only (not authenticated).
    envelope: Envelope | None = None
    peer: str | None = None  # the peer the message is attributed to (see MessageValidator.validate)


@dataclass(frozen=True)
class ValidatorStatistics:
    accepted: int
    rejected: int
    rejected_by_reason: Mapping[str, int]
    rejected_by_peer: Mapping[str, int]
    penalties_by_peer: Mapping[str, int]  # rejections that count towards blacklisting
    blacklist_candidates: tuple[str, ...]  # peers at or over limits.blacklist_after, and equivocators
    equivocators: tuple[str, ...] = ()  # authors proved to have signed two contents under one nonce
    rejected_by_peer_reason: Mapping[str, Mapping[str, int]] = field(default_factory=dict)  # rejected_by_peer by reason


class _Reject(Exception):
    def __init__(self, reason: str) -> None:
        self.reason = reason


class MessageValidator:
    """Validates wire messages for one run. Thread-safe; the replay guard is owned by the validator.

    ``rejected_by_reason``, ``rejected_by_peer`` and ``accepted`` are live; read them through
    :meth:`statistics` from other threads. Without ``replay`` a fresh guard is made from ``limits``; a
    given one keeps its own window (load it with ``ReplayGuard.load_or_create(path, window=...)``); the caller
    persists it with :meth:`save_replay_state` at shutdown and periodically.
    """

    def __init__(
        self,
        run_id: str,
        limits: Limits | None = None,
        replay: ReplayGuard | None = None,
        clock: Callable[[], float] = time.time,
        naming: PeerNaming = peer_id_from_public_bytes,
    ) -> None:
        self.run_id = validate_run_id(run_id)
        self.naming = naming
        self.limits = limits or Limits()
        self.replay = (
            replay
            if replay is not None
            else ReplayGuard(self.limits.replay_window, max_authors=self.limits.max_tracked_peers)
        )
        self.clock = clock
        self.accepted = 0
        self.rejected_by_reason: Counter[str] = Counter()
        self.rejected_by_peer: Counter[str] = Counter()
        self._peer_reasons = PeerReasons(self.limits.max_tracked_peers)  # same cap and order: the same peers
        # peer -> penalised rejections; ordered by last penalty so the least recent is forgotten first
        self._penalties: OrderedDict[str, int] = OrderedDict()
        # peer -> equivocations seen; one is proof enough to blacklist (bounded like the penalties)
        self._equivocators: OrderedDict[str, int] = OrderedDict()
        self._lock = threading.Lock()

    # ------------------------------------------------------------------ checks
    def _check_limits(self, env: Envelope) -> None:
        lim = self.limits
        body = env.body
        if isinstance(body, RolloutBody):
            if len(body.completions) > lim.max_completions:
                raise _Reject("too_many_completions")
            if any(len(c) > lim.max_completion_chars for c in body.completions):
                raise _Reject("completion_too_long")
            if len(body.prompt) > lim.max_prompt_chars:
                raise _Reject("prompt_too_long")
            ids: tuple[str, ...] = (body.prompt_id, body.model_id)
            cap = min(lim.max_string_chars, MAX_ID_CHARS)  # the protocol's own cap, whatever the limits say
        elif isinstance(body, HeartbeatBody):
            ids, cap = body.listen_addrs, lim.max_string_chars
        else:  # a chunk of a federated update
            ids = body.clients if isinstance(body, GlobalBody) else ()
            cap = min(lim.max_string_chars, MAX_CLIENT_CHARS)
        # One reason for every identifier over its cap (the schema bounds none of them).
        if any(len(s) > cap for s in ids):
            raise _Reject("string_too_long")
        if not isinstance(body, RolloutBody | HeartbeatBody):
            if body.chunks > lim.max_update_chunks:
                raise _Reject("too_many_chunks")
            if body.size > lim.max_update_bytes:
                raise _Reject("update_too_large")

    def _check_time(self, env: Envelope) -> None:
        now_ms = self.clock() * 1000.0
        skew_ms = self.limits.clock_skew_seconds * 1000.0
        if env.ts < now_ms - skew_ms:
            raise _Reject("stale")
        if env.ts > now_ms + skew_ms:
            raise _Reject("future")

    def validate(self, data: bytes, source_peer: str | None = None, expected_kind: str | None = None) -> MessageVerdict:
        """Accept or reject ``data``; only an accepted message's (author, nonce) is recorded.

        ``source_peer``: the message's originator as authenticated by gossipsub's strict signing (``from``
        field), if known; the envelope's author must be that peer. ``expected_kind``: the kind the topic
        carries (``"rollout"`` on the rollouts topic, ``"heartbeat"`` on the control topic).
        A rejection is attributed to ``source_peer``, else to the envelope's author (if it decoded), else to
        ``"unknown"``.
        """
        env: Envelope | None = None
        author: str | None = None
        authenticated = source_peer is not None
        try:
            try:
                env = decode(data, self.limits)  # size, msgpack, version, schema
            except ProtocolError as e:
                raise _Reject(e.reason) from None
            author = author_peer_id(env, self.naming)
            if env.run != self.run_id:
                raise _Reject("wrong_run")
            if expected_kind is not None and env.kind != expected_kind:
                raise _Reject("wrong_kind")
            self._check_limits(env)
            self._check_time(env)
            signed = canonical_bytes(env)  # once: the signature and the replay digest both cover it
            if not verify_signature(env, signed):
                raise _Reject("bad_signature")
            authenticated = True
            if source_peer is not None and source_peer != author:
                raise _Reject("wrong_author")
            digest = content_digest(env, signed)
            with self._lock:
                reason = self.replay.check(author, env.nonce, digest)
                if reason is not None:
                    raise _Reject(reason)
                self.replay.record(author, env.nonce, digest)
                self.accepted += 1
            return MessageVerdict(ok=True, envelope=env, peer=source_peer or author)
        except _Reject as r:
            peer = source_peer or author or UNKNOWN_PEER
            self._count_rejection(
                r.reason,
                peer,
                penalise=authenticated and r.reason not in BENIGN_REASONS,
                # the signature verified and source_peer (if any) is the author: the proof is the author's own
                equivocation=r.reason == EQUIVOCATION,
            )
            return MessageVerdict(ok=False, reason=r.reason, envelope=env, peer=peer)
        except Exception:  # a bug, not hostile input; still never let it escape into gossipsub
            log.exception("message validation failed unexpectedly")
            peer = source_peer or author or UNKNOWN_PEER
            self._count_rejection(INTERNAL_ERROR, peer, penalise=False)
            return MessageVerdict(ok=False, reason=INTERNAL_ERROR, envelope=None, peer=peer)

    def save_replay_state(self, path: str | os.PathLike[str]) -> None:
        """Persist the replay guard atomically, consistent with concurrent validation."""
        with self._lock:
            self.replay.save(path)

    # ------------------------------------------------------------------ counters and policy
    def _count_rejection(self, reason: str, peer: str, *, penalise: bool, equivocation: bool = False) -> None:
        cap = self.limits.max_tracked_peers
        with self._lock:
            self.rejected_by_reason[reason] += 1
            count = self.rejected_by_peer.pop(peer, 0) + 1
            self.rejected_by_peer[peer] = count  # reinserted last: dict order is recency of rejection
            while len(self.rejected_by_peer) > cap:
                del self.rejected_by_peer[next(iter(self.rejected_by_peer))]
            self._peer_reasons.add(peer, reason)
            if penalise:
                self._penalties[peer] = self._penalties.pop(peer, 0) + 1
                while len(self._penalties) > cap:
                    self._penalties.popitem(last=False)
            if equivocation:
                self._equivocators[peer] = self._equivocators.pop(peer, 0) + 1
                while len(self._equivocators) > cap:
                    self._equivocators.popitem(last=False)

    def should_blacklist(self, peer: str) -> bool:
        """True once ``peer`` has ``limits.blacklist_after`` penalised rejections, or at once after an equivocation
        (proof of misbehaviour, not a symptom); the network layer acts on it."""
        if peer == UNKNOWN_PEER:
            return False
        with self._lock:
            return peer in self._equivocators or self._penalties.get(peer, 0) >= self.limits.blacklist_after

    def penalties(self, peer: str) -> int:
        """``peer``'s rejections that count towards blacklisting (the transport adds its own to them)."""
        with self._lock:
            return self._penalties.get(peer, 0)

    def statistics(self) -> ValidatorStatistics:
        with self._lock:
            threshold = self.limits.blacklist_after
            return ValidatorStatistics(
                accepted=self.accepted,
                rejected=sum(self.rejected_by_reason.values()),
                rejected_by_reason=MappingProxyType(dict(self.rejected_by_reason)),
                rejected_by_peer=MappingProxyType(dict(self.rejected_by_peer)),
                penalties_by_peer=MappingProxyType(dict(self._penalties)),
                blacklist_candidates=tuple(
                    sorted({p for p, n in self._penalties.items() if n >= threshold} | self._equivocators.keys())
                ),
                equivocators=tuple(sorted(self._equivocators)),
                rejected_by_peer_reason=MappingProxyType(self._peer_reasons.snapshot()),
            )
