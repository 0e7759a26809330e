"""Stopping a long run cleanly: Ctrl-C or SIGTERM asks it to stop after the round in progress.

The round in progress finishes (a round is the unit everything is saved in), the run writes what it has and
says how to continue. A second Ctrl-C stops at once (:class:`KeyboardInterrupt`), for a user who cannot wait
for the round; the last finished round is still saved.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType


class StopRequest:
    """Set by a signal (or by a caller, e.g. a test); read by the run between rounds."""

    def __init__(self) -> None:
        self._event = threading.Event()
        self.reason = ""

    def set(self, reason: str = "asked") -> None:
        self.reason = self.reason or reason
        self._event.set()

    @property
    def requested(self) -> bool:
        return self._event.is_set()


@contextmanager
def stop_on_signals(stop: StopRequest, announce: Callable[[str], None] | None = None) -> Iterator[StopRequest]:
    """Within the block, SIGINT and SIGTERM set ``stop``; a second SIGINT raises KeyboardInterrupt. Outside
    the main thread (where Python cannot install handlers) nothing is installed."""
    if threading.current_thread() is not threading.main_thread():
        yield stop
        return
    previous = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}

    def handle(signum: int, frame: FrameType | None) -> None:
        name = signal.Signals(signum).name
        if stop.requested and signum == signal.SIGINT:
            raise KeyboardInterrupt
        stop.set(name)
        if announce is not None:
            announce(f"{name}: stopping after the round in progress (Ctrl-C again to stop at once)")

    for s in previous:
        signal.signal(s, handle)
    try:
        yield stop
    finally:
        for s, h in previous.items():
            signal.signal(s, h)
