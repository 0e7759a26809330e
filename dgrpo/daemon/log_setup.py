"""How ``dgrpo`` logs: short human lines by default (``HH:MM:SS`` and the message; warnings and errors in colour
on a terminal), or one JSON object per line for log shippers (``--log-format json``); and py-libp2p's noise about
peers that simply hung up (a dial refused, a connection reset, a mux upgrade lost to a simultaneous dial) at
DEBUG, without its stack traces, while its meaningful warnings stay visible.

The command line's callback records the choice (:func:`choose`); :func:`configure` applies it, for any command
at WARNING and for the daemons at INFO (:func:`configure` with ``daemon=True``).
"""

from __future__ import annotations

import json
import logging
import os
import re
import sys
import time
import weakref
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any, TextIO

RECORD = "dgrpo_record"  # the LogRecord attribute a structured record (a round's) travels in, see record_extra
THIRD_PARTY = ("libp2p", "multiaddr", "async_service", "trio", "trio-websocket")  # the network stack's loggers


class LogFormat(StrEnum):
    human = "human"
    json = "json"


@dataclass(frozen=True)
class LogChoice:
    format: LogFormat = LogFormat.human
    verbose: bool = False  # -v: dgrpo's debug lines
    debug: bool = False  # --debug: every logger's debug lines (py-libp2p's too), full tracebacks with locals


_choice = LogChoice()
_ours: weakref.WeakSet[logging.Handler] = weakref.WeakSet()  # the handlers configure installed


def choose(fmt: LogFormat, verbose: bool = False, debug: bool = False) -> None:
    """What the command line asked for (``--log-format``, ``-v``, ``--debug``); :func:`configure` applies it."""
    global _choice
    _choice = LogChoice(LogFormat(fmt), verbose, debug)


def chosen() -> LogChoice:
    return _choice


def cli_options() -> list[str]:
    """The global options that give a child ``dgrpo`` process (a testnet's node) this process's logging."""
    return [
        *(["--log-format", _choice.format.value] if _choice.format != LogFormat.human else []),
        *(["--debug"] if _choice.debug else ["-v"] if _choice.verbose else []),
    ]


def record_extra(record: Mapping[str, Any]) -> dict[str, Any]:
    """``extra=`` for a log call whose message is a human line about ``record``: the JSON format writes the record
    whole (``"record": {...}``), the human one only the message."""
    return {RECORD: dict(record)}


def configure(daemon: bool = False, stream: TextIO | None = None) -> None:
    """Log the chosen way to ``stream`` (default: whatever ``sys.stderr`` is when a line is written).

    A daemon logs dgrpo's INFO lines and replaces any handler there was (as ``logging.basicConfig(force=True)``);
    any other command logs warnings, and leaves a root logger that already has handlers (pytest's, an embedding
    program's) alone. Verbose: dgrpo's loggers at DEBUG (and, as ever, every logger for a command that is not a
    daemon); debug: every logger at DEBUG, py-libp2p's included."""
    choice = chosen()
    root = logging.getLogger()
    if not daemon and any(h not in _ours for h in root.handlers):
        return
    for old in list(root.handlers):
        root.removeHandler(old)
        old.close()
    handler: logging.StreamHandler[TextIO] = logging.StreamHandler(stream) if stream is not None else _Stderr()
    _ours.add(handler)
    # colour: where sys.stderr is a terminal when a line is written; a stream given is asked now
    handler.setFormatter(formatter(choice.format, None if stream is None else stream.isatty()))
    handler.addFilter(PeerHangupFilter())
    root.addHandler(handler)
    base = logging.INFO if daemon else logging.WARNING
    root.setLevel(logging.DEBUG if choice.debug or (choice.verbose and not daemon) else base)
    logging.getLogger("dgrpo").setLevel(logging.DEBUG if choice.debug or choice.verbose else base)
    logging.captureWarnings(True)  # Python's warnings as log lines too (one JSON object each in that format)
    if daemon:
        _adopt_libp2p()
        for name in THIRD_PARTY:
            logging.getLogger(name).setLevel(logging.DEBUG if choice.debug else logging.WARNING)


