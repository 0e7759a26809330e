"""The tiny model's reward and learning signal on each level of a levelled partition, before any training.

    .venv/bin/python scripts/fed_levels.py [--partition arith-levels] [--prompts 96] [--completions 8]

For each level, ``--prompts`` training prompts of it (seeded), ``--completions`` sampled completions each at
the scenario's sampling settings; prints the mean reward and the signal (the mean of the groups' reward
standard deviations, what Fed-GRPO weighs clients by; ``dgrpo/federated/stats.py``). docs/federated.md quotes it.
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

from dgrpo.federated.partition import LEVELS
from dgrpo.federated.stats import reward_stats
from dgrpo.learner.learner import Learner
from dgrpo.seeds import stable_seed
from dgrpo.simulations.scenario import load_scenario
from dgrpo.tasks import get_task
from dgrpo.tasks.base import Prompt


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--scenario", default="fed-avg-skewed")
    parser.add_argument("--partition", default="arith-levels")
    parser.add_argument("--prompts", type=int, default=96)
    parser.add_argument("--completions", type=int, default=8)
    args = parser.parse_args()
    scenario = load_scenario(Path(args.scenario))
    task = get_task(scenario.task.name, **scenario.task.options)
    learner = Learner(scenario.model, scenario.learner, scenario.lr_rounds())
    of_level, count = LEVELS.get(args.partition)
    found: dict[int, list[Prompt]] = {lv: [] for lv in range(count)}
    rng = random.Random(stable_seed("fed-levels-probe"))
    for index in rng.sample(range(task.num_train), task.num_train):
        prompt = task.train_prompt(index)
        if len(found[of_level(prompt)]) < args.prompts:
            found[of_level(prompt)].append(prompt)
        if all(len(v) == args.prompts for v in found.values()):
            break
    rows = []
    for level, prompts in found.items():
        sampling = scenario.sampling.model_copy(update={"seed": 7})
        texts = learner.generate([p.text for p in prompts], args.completions, sampling)
        stats = reward_stats(task.rewards_batch(list(zip(prompts, texts, strict=True))))
        rows.append({"level": level, "prompts": len(prompts), "mean_reward": stats.mean, "signal": stats.std})
        print(json.dumps(rows[-1]), flush=True)


if __name__ == "__main__":
    main()
