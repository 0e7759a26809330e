"""What an operator reads: one short human line per round (or one JSON object per log line on request), py-libp2p's
noise about peers that hung up kept at DEBUG without stack traces, and no local variables in a traceback."""

from __future__ import annotations

import io
import json
import logging
import re
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import pytest
import typer
from libp2p.network.stream.exceptions import StreamReset

from dgrpo.cli import app
from dgrpo.daemon import log_setup
from dgrpo.daemon.log_lines import federated_round_text, round_text
from dgrpo.daemon.log_setup import (
    THIRD_PARTY,
    HumanFormatter,
    JsonFormatter,
    LogFormat,
    PeerHangupFilter,
    choose,
    configure,
    is_hangup,
    record_extra,
)
from dgrpo.daemon.observers import RoundLog
from dgrpo.net.streams import StreamError
from dgrpo.round.outcome import Admission, DefenseOutcome, RoundOutcome, ScoredCompletion, Scoring


def round_record(**changes: Any) -> dict[str, Any]:
    """A round's record as rounds.jsonl keeps it (observers.round_line's keys, authors added)."""
    record = {
        "event": "round", "time": 1796652312.69, "peer": "12D3KooWJb4XzBuUDBYRWyXdRa5P3fq5ZXMmR2enC5FfmffyijYp",
        "round": 12, "seconds": 3.14, "reward_seconds": 0.01, "expected_peers": 3, "departed": [], "completions": 36,
        "rejected": {}, "defense_rejected": {"logit:outside_top_k": 2}, "mean_reward": 0.4119, "loss": -0.0026,
        "cpu": {"admit": 0.002, "draw": 0.0, "defend": 0.0, "score": 0.0, "update": 0.3}, "drawn": None,
        "staleness": {}, "filled": 0, "authors": ["a", "b", "c"],
    }  # fmt: skip
    return record | changes


def test_a_round_is_one_short_line() -> None:
    assert round_text(round_record()) == (
        "round  12  peers 3  accepted 36  rejected 2 (defense: logit:outside_top_k)  reward 0.412  3.1s"
    )
    quiet = round_record(round=3, expected_peers=1, completions=32, defense_rejected={}, mean_reward=0.34375)
    assert round_text(quiet | {"seconds": 2.06}) == "round   3  peers 1  accepted 32  rejected 0  reward 0.344  2.1s"


def test_several_reasons_are_counted_each_and_departures_and_accuracy_are_said() -> None:
    busy = round_record(
        round=120,
        rejected={"stale_round": 3, "bad_signature": 0},  # a zero count is no reason
        defense_rejected={"length": 2, "logit:outside_top_k": 2},
        departed=["12D3KooWGEMMx4FGXdqyAFnMMR6o8i2p2PyuhBXyMdiN42ViCc5w"],
        accuracy=0.8126,
        seconds=12.0,
    )
    assert round_text(busy) == (
        "round 120  peers 3  accepted 36  rejected 7 (admission: stale_round 3; defense: length 2, "
        "logit:outside_top_k 2)  reward 0.412  accuracy 0.813  departed 42ViCc5w  12.0s"
    )
    only_admission = round_record(rejected={"replay": 4}, defense_rejected={})
    assert "  rejected 4 (admission: replay)  " in round_text(only_admission)


def test_a_federated_round_is_one_short_line() -> None:
    row = {
        "round": 7, "role": "aggregator", "clients": ["a", "b", "c"], "local_mean": 0.5, "local_std": 0.1,
        "applied": True, "missing": [], "stale": [], "diverged": False, "seconds": 4.25, "global_sha256": "ab" * 32,
    }  # fmt: skip
    assert federated_round_text(row) == "round   7  federated aggregator  clients 3  reward 0.500  4.2s"
    trouble = row | {"missing": ["12D3KooWpeerMISSING1"], "stale": ["12D3KooWpeerSTALE222"], "applied": False}
    assert federated_round_text(trouble | {"diverged": True, "role": "client", "clients": []}) == (
        "round   7  federated client  clients 0  reward 0.500  missing MISSING1  stale STALE222  no global update  "
        "diverged  4.2s"
    )


def _record(name: str, level: int, msg: str, *args: Any, exc: BaseException | None = None) -> logging.LogRecord:
    exc_info = (type(exc), exc, exc.__traceback__) if exc is not None else None
    return logging.LogRecord(name, level, __file__, 1, msg, args, exc_info)