def formatter(fmt: LogFormat, colour: bool | None = False) -> logging.Formatter:
    """The chosen format's formatter; ``colour`` (human lines): None for "where sys.stderr is a terminal"."""
    return JsonFormatter() if fmt == LogFormat.json else HumanFormatter(colour)


def _adopt_libp2p() -> None:
    """Importing py-libp2p sets its ``libp2p`` logger to propagate nowhere and to have no handler, so its warnings
    went to Python's last-resort handler: bare lines, unfiltered, interleaved with ours. Import it now (a daemon is
    about to), then let its records reach our handler and filter. ``LIBP2P_DEBUG`` (py-libp2p's own switch) keeps
    py-libp2p's own handlers."""
    if os.environ.get("LIBP2P_DEBUG"):
        return
    import libp2p  # noqa: F401  (its import configures its logger: that must happen before ours)

    logging.getLogger("libp2p").propagate = True


class _Stderr(logging.StreamHandler[TextIO]):
    """Writes to ``sys.stderr`` as it is when a line is written (test runners swap it), as Python's last-resort
    handler does."""

    def __init__(self) -> None:
        logging.Handler.__init__(self)

    @property
    def stream(self) -> TextIO:
        return sys.stderr

    @stream.setter
    def stream(self, _: TextIO) -> None:  # StreamHandler.setStream assigns it: ours is always sys.stderr
        pass


_COLOURS = {logging.WARNING: "\x1b[33m", logging.ERROR: "\x1b[31m", logging.CRITICAL: "\x1b[1;31m"}
_RESET = "\x1b[0m"


