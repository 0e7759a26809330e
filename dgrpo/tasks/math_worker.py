"""The worker process of :mod:`dgrpo.tasks.math_verifier`: math-verify on peers' answers, one at a time.

    python -m dgrpo.tasks.math_worker MEMORY_BYTES

It caps its own address space first (``RLIMIT_AS``), dies with its parent, imports math-verify (sympy), says
``ready``, then answers JSON lines ``{"a": answer, "g": gold}`` with ``1`` (equal), ``0`` (not equal or
unparseable) or ``m`` (out of memory) on stdout. Its parent bounds each answer's time and kills it on overrun.
math-verify's own signal-based timeouts are off: the parent's bound is the one that holds.
"""

from __future__ import annotations

import sys
from typing import Any

from dgrpo.tasks.bounded_worker import serve, worker_prelude


def main(argv: list[str]) -> int:
    worker_prelude(int(argv[1]))
    from math_verify import parse, verify

    # Warm up: math-verify loads its LaTeX grammar on first use; that must not count against an answer.
    verify(parse("\\boxed{1}", parsing_timeout=None), parse("1", parsing_timeout=None), timeout_seconds=None)
    gold_cache: dict[str, Any] = {}

    def answer(request: dict[str, Any]) -> str:
        text, gold = str(request["a"]), str(request["g"])
        if gold not in gold_cache:
            gold_cache[gold] = parse(gold, parsing_timeout=None)
        equal = verify(gold_cache[gold], parse(text, parsing_timeout=None), timeout_seconds=None)
        return "1" if equal else "0"

    return serve(answer, refused="0")  # unparseable: not equal


if __name__ == "__main__":
    sys.exit(main(sys.argv))
