"""The worker process of :mod:`dgrpo.tasks.gym`: reasoning-gym's own ``score_answer`` on peers' answers.

    python -m dgrpo.tasks.gym_worker MEMORY_BYTES

Requests are JSON lines ``{"d": dataset spec, "i": index, "a": answer}``; the spec (``name``, ``config``,
``seed``, ``size``) rebuilds the same procedural dataset the task draws from, and item ``i`` of it is the
entry to score against: the worker never takes an entry (a gold answer) from the request's sender. The answer
is a float in [0, 1] on one line, or ``m`` when the worker ran out of memory. Scorers that raise score 0
(hostile text is not an error). The parent bounds each answer's wall time and kills the worker on overrun.
"""

from __future__ import annotations

import json
import math
import sys
from typing import Any

from dgrpo.tasks.bounded_worker import serve, worker_prelude

MAX_DATASETS = 16  # specs held at once (a node has one task; a test process a few)


def dataset(spec: dict[str, Any], cache: dict[str, Any]) -> Any:
    key = json.dumps(spec, sort_keys=True)
    if key not in cache:
        import reasoning_gym

        if len(cache) >= MAX_DATASETS:
            cache.pop(next(iter(cache)))
        config = dict(spec.get("config") or {})
        cache[key] = reasoning_gym.create_dataset(
            str(spec["name"]), seed=int(spec["seed"]), size=int(spec["size"]), **config
        )
    return cache[key]


def score(ds: Any, index: int, answer: str) -> float:
    value = float(ds.score_answer(answer=answer, entry=ds[index]))
    return min(max(value, 0.0), 1.0) if math.isfinite(value) else 0.0


def main(argv: list[str]) -> int:
    worker_prelude(int(argv[1]))
    import reasoning_gym  # noqa: F401  (imported before "ready": a missing package fails the start)

    cache: dict[str, Any] = {}

    def answer(request: dict[str, Any]) -> str:
        return repr(score(dataset(request["d"], cache), int(request["i"]), str(request["a"])))

    return serve(answer, refused="0.0")  # whatever a scorer raises on hostile text: no reward


if __name__ == "__main__":
    sys.exit(main(sys.argv))
