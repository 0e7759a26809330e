"""The run manifest on libp2p streams (``docs/protocol.md``, "Run manifest", "Stream"): every node serves the
manifest it holds; a joiner fetches one from a bootstrap address; a running node checks each peer's once.

Serving answers a valid request with the document and nothing else (at most ``streams`` at a time, each
bounded by a timeout). Fetching bounds the answer's size before reading it and checks it as
:func:`dgrpo.protocol.manifest.verify_document` does. Every failed check is a verdict with a reason,
counted by peer (``/status`` ``manifest.rejected_by_peer``); nothing raises for a hostile or broken peer.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from contextlib import suppress
from typing import Any

import trio

from dgrpo.net.gossip import GossipConfig, GossipNode
from dgrpo.net.streams import Stream, StreamError
from dgrpo.net.traversal_config import TraversalConfig
from dgrpo.protocol.counting import PeerReasons
from dgrpo.protocol.identity import Identity
from dgrpo.protocol.manifest import ManifestVerdict, SignedManifest, verify_document
from dgrpo.protocol.manifest_wire import LENGTH_BYTES, MANIFEST_PROTOCOL, REQUEST, answer_length, encode_answer

log = logging.getLogger("dgrpo.daemon")

SERVE_STREAMS = 8  # a document is a few KiB: cheap, but a flood of streams must not pile up
REQUEST_TIMEOUT_SECONDS = 5.0
FETCH_TIMEOUT_SECONDS = 10.0  # a whole exchange, from opening the stream (a dial included)
AUDIT_INTERVAL_SECONDS = 5.0  # between looks for newly connected peers to check
AUDIT_PER_LOOK = 4  # peers checked per look, so that many new connections spread out
AUDIT_ATTEMPTS = 3  # looks at a peer that gave no answer (unavailable, timeout) before it is left alone
MAX_TRACKED_PEERS = 1024  # peers remembered as checked, and kept by the counters


class ManifestFetchFailed(Exception):
    """The stream failed (``unavailable``, ``timeout``) or declared an ``oversize`` answer."""

    def __init__(self, reason: str, detail: str) -> None:
        self.reason = reason
        self.detail = detail
        super().__init__(f"{reason}: {detail}")


async def fetch_document(gossip: GossipNode, peer: str, addrs: Sequence[str] = (), timeout: float = 10.0) -> bytes:
    """The document ``peer`` serves, its length bounded before it is read. Raises :class:`ManifestFetchFailed`."""
    stream: Stream | None = None
    done = False
    try:
        with trio.fail_after(timeout):
            stream = await gossip.open_stream(peer, MANIFEST_PROTOCOL, addrs)
            await stream.write(REQUEST)
            prefix = await stream.read_exactly(LENGTH_BYTES)
            length = answer_length(prefix)
            if length is None:
                raise ManifestFetchFailed("oversize", f"declared {int.from_bytes(prefix, 'big')} bytes")
            document = await stream.read_exactly(length)
            done = True
    except trio.TooSlowError:
        raise ManifestFetchFailed("timeout", f"no manifest within {timeout:g} s") from None
    except StreamError as error:
        raise ManifestFetchFailed("unavailable", str(error)) from None
    finally:
        if stream is not None and done:
            await stream.close()
        elif stream is not None:  # refused or broken off: not read to its end, abort it
            await stream.reset()
    return document


async def fetch_verified(
    gossip: GossipNode,
    peer: str,
    addrs: Sequence[str] = (),
    *,
    run_id: str | None = None,
    pinned: SignedManifest | None = None,
    sha256: str | None = None,
    timeout: float = FETCH_TIMEOUT_SECONDS,
) -> ManifestVerdict:
    """``peer``'s manifest checked (see :func:`verify_document`); never raises."""
    try:
        document = await fetch_document(gossip, peer, addrs, timeout)
    except ManifestFetchFailed as failed:
        return ManifestVerdict(False, failed.reason, failed.detail)
    return verify_document(document, run_id=run_id, pinned=pinned, sha256=sha256)


def split_p2p_address(addr: str) -> str:
    """The peer id a ``.../p2p/<peer id>`` multiaddr ends in ('' when it names none)."""
    head, sep, peer = addr.rpartition("/p2p/")
    return peer if sep and head and peer and "/" not in peer else ""


async def fetch_from_address(
    addr: str, *, sha256: str | None = None, pinned: SignedManifest | None = None, timeout: float = 30.0
) -> ManifestVerdict:
    """A joiner's fetch: a throwaway libp2p host (a fresh key, no relays, nothing announced) connects to
    ``addr`` (a multiaddr ending in ``/p2p/<peer id>``), asks for the manifest and checks it."""
    peer = split_p2p_address(addr)
    if not peer:
        return ManifestVerdict(False, "unavailable", f"{addr!r} does not end in /p2p/<peer id>")
    # nothing to flush on leaving: it publishes nothing
    config = GossipConfig(listen="/ip4/127.0.0.1/tcp/0", dial_timeout=timeout, shutdown_flush_timeout=0.0)
    traversal = TraversalConfig(use_relays=False, hole_punching=False)
    try:
        async with GossipNode.open(config, Identity.generate().to_libp2p_keypair(), traversal) as gossip:
            return await fetch_verified(gossip, peer, [addr], pinned=pinned, sha256=sha256, timeout=timeout)
    except Exception as error:  # the throwaway host itself failed (a bad multiaddr, no free port)
        return ManifestVerdict(False, "unavailable", f"{type(error).__name__}: {error}")


