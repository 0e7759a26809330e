"""How sparse is a client's update by itself? (docs/results.md, "Federated mode": why top-k costs accuracy here)

    .venv/bin/python benchmarks/federated_sparsity.py [--scenario fed-grpo] [--client 2] [-s learner.optimizer=sgd ...]

Runs one client's first local round exactly as the federated runner does (the scenario's model, partition,
local steps and batch) and prints, for its update: the share of its energy (squared L2 norm) held by its top
1/32 and top 1/640 entries, and the share of entries that would not change in a round if the weights were
stored in bfloat16 (the paper's "over 96% unchanged" regime). Top-k with error feedback is lossless only
when the first shares are close to 1.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from dgrpo.federated.client import FedClient
from dgrpo.federated.params import flat_parameters
from dgrpo.federated.partition import partition
from dgrpo.learner.learner import Learner
from dgrpo.simulations.scenario import load_scenario
from dgrpo.tasks import get_task


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--scenario", default="fed-grpo")
    parser.add_argument("--client", type=int, default=2)
    parser.add_argument("-s", "--set", dest="overrides", action="append", default=[], help="scenario override")
    args = parser.parse_args()
    sc = load_scenario(Path(args.scenario), args.overrides)
    fed = sc.federated
    assert fed is not None, "a federated scenario"
    torch.set_num_threads(max(sc.torch_threads, 1))
    task = get_task(sc.task.name, **sc.task.options)
    prompts = partition(task, fed.partition, fed.clients, fed.prompts_per_client, sc.run_id)[args.client]
    learner = Learner(sc.model, sc.learner, sc.lr_rounds())
    start = flat_parameters(learner.model)
    name = f"client-{args.client}"
    delta = FedClient(name, sc.run_id, task, learner, [(name, prompts)], fed, sc.sampling).local_round(1, None).delta
    energy = delta.pow(2).sort(descending=True).values
    total = float(energy.sum())
    n = delta.numel()
    print(f"{name}, round 1, {fed.local_steps} local steps: {n} entries, update norm {float(delta.norm()):.4f}")
    for frac, label in ((1 / 32, "1/32"), (1 / 640, "1/640")):
        k = int(n * frac)
        print(f"  top {label} of the entries ({k}): {float(energy[:k].sum()) / total:.3f} of the energy")
    unchanged = (start + delta).to(torch.bfloat16) == start.to(torch.bfloat16)
    print(f"  unchanged if stored in bfloat16: {float(unchanged.float().mean()):.3f} of the entries")


if __name__ == "__main__":
    main()