def _raised(exc: BaseException) -> BaseException:
    try:
        raise exc
    except BaseException as caught:
        return caught


@pytest.fixture
def libp2p_at(request: pytest.FixtureRequest) -> Iterator[None]:
    """The network stack's loggers at the level given (indirect parametrisation), restored after."""
    loggers = [logging.getLogger(name) for name in ("libp2p", "dgrpo")]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(request.param)
    yield
    for lg, level in zip(loggers, levels, strict=True):
        lg.setLevel(level)


@pytest.mark.parametrize("libp2p_at", [logging.WARNING], indirect=True)
@pytest.mark.usefixtures("libp2p_at")
def test_a_peer_that_hung_up_is_a_debug_line_without_its_traceback() -> None:
    flt = PeerHangupFilter()
    mux = _record(
        "libp2p.network.swarm", logging.ERROR, "fail to upgrade mux for peer %s", "12D3KooWx",
        exc=_raised(ConnectionResetError(104, "Connection reset by peer")),
    )  # fmt: skip
    assert flt.filter(mux) is False  # libp2p logs WARNING and up: a debug line is not written
    assert (mux.levelno, mux.levelname, mux.exc_info) == (logging.DEBUG, "DEBUG", None)
    dial = _record("libp2p.transport.tcp.tcp", logging.ERROR, "Failed to open TCP stream: %s",
                   OSError("all attempts to connect to 127.0.0.1:41411 failed"))  # fmt: skip
    assert flt.filter(dial) is False and dial.levelno == logging.DEBUG
    embedded = _record(
        "libp2p.identity.identify.identify", logging.ERROR,
        "Error sending identify response to %s: %s (type: %s)\n%s", "x", "", StreamReset, "Traceback ...",
    )  # fmt: skip
    assert flt.filter(embedded) is False  # py-libp2p formatted the traceback into the message: the type says it
    # dgrpo's own warning about a stream whose peer reset it: a hang-up, whatever the logger
    served = _record("dgrpo.net.streams", logging.WARNING, "serving %s to %s failed", "/p", "x",
                     exc=_raised(StreamError("stream from x ended after 0 of 4 bytes")))  # fmt: skip
    assert flt.filter(served) is False and served.exc_info is None


@pytest.mark.parametrize("libp2p_at", [logging.WARNING], indirect=True)
@pytest.mark.usefixtures("libp2p_at")
def test_meaningful_warnings_and_real_errors_stay() -> None:
    flt = PeerHangupFilter()
    denied = _record("libp2p.network.swarm", logging.WARNING,
                     "[ADDCONN_DENY] Connection to %s denied by connection limits: %s", "x", "max 10")  # fmt: skip
    assert flt.filter(denied) is True and denied.levelno == logging.WARNING
    bug = _raised(KeyError("peer"))
    served = _record("dgrpo.net.streams", logging.WARNING, "serving %s to %s failed", "/p", "x", exc=bug)
    assert flt.filter(served) is True and served.levelno == logging.WARNING and served.exc_info is not None
    mine = _record("dgrpo.daemon", logging.WARNING, "round %d: connection reset by the aggregator", 3)
    assert flt.filter(mine) is True and mine.levelno == logging.WARNING  # words alone demote only the stack's


@pytest.mark.parametrize("libp2p_at", [logging.DEBUG], indirect=True)
@pytest.mark.usefixtures("libp2p_at")
def test_with_debug_logging_the_demoted_lines_show_at_debug() -> None:
    mux = _record("libp2p.network.swarm", logging.ERROR, "fail to upgrade mux for peer %s", "x")
    assert PeerHangupFilter().filter(mux) is True and mux.levelno == logging.DEBUG


def test_a_hangup_is_the_exception_or_its_explicit_cause_not_what_handling_it_raised() -> None:
    try:
        raise StreamError("writing to x failed") from StreamReset()
    except StreamError as wrapped:
        assert is_hangup(wrapped)
    try:
        raise RuntimeError("wrapped") from BrokenPipeError()
    except RuntimeError as caused:
        assert is_hangup(caused)
    try:
        try:
            raise StreamReset()
        except StreamReset:
            _ = {"present": 1}["missing"]  # a bug while handling a hang-up
    except KeyError as bug:
        assert bug.__context__ is not None and not is_hangup(bug)
    assert is_hangup(ExceptionGroup("all gone", [EOFError(), ConnectionResetError()]))
    assert not is_hangup(ExceptionGroup("one bug", [EOFError(), ValueError()]))


