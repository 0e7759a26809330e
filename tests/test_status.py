"""The status endpoint serves the node's snapshot and Prometheus metrics over real HTTP."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import pytest
from prometheus_client import CollectorRegistry

from dgrpo.daemon.status import NodeMetrics, StatusServer, WireCollector
from dgrpo.net.memory import InMemoryNetwork
from dgrpo.protocol.limits import Limits
from dgrpo.protocol.messages import DEFAULT_SAMPLING, Rollout
from dgrpo.round.admit import Admitter
from dgrpo.tasks.arith import ArithTask
from dgrpo.tasks.base import Prompt


def rollout_of(author: str, prompt: Prompt) -> Rollout:
    return Rollout(
        author=author,
        round=1,
        part=0,
        parts=1,
        prompt_id=prompt.id,
        prompt=prompt.text,
        completions=("1+1=2",),
        model_id="m",
        indices=(0,),
        weights="",
        sampling=DEFAULT_SAMPLING,
        split="horizontal",
    )


def test_status_metrics_and_404() -> None:
    # The message counters are read from a real transport at scrape time: junk bytes and a valid message
    # arrive on an in-memory network and both show.
    network = InMemoryNetwork("run")
    transport = network.join("node-0")
    sender = network.join("node-1")
    admitter = Admitter(ArithTask(), "horizontal", Limits(), "node-0")
    metrics = NodeMetrics()
    metrics.registry.register(WireCollector(transport.statistics, admitter.statistics))
    metrics.round.set(7)
    network.inject(b"junk")
    prompt = ArithTask().train_prompt(0)
    network.deliver("node-1", sender.signer.sign_rollout(rollout_of("node-1", prompt)))
    state = {"peer_id": "12D3KooWtest", "round": 7, "rejected": {"malformed": 1}}
    server = StatusServer("127.0.0.1", 0, lambda: state, metrics.registry).start()
    try:
        with urllib.request.urlopen(server.url + "/status", timeout=5) as resp:
            assert json.loads(resp.read()) == state
        with urllib.request.urlopen(server.url + "/metrics", timeout=5) as resp:
            text = resp.read().decode()
        assert "dgrpo_round 7.0" in text
        assert 'dgrpo_messages_rejected_total{reason="malformed"} 1.0' in text
        assert "dgrpo_messages_accepted_total 1.0" in text
        assert 'dgrpo_peer_messages_rejected_total{peer="unknown",reason="malformed"} 1.0' in text
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(server.url + "/nope", timeout=5)
        assert err.value.code == 404
    finally:
        server.stop()


def test_a_request_that_never_ends_is_dropped_and_a_vanished_client_is_one_log_line(
    caplog: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture[str]
) -> None:
    import logging
    import socket
    import time

    server = StatusServer("127.0.0.1", 0, lambda: {"ok": True}, CollectorRegistry(), request_timeout=0.5).start()
    try:
        # Headers never ended: the server closes the connection after its timeout instead of waiting forever.
        with socket.create_connection(("127.0.0.1", server.port), timeout=5) as sock:
            sock.sendall(b"GET /status HTTP/1.1\r\nHost: x\r\n")
            t0 = time.monotonic()
            assert sock.recv(1024) == b""  # closed by the server
            assert time.monotonic() - t0 < 4
        # The server still answers others.
        with urllib.request.urlopen(server.url + "/status", timeout=5) as resp:
            assert json.loads(resp.read()) == {"ok": True}
    finally:
        server.stop()
    # A client gone mid-answer: one line at INFO, no traceback on stderr.
    http = StatusServer("127.0.0.1", 0, lambda: {}, CollectorRegistry())._server
    caplog.clear()  # what the first server logged (its live page) where another test left dgrpo at INFO
    with caplog.at_level(logging.INFO, logger="dgrpo.daemon.status"):
        try:
            raise BrokenPipeError(32, "Broken pipe")
        except BrokenPipeError:
            http.handle_error(None, ("127.0.0.1", 5555))
    http.server_close()
    lines = [r.getMessage() for r in caplog.records]
    assert lines == ["status http: client ('127.0.0.1', 5555) went away (BrokenPipeError)"]
    # socketserver's default handle_error prints this header and the traceback to stderr. (Only the header is
    # checked: in the full suite a handler another test left on a closed stream prints its own logging error.)
    assert "Exception occurred during processing of request" not in capsys.readouterr().err


def test_per_peer_rejections_of_every_stage_are_counters_read_at_scrape_time() -> None:
    from prometheus_client.parser import text_string_to_metric_families

    from dgrpo.net.transport import TransportStatistics
    from dgrpo.round.admit import AdmissionStatistics

    wire = {"rejected": TransportStatistics()}
    admission = AdmissionStatistics({"duplicate_part": 2}, {"bob": 2}, {"bob": {"duplicate_part": 2}})
    registry = CollectorRegistry()
    registry.register(WireCollector(lambda: wire["rejected"], lambda: admission))
    wire["rejected"] = TransportStatistics(  # changed after registration: read at scrape time
        rejected_by_reason={"oversize_rpc": 3, "bad_signature": 1},
        rejected_by_peer={"eve": 4},
        rejected_by_peer_reason={"eve": {"oversize_rpc": 3, "bad_signature": 1}},
    )
    from prometheus_client import generate_latest

    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(generate_latest(registry).decode())
        for s in family.samples
        if s.name.endswith("_total")
    }
    assert samples == {
        ("dgrpo_messages_accepted_total", ()): 0.0,
        ("dgrpo_messages_rejected_total", (("reason", "bad_signature"),)): 1.0,
        ("dgrpo_messages_rejected_total", (("reason", "oversize_rpc"),)): 3.0,
        ("dgrpo_admission_rejected_total", (("reason", "duplicate_part"),)): 2.0,
        ("dgrpo_peer_messages_rejected_total", (("peer", "eve"), ("reason", "bad_signature"))): 1.0,
        ("dgrpo_peer_messages_rejected_total", (("peer", "eve"), ("reason", "oversize_rpc"))): 3.0,
        ("dgrpo_peer_admission_rejected_total", (("peer", "bob"), ("reason", "duplicate_part"))): 2.0,
    }
