"""What the signed wire format costs a simulation, measured side by side in one run.

    .venv/bin/python benchmarks/wire.py [--rounds 50] [--repeats 2]

The default simulation runs twice per repeat: as shipped (every rollout signed and encoded by its author,
decoded and validated by every receiver: `dgrpo/net/memory.py`), and with a benchmark-only network that hands
the rollout objects over directly (what simulations did before they went through the wire). Prints the wall
time of each, their ratio, and the cost per message of signing and of validating, and checks that both give
the same results (the wire changes nothing a node sees).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import trio

from dgrpo.net import memory
from dgrpo.protocol.messages import Rollout
from dgrpo.simulations import runner
from dgrpo.simulations.scenario import load_scenario
from dgrpo.simulations.summary import RunSummary


class DirectNetwork(memory.InMemoryNetwork):
    """The in-memory network without the wire: rollouts are handed over as objects (benchmark only)."""

    def join(self, name: str, identity: Any = None) -> memory.InMemoryTransport:
        transport = super().join(name, identity)

        async def publish(rollout: Rollout) -> None:
            for other, member in self._members.items():
                if other != name:
                    member._send.send_nowait(rollout)
            await trio.lowlevel.checkpoint()

        transport.publish = publish  # type: ignore[method-assign]
        return transport


def simulate(rounds: int, direct: bool) -> tuple[float, RunSummary]:
    runner.InMemoryNetwork = DirectNetwork if direct else memory.InMemoryNetwork  # type: ignore[misc]
    scenario = load_scenario(None, [f"rounds={rounds}"])
    with tempfile.TemporaryDirectory() as out:
        t0 = time.perf_counter()
        summary = runner.run_simulation(scenario, Path(out))
        return time.perf_counter() - t0, summary


def per_message(n: int = 2000) -> tuple[float, float]:
    """Microseconds to sign+encode one default-sized rollout, and to validate+decode it at a receiver."""
    network = memory.InMemoryNetwork("bench")
    sender, receiver = network.join("node-0"), network.join("node-1")
    scenario = load_scenario(None, [])
    from dgrpo.tasks import get_task

    prompt = get_task("arith").train_prompt(0)
    rollout = Rollout(
        author="node-0",
        round=1,
        part=0,
        parts=8,
        prompt_id=prompt.id,
        prompt=prompt.text,
        completions=("1+2+0=3,4+5+0=9,3+1+0=4>493",) * 2,
        indices=(0, 1),
        model_id="dgrpo:tiny-arith",
        weights="",
        sampling=scenario.sampling,
        split="horizontal",
    )
    t0 = time.perf_counter()
    messages = [sender.signer.sign_rollout(rollout) for _ in range(n)]
    sign = (time.perf_counter() - t0) / n
    t0 = time.perf_counter()
    for data in messages:
        receiver.receive(data)
    validate = (time.perf_counter() - t0) / n
    assert receiver.statistics().accepted == n
    return 1e6 * sign, 1e6 * validate


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=50)
    ap.add_argument("--repeats", type=int, default=2)
    args = ap.parse_args()
    walls: dict[bool, list[float]] = {False: [], True: []}
    summaries: dict[bool, RunSummary] = {}
    for _ in range(args.repeats):
        for direct in (False, True):  # interleaved, so that drifting machine load hits both alike
            wall, summaries[direct] = simulate(args.rounds, direct)
            walls[direct].append(wall)
    wire, plain = statistics.median(walls[False]), statistics.median(walls[True])
    sign, validate = per_message()
    same = all(getattr(summaries[False], k) == getattr(summaries[True], k) for k in ("accuracy", "final_honest_reward"))
    print(f"default simulation, {args.rounds} rounds, median of {args.repeats}:")
    print(f"  over the wire (shipped)  {wire:7.1f} s")
    print(f"  objects handed over      {plain:7.1f} s")
    print(f"  wire / direct            {wire / plain:7.3f}")
    print(f"  per message: sign+encode {sign:.0f} us, validate+decode {validate:.0f} us (each receiver)")
    print(f"  same accuracy curve and final reward: {same}")
    print(f"  messages accepted over the wire: {summaries[False].wire['messages_accepted']}")


if __name__ == "__main__":
    main()
