"""math-verify on peers' text, bounded in time and memory: a worker process per verifier.

The GSM8K reward hands a peer's ``<answer>`` to math-verify, which parses it with sympy. In the node's own
process that work could not be bounded: math-verify's timeouts use signals (main thread only) and sympy holds
the GIL, so one answer such as ``9^{9^{9}}`` could stall a node indefinitely. Here the work runs in
:mod:`dgrpo.tasks.math_worker`: each answer gets ``timeout_seconds`` of wall time, after which the worker is
killed (and restarted on the next call) and the answer scores 0; the worker's address space is capped at
``memory_bytes``. Verdicts are cached, so a peer repeating a slow answer pays the timeout once, not us each time.

It is a bound on time and memory, not an isolation boundary: math-verify parses but never runs the text, and
:func:`dgrpo.tasks.gsm8k.safe_for_math_verify` admits only plain arithmetic before anything gets here.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field

from dgrpo.errors import DgrpoError
from dgrpo.tasks.bounded_worker import BoundedWorker, WorkerError

log = logging.getLogger(__name__)

CACHE_SIZE = 65536


class MathVerifierError(DgrpoError):
    """The worker cannot start (math-verify missing or broken)."""


@dataclass
class VerifierStats:
    answers: int = 0
    cached: int = 0
    timeouts: int = 0
    out_of_memory: int = 0
    restarts: int = 0
    seconds: float = 0.0
    by_reason: dict[str, int] = field(default_factory=dict)


class BoundedVerifier:
    """``verify_many([(answer, gold), ...])`` -> verdicts, each answer bounded in time and memory."""

    def __init__(self, timeout_seconds: float = 2.0, memory_bytes: int = 2 << 30) -> None:
        self.timeout_seconds = timeout_seconds
        self.memory_bytes = memory_bytes
        self.stats = VerifierStats()
        self._lock = threading.Lock()
        self._worker = BoundedWorker("dgrpo.tasks.math_worker", memory_bytes, "math-verify")
        self._cache: OrderedDict[tuple[str, str], bool] = OrderedDict()

    def verify(self, answer: str, gold: str) -> bool:
        return self.verify_many([(answer, gold)])[0]

    def verify_many(self, pairs: Sequence[tuple[str, str]]) -> list[bool]:
        with self._lock:
            return [self._one(answer, gold) for answer, gold in pairs]

    def start(self) -> None:
        """Start the worker now (it imports sympy: about a second), so that a missing math-verify fails early."""
        with self._lock:
            try:
                self._worker.start()
            except WorkerError as exc:
                raise MathVerifierError(f"{exc}: math-verify") from None

    def close(self) -> None:
        self._worker.close()

    # ------------------------------------------------------------------ internals (under the lock)
    def _one(self, answer: str, gold: str) -> bool:
        key = (answer, gold)
        self.stats.answers += 1
        if key in self._cache:
            self._cache.move_to_end(key)
            self.stats.cached += 1
            return self._cache[key]
        started = time.monotonic()
        verdict, reason = self._ask(answer, gold)
        self.stats.seconds += time.monotonic() - started
        if reason:
            self.stats.by_reason[reason] = self.stats.by_reason.get(reason, 0) + 1
        self._cache[key] = verdict
        if len(self._cache) > CACHE_SIZE:
            self._cache.popitem(last=False)
        return verdict

    def _ask(self, answer: str, gold: str) -> tuple[bool, str]:
        try:
            line, reason = self._worker.ask({"a": answer, "g": gold}, self.timeout_seconds)
        except WorkerError as exc:
            raise MathVerifierError(f"{exc}: math-verify") from None
        self.stats.restarts = self._worker.restarts
        if reason == "timeout":
            self.stats.timeouts += 1
            limit = self.timeout_seconds
            log.warning("math-verify: an answer took over %.1f s; worker restarted (answer %r)", limit, answer[:80])
            return False, "timeout"
        if reason:
            return False, reason
        if line == "m":
            self.stats.out_of_memory += 1
            self._worker.close()  # its heap may be fragmented past use: start afresh
            return False, "memory"
        if line not in ("0", "1"):
            self._worker.close()
            return False, "worker_died"
        return line == "1", ""


_shared: BoundedVerifier | None = None
_shared_lock = threading.Lock()


def shared_verifier() -> BoundedVerifier:
    """The process's verifier (one worker shared by every GSM8K task of the process)."""
    global _shared
    with _shared_lock:
        if _shared is None:
            _shared = BoundedVerifier()
        return _shared
