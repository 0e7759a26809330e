"""What isolation costs per program, and what batching saves, measured side by side in one run.

    .venv/bin/python benchmarks/sandbox.py [--programs 64] [--repeats 3] [--out runs/bench-sandbox]

Rows (the same ``arith-code`` programs each time, half honest, half the CODE attack's ``calc`` rewrites):

- ``bwrap, one per sandbox``: a sandbox started for every program (what an unbatched reward would pay);
- ``bwrap, batched``: one sandbox per worker, programs one after another inside (what rewards use);
- ``direct, batched``: the weak mode's runner on the host, for the cost of bwrap itself.

Prints milliseconds per program (median of the repeats) and the ratios; writes ``sandbox.json``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path

from dgrpo.adversary.code_calc import rewrite_program
from dgrpo.sandbox import Sandbox, SandboxLimits, site_paths
from dgrpo.sandbox.batch import run_batch
from dgrpo.sandbox.launch import DirectLauncher
from dgrpo.tasks.arith_code import ArithCodeTask, reference_program


def programs(n: int) -> list[str]:
    task = ArithCodeTask()
    prompts = task.sample_prompts(n, "bench-sandbox")
    out = []
    for i, prompt in enumerate(prompts):
        honest = reference_program(prompt)
        out.append(honest if i % 2 == 0 else rewrite_program(honest, "calc", {"+", "*"}) or honest)
    return out


def timed(run: Callable[[], list[bool]], count: int, repeats: int) -> tuple[float, bool]:
    """Median milliseconds per program over ``repeats`` runs, and whether every run scored every program."""
    per, ok = [], True
    for _ in range(repeats):
        started = time.perf_counter()
        results = run()
        per.append(1000 * (time.perf_counter() - started) / count)
        ok = ok and all(results) and len(results) == count
    return statistics.median(per), ok


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--programs", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", type=Path, default=Path("runs/bench-sandbox"))
    args = ap.parse_args()
    sources = programs(args.programs)
    sandbox = Sandbox(extra_paths=site_paths(True))
    limits, site = SandboxLimits(), site_paths(True)
    direct = DirectLauncher()
    rows = {
        "bwrap, one per sandbox": lambda: [sandbox.run(s).ok for s in sources],
        "bwrap, batched": lambda: [r.ok for r in sandbox.run_many(sources)],
        "direct, batched": lambda: [
            r.ok for r in run_batch(direct, limits, [Path(p) for p in site], [(s, "") for s in sources])[0]
        ],
    }
    results = {name: timed(run, len(sources), args.repeats) for name, run in rows.items()}
    print(f"{'mode':28s} {'ms/program':>10s}  all scored")
    for name, (ms, ok) in results.items():
        print(f"{name:28s} {ms:10.2f}  {ok}")
    one, batched, weak = (results[k][0] for k in rows)
    ratios = {"one_per_sandbox_over_batched": one / batched, "bwrap_over_direct_batched": batched / weak}
    for key, value in ratios.items():
        print(f"{key}: {value:.2f}")
    args.out.mkdir(parents=True, exist_ok=True)
    report = {
        "programs": len(sources),
        "repeats": args.repeats,
        "ms_per_program": {k: round(v[0], 3) for k, v in results.items()},
        "all_scored": {k: v[1] for k, v in results.items()},
        "ratios": {k: round(v, 3) for k, v in ratios.items()},
        "capabilities": sandbox.capabilities(),
    }
    (args.out / "sandbox.json").write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
