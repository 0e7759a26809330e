"""A worker process that judges peers' answers one at a time, each bounded in wall time and the whole worker
in memory.

Scorers that parse text (math-verify and sympy for GSM8K, some of reasoning-gym's ``score_answer``) cannot be
bounded inside the node's process: their timeouts use signals (main thread only) and sympy holds the GIL, so
one hostile answer such as ``9^{9^{9}}`` could stall a node. The work runs in ``python -m <module> <memory>``
instead, which answers JSON-line requests with one line each; an answer that takes longer than its bound gets
the worker killed (and restarted on the next call). It is a bound on time and memory, not an isolation
boundary: the scorers parse but never run the text.

A worker module calls :func:`worker_prelude` first, imports its scorer, then :func:`serve` answers ``stdin``
line by line.
"""

from __future__ import annotations

import atexit
import ctypes
import json
import os
import resource
import select
import signal
import subprocess
import sys
from collections.abc import Callable
from typing import Any

from dgrpo.errors import DgrpoError

READY_SECONDS = 120.0  # importing sympy takes about a second; a loaded machine may take longer
PR_SET_PDEATHSIG = 1


class WorkerError(DgrpoError):
    """A worker cannot start (its scorer's package missing or broken)."""


class BoundedWorker:
    """``ask(request, timeout)`` -> the worker's one-line answer, or None with a reason (``timeout``,
    ``worker_died``). Not thread-safe: callers hold their own lock."""

    def __init__(self, module: str, memory_bytes: int, what: str, args: tuple[str, ...] = ()) -> None:
        self.module = module
        self.memory_bytes = memory_bytes
        self.what = what
        self.args = args
        self.restarts = 0
        self._proc: subprocess.Popen[str] | None = None
        self._started_once = False
        atexit.register(self.close)

    def start(self) -> None:
        self._worker()

    @property
    def pid(self) -> int | None:
        """The running worker's process id (None between a kill and the next call)."""
        return self._proc.pid if self._proc is not None and self._proc.poll() is None else None

    def close(self) -> None:
        proc, self._proc = self._proc, None
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait()

    def ask(self, request: dict[str, Any], timeout: float) -> tuple[str | None, str]:
        proc = self._worker()
        assert proc.stdin is not None
        try:
            proc.stdin.write(json.dumps(request) + "\n")
            proc.stdin.flush()
        except OSError:
            self.close()
            return None, "worker_died"
        line = _readline(proc, timeout)
        if line is None:  # overran its bound (or died on the way): killed, restarted on the next call
            self.close()
            return None, "timeout"
        return line, ""

    def _worker(self) -> subprocess.Popen[str]:
        if self._proc is not None and self._proc.poll() is None:
            return self._proc
        if self._started_once:
            self.restarts += 1
        self._started_once = True
        proc = subprocess.Popen(
            [sys.executable, "-m", self.module, str(self.memory_bytes), *self.args],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            env={**os.environ, "PYTHONHASHSEED": "0"},
        )
        if _readline(proc, READY_SECONDS) != "ready":
            proc.kill()
            proc.wait()
            raise WorkerError(f"the {self.what} worker did not start (is its package installed?)")
        self._proc = proc
        return proc


def _readline(proc: subprocess.Popen[str], timeout: float) -> str | None:
    """One line from the worker within ``timeout`` seconds, or None (overrun, or the worker died)."""
    assert proc.stdout is not None
    poller = select.poll()
    poller.register(proc.stdout.fileno(), select.POLLIN | select.POLLHUP)
    if not poller.poll(max(1, int(timeout * 1000))):
        return None
    line = proc.stdout.readline()
    return line.strip() if line else None


def worker_prelude(memory_bytes: int) -> None:
    """In the worker: cap its address space (``RLIMIT_AS``) and die with its parent."""
    resource.setrlimit(resource.RLIMIT_AS, (memory_bytes, memory_bytes))
    ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def serve(answer: Callable[[dict[str, Any]], str], refused: str) -> int:
    """In the worker: say ``ready``, then one line per JSON request: ``answer(request)``, ``m`` when the
    worker ran out of memory, ``refused`` when anything else went wrong (hostile text is no error)."""
    out = sys.stdout
    out.write("ready\n")
    out.flush()
    for line in sys.stdin:
        try:
            verdict = answer(json.loads(line))
        except MemoryError:
            verdict = "m"
        except Exception:  # unparseable, or whatever a scorer raises on hostile text
            verdict = refused
        out.write(verdict + "\n")
        out.flush()
    return 0