class HumanFormatter(logging.Formatter):
    """``14:05:12  round   3  peers 1  ...`` for INFO; ``14:05:12 WARNING dgrpo.net: ...`` otherwise, the level and
    message in colour where the output is a terminal (``NO_COLOR`` turns it off; a file or pipe never gets it)."""

    def __init__(self, colour: bool | None = None) -> None:
        super().__init__()
        self.colour = colour  # None: where sys.stderr is a terminal (asked at every line: test runners swap it)

    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:
        return time.strftime("%H:%M:%S", time.localtime(record.created))

    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record)  # the message, and any traceback below it
        if record.levelno == logging.INFO:
            line = f"{self.formatTime(record)}  {text}"
        else:
            line = f"{self.formatTime(record)} {record.levelname} {record.name}: {text}"
        colour = _COLOURS.get(record.levelno) if self._colour() else None
        return f"{colour}{line}{_RESET}" if colour else line

    def _colour(self) -> bool:
        if os.environ.get("NO_COLOR"):  # https://no-color.org
            return False
        return sys.stderr.isatty() if self.colour is None else self.colour


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ``time`` (ISO 8601, UTC), ``level``, ``logger``, ``message``; ``record`` for a
    structured record (a round's, whole); ``exception`` for a traceback (a multi-line string inside the one line)."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        structured = getattr(record, RECORD, None)
        if structured is not None:
            out["record"] = structured
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        if record.stack_info:
            out["stack"] = self.formatStack(record.stack_info)
        return json.dumps(out, default=str)


# What py-libp2p logs at WARNING or ERROR when a peer went away: known messages (no exception named in them) ...
_BENIGN = re.compile(
    r"^(?:fail(?:ed)? to upgrade (?:mux|security) for peer"  # a simultaneous dial lost, or a peer gone mid-upgrade
    r"|Failed to open TCP stream"  # a dial refused: the peer is gone (dgrpo logs what that means for a round)
    r"|Yamux connection closed unexpectedly"
    r"|Incomplete read"  # a frame cut off by the connection closing
    r"|Error closing (?:connection|secured_conn)"  # closing what the other side already closed
    r"|Received (?:message for non-existent stream|data from remote after stream was closed))",
    re.IGNORECASE,
)
# ... and any message naming the exception of a hang-up (several embed a formatted traceback in the message).
_HANGUP_TEXT = re.compile(
    r"connection reset|broken pipe|connection refused|all attempts to connect|connection closed|\bEOF\b"
    r"|(?:Muxed)?Stream(?:Reset|EOF|Closed)\b|MuxedConnUnavailable|RawConnError|IncompleteReadError"
    r"|ConnectionClosedError|BrokenResourceError|ClosedResourceError|ConnectionResetError|BrokenPipeError"
    r"|ConnectionRefusedError|ConnectionAbortedError",
    re.IGNORECASE,
)
# Exceptions that mean "the peer hung up" (by module and name: this module imports no network code).
_HANGUP_TYPES = frozenset({
    "libp2p.network.stream.exceptions.StreamEOF",
    "libp2p.network.stream.exceptions.StreamReset",
    "libp2p.network.stream.exceptions.StreamClosed",
    "libp2p.stream_muxer.exceptions.MuxedStreamEOF",
    "libp2p.stream_muxer.exceptions.MuxedStreamReset",
    "libp2p.stream_muxer.exceptions.MuxedStreamClosed",
    "libp2p.stream_muxer.exceptions.MuxedConnUnavailable",
    "libp2p.io.exceptions.ConnectionClosedError",
    "libp2p.io.exceptions.IncompleteReadError",
    "libp2p.network.connection.exceptions.RawConnError",
    "libp2p.transport.exceptions.OpenConnectionError",
    "trio.BrokenResourceError",
    "trio.ClosedResourceError",
    "dgrpo.net.streams.StreamError",  # a stream that ended or could not be opened
})  # fmt: skip


def is_hangup(exc: BaseException | None) -> bool:
    """Whether ``exc`` says a peer hung up: it is (or explicitly wraps, ``raise ... from``) a closed, reset or
    refused connection or stream; for a group, every exception in it does. An exception merely raised while
    handling a hang-up (``__context__``) is not one: it may be a bug in the handling."""
    for _ in range(16):  # a cause chain is short; a loop in one must not hang the logger
        if exc is None:
            return False
        if isinstance(exc, BaseExceptionGroup):
            return all(is_hangup(e) for e in exc.exceptions)
        if isinstance(exc, ConnectionError | EOFError) or any(
            f"{cls.__module__}.{cls.__qualname__}" in _HANGUP_TYPES for cls in type(exc).__mro__
        ):
            return True
        exc = exc.__cause__
    return False


_DEMOTED = "dgrpo_demoted"


class PeerHangupFilter(logging.Filter):
    """Demotes to DEBUG, and strips of its traceback, a record that only says a peer hung up: one from the network
    stack's loggers (:data:`THIRD_PARTY`) with a known message or naming a hang-up, or one from any logger whose
    exception is a hang-up (:func:`is_hangup`). The record then shows only where its logger logs DEBUG. Everything
    else passes untouched: a denied connection, a failed signature, a protocol error stay warnings."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno > logging.DEBUG and self.benign(record):
            record.levelno, record.levelname = logging.DEBUG, logging.getLevelName(logging.DEBUG)
            record.exc_info, record.exc_text, record.stack_info = None, None, None
            record.__dict__[_DEMOTED] = True
        if record.__dict__.get(_DEMOTED):  # demoted here or by another handler's filter (the record is shared)
            return logging.getLogger(record.name).isEnabledFor(logging.DEBUG)
        return True

    @staticmethod
    def benign(record: logging.LogRecord) -> bool:
        if record.exc_info is not None and is_hangup(record.exc_info[1]):
            return True
        if record.name.split(".")[0] not in THIRD_PARTY:
            return False
        message = record.getMessage()
        return bool(_BENIGN.match(message) or _HANGUP_TEXT.search(message))
