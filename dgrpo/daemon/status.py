"""The node's local HTTP status endpoint (``/status`` JSON, ``/metrics`` Prometheus text, ``/healthz``, and at
``/`` a read-only live page drawn from ``/status``: :mod:`dgrpo.daemon.live_page`).

It runs in a daemon thread with the standard library's HTTP server, apart from the trio loop, so a slow
scraper never stalls the network; it only reads a snapshot the node publishes after each change.
"""

from __future__ import annotations

import json
import logging
import sys
import threading
from collections.abc import Callable, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, generate_latest
from prometheus_client.core import CounterMetricFamily
from prometheus_client.registry import Collector

from dgrpo.daemon.live_page import page_bytes, page_headers
from dgrpo.net.transport import TransportStatistics
from dgrpo.round.admit import AdmissionStatistics

log = logging.getLogger(__name__)


class NodeMetrics:
    """Prometheus metrics of one node, on their own registry (several nodes may share a process in tests)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.round = Gauge("dgrpo_round", "last completed round", registry=r)
        self.peers = Gauge("dgrpo_peers", "peers currently connected", registry=r)
        self.active_peers = Gauge("dgrpo_active_peers", "peers heard from recently", registry=r)
        self.mean_reward = Gauge(
            "dgrpo_mean_reward", "mean reward of the completions trained on last round", registry=r
        )
        self.completions = Counter("dgrpo_completions_trained", "completions trained on", registry=r)
        self.round_seconds = Gauge("dgrpo_round_seconds", "wall time of the last round", registry=r)
        self.reward_seconds = Gauge("dgrpo_reward_seconds", "time spent scoring the last round", registry=r)
        self.reward_events = Counter(
            "dgrpo_reward_events",
            "how rewards were computed: sandbox runs by outcome, math-verify timeouts",
            ["event"],
            registry=r,
        )
        self.blacklisted = Gauge("dgrpo_blacklisted_peers", "peers blacklisted", registry=r)
        self.defense_checked = Counter(
            "dgrpo_defense_checked", "peer completions checked by the defense chain", ["peer"], registry=r
        )
        self.defense_rejected = Counter(
            "dgrpo_defense_rejected", "peer completions rejected by the defense chain", ["reason"], registry=r
        )
        self.flagged = Counter(
            "dgrpo_flagged_completions_trained",
            "completions trained on that an attack detector flags",
            ["detector"],
            registry=r,
        )


class WireCollector(Collector):
    """The message counters, read from the transport and the admit stage at scrape time (so they are never
    behind): ``dgrpo_messages_accepted_total``, ``dgrpo_messages_rejected_total{reason}`` (the protocol's
    validator), ``dgrpo_messages_dropped_total{where}`` (the transport), ``dgrpo_admission_rejected_total{reason}``
    (the round's admit stage: closed or future round, unknown prompt, duplicate part, ...), and the same two by
    peer: ``dgrpo_peer_messages_rejected_total{peer,reason}`` (the validator's and the transport's, e.g.
    ``oversize_rpc``) and ``dgrpo_peer_admission_rejected_total{peer,reason}``. Peer labels are bounded: each
    stage keeps at most ``limits.max_tracked_peers`` peers, the least recently rejected forgotten first (so a
    forgotten peer's series disappears; the by-reason totals keep counting it)."""

    def __init__(
        self, transport: Callable[[], TransportStatistics], admission: Callable[[], AdmissionStatistics]
    ) -> None:
        self.transport = transport
        self.admission = admission

    def collect(self) -> Any:
        stats = self.transport()
        accepted = CounterMetricFamily("dgrpo_messages_accepted", "messages that passed the protocol's validation")
        accepted.add_metric([], stats.accepted)
        rejected = CounterMetricFamily(
            "dgrpo_messages_rejected", "messages the protocol's validation rejected", labels=["reason"]
        )
        for reason, n in sorted(stats.rejected_by_reason.items()):
            rejected.add_metric([reason], n)
        dropped = CounterMetricFamily("dgrpo_messages_dropped", "valid messages dropped, by where", labels=["where"])
        for where, n in sorted(stats.dropped.items()):
            dropped.add_metric([where], n)
        admitted = self.admission()
        admission = CounterMetricFamily(
            "dgrpo_admission_rejected", "rollouts the round's admit stage rejected", labels=["reason"]
        )
        for reason, n in sorted(admitted.rejected_by_reason.items()):
            admission.add_metric([reason], n)
        by_peer = _by_peer_reason(
            "dgrpo_peer_messages_rejected",
            "messages rejected by the validator or the transport, by the peer they are attributed to",
            stats.rejected_by_peer_reason,
        )
        admission_by_peer = _by_peer_reason(
            "dgrpo_peer_admission_rejected",
            "rollouts the round's admit stage rejected, by author",
            admitted.rejected_by_author_reason,
        )
        yield from (accepted, rejected, dropped, admission, by_peer, admission_by_peer)


def _by_peer_reason(name: str, documentation: str, table: Mapping[str, Mapping[str, int]]) -> CounterMetricFamily:
    family = CounterMetricFamily(name, documentation, labels=["peer", "reason"])
    for peer, reasons in sorted(table.items()):
        for reason, n in sorted(reasons.items()):
            family.add_metric([peer, reason], n)
    return family


class _Handler(BaseHTTPRequestHandler):
    server: StatusHTTPServer

    def do_GET(self) -> None:
        path = self.path.split("?")[0]
        if path == "/status":
            body = json.dumps(self.server.snapshot(), default=str).encode()
            self._send(200, "application/json", body)
        elif path == "/metrics":
            self._send(200, CONTENT_TYPE_LATEST, generate_latest(self.server.registry))
        elif self.path == "/healthz":
            self._send(200, "text/plain", b"ok\n")
        elif path in ("/", "/index.html"):
            self._send(200, "text/html; charset=utf-8", page_bytes(), page_headers())
        elif path == "/favicon.ico":  # the page names an empty data: icon; a browser that asks anyway gets none
            self._send(204, "image/x-icon", b"")
        else:
            self._send(404, "text/plain", b"not found: try /, /status or /metrics\n")

    def _send(self, code: int, content_type: str, body: bytes, headers: Mapping[str, str] | None = None) -> None:
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("status http: " + format, *args)


class StatusHTTPServer(ThreadingHTTPServer):
    """``request_timeout``: seconds a client may take to send its request (and to read the answer); a request
    that never ends its headers is dropped then instead of holding a thread forever. A client that goes away
    mid-answer is one log line, not a traceback."""

    daemon_threads = True

    def __init__(
        self,
        address: tuple[str, int],
        snapshot: Callable[[], dict[str, Any]],
        registry: CollectorRegistry,
        request_timeout: float = 10.0,
    ) -> None:
        handler = type("_TimedHandler", (_Handler,), {"timeout": request_timeout})
        super().__init__(address, handler)
        self.snapshot = snapshot
        self.registry = registry

    def handle_error(self, request: Any, client_address: Any) -> None:
        exc = sys.exc_info()[1]
        if isinstance(exc, ConnectionError | TimeoutError):
            log.info("status http: client %s went away (%s)", client_address, type(exc).__name__)
        else:
            log.warning("status http: request from %s failed: %r", client_address, exc)


class StatusServer:
    """Serve ``snapshot()`` and ``registry`` on ``host:port`` (port 0: a free port) in a background thread."""

    def __init__(
        self,
        host: str,
        port: int,
        snapshot: Callable[[], dict[str, Any]],
        registry: CollectorRegistry,
        request_timeout: float = 10.0,
    ) -> None:
        self._server = StatusHTTPServer((host, port), snapshot, registry, request_timeout)
        self._thread = threading.Thread(target=self._server.serve_forever, name="dgrpo-status", daemon=True)

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    @property
    def url(self) -> str:
        host = str(self._server.server_address[0])
        return f"http://{host}:{self.port}"

    @property
    def page_url(self) -> str:
        """The live page (``/``), for a browser."""
        return self.url + "/"

    def start(self) -> StatusServer:
        self._thread.start()
        log.info("live page %s (open it in a browser; /status JSON, /metrics Prometheus)", self.page_url)
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