def test_human_lines_are_short_and_coloured_only_when_asked() -> None:
    info = _record("dgrpo.daemon", logging.INFO, "round %3d  peers 1", 3)
    assert re.fullmatch(r"\d\d:\d\d:\d\d  round   3  peers 1", HumanFormatter(colour=True).format(info))
    warn = _record("dgrpo.net.gossip", logging.WARNING, "bootstrap dial to %s failed", "x")
    plain = HumanFormatter(colour=False).format(warn)
    assert re.fullmatch(r"\d\d:\d\d:\d\d WARNING dgrpo.net.gossip: bootstrap dial to x failed", plain)
    assert HumanFormatter(colour=True).format(warn) == f"\x1b[33m{plain}\x1b[0m"


def test_a_json_line_is_one_object_with_the_record_whole() -> None:
    record = round_record()
    line = _record("dgrpo.daemon", logging.INFO, "%s", round_text(record))
    line.__dict__.update(record_extra(record))
    out = json.loads(JsonFormatter().format(line))
    assert out["record"] == record and out["message"] == round_text(record) and out["level"] == "INFO"
    failed = _record("dgrpo.daemon", logging.ERROR, "node %s failed", "x", exc=_raised(ValueError("bad\nworse")))
    text = JsonFormatter().format(failed)
    assert "\n" not in text and "ValueError: bad" in json.loads(text)["exception"]


@pytest.fixture
def daemon_logging_to() -> Iterator[io.StringIO]:
    """Configure a daemon's logging (as `node run` does) into a buffer, and put back what pytest had after."""
    root = logging.getLogger()
    names = ["dgrpo", *THIRD_PARTY]
    saved = (list(root.handlers), root.level, [logging.getLogger(n).level for n in names], log_setup.chosen())
    propagate = logging.getLogger("libp2p").propagate
    for handler in saved[0]:
        root.removeHandler(handler)
    buf = io.StringIO()
    yield buf
    for handler in list(root.handlers):
        root.removeHandler(handler)
    for handler in saved[0]:
        root.addHandler(handler)
    root.setLevel(saved[1])
    for name, level in zip(names, saved[2], strict=True):
        logging.getLogger(name).setLevel(level)
    logging.getLogger("libp2p").propagate = propagate
    logging.captureWarnings(False)
    choose(saved[3].format, saved[3].verbose, saved[3].debug)


def test_json_daemon_logging_writes_only_json_lines_and_keeps_rounds_jsonl(
    daemon_logging_to: io.StringIO, tmp_path: Path
) -> None:
    choose(LogFormat.json)
    configure(daemon=True, stream=daemon_logging_to)
    logging.getLogger("libp2p.network.swarm").error("fail to upgrade mux for peer %s", "12D3KooWx")  # dropped
    logging.getLogger("libp2p.network.swarm").warning("[ADDCONN_DENY] Connection to %s denied", "12D3KooWy")
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.warn("a library's warning", UserWarning, stacklevel=1)
    peers = ["12D3KooWpeerAAAAAAAAself", "12D3KooWpeerBBBBBBBBpeer", "12D3KooWpeerCCCCCCCCpeer"]
    outcome = RoundOutcome(
        peers[0], 12, cast(Any, None),
        Admission(messages=40, completions_received=40, admitted=(), rejected={"stale_round": 1}),
        DefenseOutcome(("logit",), (), {"logit:outside_top_k": 2}, {}, {}, {}),
        Scoring(tuple(ScoredCompletion(p, cast(Any, None), "", 0.5) for p in peers for _ in range(12)), 0.01),
        None, 1.0, round_seconds=3.14, expected=tuple(peers[1:]),
    )  # fmt: skip
    RoundLog(tmp_path / "rounds.jsonl").on_round(12, [outcome])
    lines = [json.loads(line) for line in daemon_logging_to.getvalue().splitlines()]
    # (A library's warning comes through as "py.warnings" where no earlier test in the process took the
    # warnings module's hook; that part depends on test order, so it is not asserted here.)
    assert [(x["level"], x["logger"]) for x in lines if x["logger"] != "py.warnings"] == [
        ("WARNING", "libp2p.network.swarm"), ("INFO", "dgrpo.daemon"),
    ]  # fmt: skip
    [kept] = [json.loads(line) for line in (tmp_path / "rounds.jsonl").read_text().splitlines()]
    assert lines[-1]["record"] == kept  # the log line carries the round's record whole
    assert lines[-1]["message"] == (
        "round  12  peers 2  accepted 36  rejected 3 (admission: stale_round 1; defense: logit:outside_top_k 2)  "
        "reward 0.500  3.1s"
    )
    # rounds.jsonl as before: round_line's keys, the authors and the completions by author
    assert sorted(kept) == sorted([
        "event", "time", "peer", "round", "seconds", "reward_seconds", "expected_peers", "departed", "completions",
        "rejected", "defense_rejected", "mean_reward", "loss", "cpu", "drawn", "staleness", "filled", "authors",
        "completions_by_author",
    ])  # fmt: skip
    assert kept["peer"] == peers[0] and kept["authors"] == peers and kept["completions_by_author"][peers[1]] == 12