class ManifestService:
    """The manifest a daemon holds: served to every peer that asks, and compared with each peer's own."""

    def __init__(
        self,
        signed: SignedManifest,
        origin: str,
        streams: int = SERVE_STREAMS,
        request_timeout: float = REQUEST_TIMEOUT_SECONDS,
        fetch_timeout: float = FETCH_TIMEOUT_SECONDS,
    ) -> None:
        self.signed = signed
        self.origin = origin  # joined | created | kept
        self.answer = encode_answer(signed.document())
        self.streams = streams
        self.request_timeout = request_timeout
        self.fetch_timeout = fetch_timeout
        self.rejections = PeerReasons(MAX_TRACKED_PEERS)  # peer -> reason -> count, what we refused of theirs
        self.active = 0
        self.served = 0
        self.checked: set[str] = set()  # peers with a final verdict (or out of attempts)
        self.attempts: dict[str, int] = {}
        self.agreeing: set[str] = set()

    # ----------------------------------------------------------------- serving
    def serve(self, gossip: GossipNode) -> None:
        gossip.serve_streams(MANIFEST_PROTOCOL, self.handle)

    async def handle(self, stream: Stream) -> None:
        """Answer one stream; never raises for what the peer sends."""
        if self.active >= self.streams:
            self.rejections.add(stream.peer, "busy")
            await stream.reset()
            return
        self.active += 1
        try:
            request = None
            with trio.move_on_after(self.request_timeout), suppress(StreamError):
                request = await stream.read_exactly(len(REQUEST))
            if request != REQUEST:
                self.rejections.add(stream.peer, "bad_request")
                await stream.reset()
                return
            with trio.move_on_after(self.request_timeout) as scope:
                try:
                    await stream.write(self.answer)
                except StreamError:
                    scope.cancel()
            if scope.cancelled_caught:
                await stream.reset()
                return
            await stream.close()
            self.served += 1
        finally:
            self.active -= 1

    # ----------------------------------------------------------------- checking peers
    def record(self, peer: str, verdict: ManifestVerdict) -> None:
        """Count a peer's manifest: agreeing, refused (by reason), or not available (not counted: a peer of an
        older version serves none, and a flaky stream says nothing about the manifest)."""
        if verdict.ok:
            self.agreeing.add(peer)
        elif verdict.reason not in ("unavailable", "timeout"):
            first = peer not in self.rejections
            self.rejections.add(peer, verdict.reason)
            log.log(logging.WARNING if first else logging.DEBUG, "manifest of %s refused: %s", peer, verdict)

    async def audit(self, gossip: GossipNode, interval: float = AUDIT_INTERVAL_SECONDS) -> None:
        """Check each connected peer's manifest once against ours, ``AUDIT_PER_LOOK`` at a time side by side
        (one after another, slow peers that let each fetch time out kept the others waiting for minutes);
        runs until cancelled."""

        async def check(peer: str) -> None:
            verdict = await fetch_verified(gossip, peer, pinned=self.signed, timeout=self.fetch_timeout)
            self.record(peer, verdict)
            if peer in self.attempts or len(self.attempts) < MAX_TRACKED_PEERS:
                self.attempts[peer] = self.attempts.get(peer, 0) + 1
            # A verdict is final; a peer that could not answer (busy, slow, gone) is asked again next look, up to
            # AUDIT_ATTEMPTS times (one of an older version serves no manifest at all).
            final = verdict.ok or verdict.reason not in ("unavailable", "timeout")
            out_of_tries = self.attempts.get(peer, AUDIT_ATTEMPTS) >= AUDIT_ATTEMPTS
            if (final or out_of_tries) and len(self.checked) < MAX_TRACKED_PEERS:
                self.checked.add(peer)

        while True:
            fresh = sorted(gossip.connected_peers() - self.checked)[:AUDIT_PER_LOOK]
            async with trio.open_nursery() as nursery:
                for peer in fresh:
                    nursery.start_soon(check, peer)
            await trio.sleep(interval)

    def snapshot(self) -> dict[str, Any]:
        m = self.signed.manifest
        return {
            "run_id": m.run_id,
            "sha256": self.signed.sha256,
            "creator": m.creator_peer_id,
            "origin": self.origin,
            "model": m.model_id,
            "base_weights_sha256": m.base_weights.sha256,
            "served": self.served,
            "agreeing_peers": sorted(self.agreeing),
            "rejected_by_peer": self.rejections.snapshot(),
        }