def test_human_daemon_logging_writes_the_round_line(daemon_logging_to: io.StringIO) -> None:
    choose(LogFormat.human)
    configure(daemon=True, stream=daemon_logging_to)
    logging.getLogger("libp2p.transport.tcp.tcp").error("Failed to open TCP stream: %s", "all attempts failed")
    record = round_record()
    logging.getLogger("dgrpo.daemon").info("%s", round_text(record), extra=record_extra(record))
    [line] = daemon_logging_to.getvalue().splitlines()
    assert re.fullmatch(r"\d\d:\d\d:\d\d  round  12  peers 3 .* 3\.1s", line)


def _boom_invoke(args: list[str], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> str:
    """Run ``dgrpo ARGS boom`` (a command that raises) as the installed entry point does, and return stderr."""
    for name in ("TYPER_STANDARD_TRACEBACK", "_TYPER_STANDARD_TRACEBACK", "DGRPO_DEBUG"):
        monkeypatch.delenv(name, raising=False)

    def boom() -> None:
        # what a settings or key object would be; built at run time, as the traceback shows the source lines
        secret_marker = "-".join(["hunter2", "in", "a", "local"])
        raise RuntimeError(f"an unexpected bug ({len(secret_marker)})")

    app.command("boom")(boom)
    try:
        with pytest.raises(RuntimeError) as raised:
            app([*args, "boom"], prog_name="dgrpo")
        capsys.readouterr()
        typer.main.except_hook(raised.type, raised.value, raised.tb)  # what Python does with it at exit
        return capsys.readouterr().err
    finally:
        app.registered_commands.pop()
        app.pretty_exceptions_show_locals, app.pretty_exceptions_short = False, True
        choose(LogFormat.human)


def test_an_unexpected_error_shows_its_traceback_but_not_its_locals(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    err = _boom_invoke([], capsys, monkeypatch)
    assert "RuntimeError" in err and "an unexpected bug (18)" in err and "boom" in err  # still a traceback
    assert "hunter2-in-a-local" not in err
    full = _boom_invoke(["--debug"], capsys, monkeypatch)
    assert "hunter2-in-a-local" in full  # --debug: the locals too (so the check above can fail)
    assert sys.excepthook is typer.main.except_hook


@pytest.mark.slow  # real processes
@pytest.mark.timeout(300)
def test_a_testnet_logging_json_writes_one_object_per_line(tmp_path: Path) -> None:
    from dgrpo.daemon.testnet import rounds_log, start_testnet, stop_nodes, wait_rounds

    choose(LogFormat.json)  # as `dgrpo --log-format json testnet up` does: its nodes get the option
    try:
        nodes = start_testnet(2, tmp_path, 2, extra=["rounds.deadline_seconds=20", "rounds.peer_timeout_seconds=6"])
    finally:
        choose(LogFormat.human)
    try:
        assert wait_rounds(nodes, 2, lambda statuses: None, timeout=240)
    finally:
        assert stop_nodes(nodes)
    for nd in nodes:
        lines = [json.loads(line) for line in (nd.state_dir / "node.log").read_text().splitlines()]
        assert {"time", "level", "logger", "message"} <= set(lines[0])
        records = [x["record"] for x in lines if x.get("record", {}).get("event") == "round"]
        assert records == rounds_log(nd)[:2]  # the whole record, as rounds.jsonl keeps it
        assert next(x["message"] for x in lines if "record" in x).startswith("round   1  peers 1  accepted ")
