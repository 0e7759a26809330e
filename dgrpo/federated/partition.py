"""Non-IID partitions: which training prompts each client holds (its private data).

A pool of ``clients x per_client`` training prompts is drawn once from the run id; the pool is sorted by a
difficulty key and cut into ``clients`` contiguous blocks, so client 0 holds the easiest prompts and the
last client the hardest (the paper splits MATH by difficulty level across its clients). ``iid`` sorts by a
hash instead, so every block looks like the whole.

Keys, registered by name: ``iid``; ``arith-carries`` (number of carries, then digit count): carries are what
makes addition hard for the tiny model; ``arith-digits`` (digit count of the operands, then carries);
``gsm8k-steps`` (lines in the reference solution, a proxy for GSM8K difficulty, then question length).

Those cut one natural pool, so every client still holds mostly the task's common prompts, and the clients'
learning signals differ at most 2x (docs/federated.md). A *levelled* partition (``LEVELS``) gives each client
prompts of one difficulty level instead, drawn from the whole training set: the first clients one level
each, the others the last level. ``arith-levels``: operand lengths 2+2 (the untrained tiny model solves 6%:
little reward variance), 2+3 (26%), 3+3 (57%) (``scripts/fed_levels.py``; docs/federated.md). As in
Fed-GRPO's MATH split by difficulty level.

Noisy data (:func:`add_label_noise`): the last ``noisy_clients`` clients hold prompts of which a fraction
``label_noise`` carry another of their prompts' reference answer (shuffled labels, the usual model of noisy
labels in federated learning): their rewards say little, and what they say is partly wrong.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Callable, Sequence

from dgrpo.errors import ConfigError
from dgrpo.registry import Registry
from dgrpo.seeds import stable_seed
from dgrpo.tasks.base import Prompt, Task

Key = Callable[[Prompt], tuple[int, ...]]
PARTITIONS: Registry[Key] = Registry("partition")
# A levelled partition: the prompt's difficulty level (0 the hardest), the number of levels.
Level = tuple[Callable[[Prompt], int], int]
LEVELS: Registry[Level] = Registry("levelled partition")


def carries(a: int, b: int) -> int:
    count, carry = 0, 0
    while a or b:
        carry = 1 if a % 10 + b % 10 + carry >= 10 else 0
        count += carry
        a, b = a // 10, b // 10
    return count


def _operands(prompt: Prompt) -> tuple[int, int]:
    try:
        return int(prompt.meta["a"]), int(prompt.meta["b"])
    except (KeyError, TypeError, ValueError):
        raise ConfigError(f"partition needs arith prompts (with operands), got {prompt.id!r}") from None


@PARTITIONS.register("iid")
def iid(prompt: Prompt) -> tuple[int, ...]:
    return (stable_seed("iid", prompt.id),)


@PARTITIONS.register("arith-carries")
def arith_carries(prompt: Prompt) -> tuple[int, ...]:
    a, b = _operands(prompt)
    return (carries(a, b), len(str(a)) + len(str(b)), stable_seed(prompt.id))


@PARTITIONS.register("arith-digits")
def arith_digits(prompt: Prompt) -> tuple[int, ...]:
    a, b = _operands(prompt)
    return (len(str(a)) + len(str(b)), carries(a, b), stable_seed(prompt.id))


@PARTITIONS.register("gsm8k-steps")
def gsm8k_steps(prompt: Prompt) -> tuple[int, ...]:
    solution = prompt.meta.get("solution")
    if not isinstance(solution, str):
        raise ConfigError(f"gsm8k-steps needs gsm8k prompts (with a solution), got {prompt.id!r}")
    return (solution.count("\n") + 1, len(prompt.text), stable_seed(prompt.id))


def _operand_level(prompt: Prompt) -> int:
    a, b = _operands(prompt)
    return {4: 0, 5: 1}.get(len(str(a)) + len(str(b)), 2)


LEVELS.register("arith-levels")((_operand_level, 3))


def client_level(client: int, levels: int) -> int:
    """The level of client ``client``: one level each for the first clients, the last level for the rest."""
    return min(client, levels - 1)


def levelled(task: Task, level: Level, clients: int, per_client: int, run_id: str) -> list[list[Prompt]]:
    """Client i holds ``per_client`` prompts of level ``client_level(i)``: a seeded walk through the training
    set takes prompts for the levels that still need some (clients of one level share them out in turn)."""
    of_level, count = level
    wanted = [client_level(i, count) for i in range(clients)]
    need = {lv: wanted.count(lv) * per_client for lv in set(wanted)}
    found: dict[int, list[Prompt]] = {lv: [] for lv in need}
    rng = random.Random(stable_seed(run_id, "federated-levels"))
    for index in rng.sample(range(task.num_train), task.num_train):
        prompt = task.train_prompt(index)
        lv = of_level(prompt)
        if lv in need and len(found[lv]) < need[lv]:
            found[lv].append(prompt)
            if all(len(found[v]) == need[v] for v in need):
                break
    parts: list[list[Prompt]] = []
    for i, lv in enumerate(wanted):
        rank = wanted[:i].count(lv)  # this client's turn among the clients of its level
        share = found[lv][rank :: wanted.count(lv)]
        if not share:
            raise ConfigError(f"task {task.name!r} has no training prompts of level {lv} for client {i}")
        parts.append(share)
    return parts


def add_label_noise(prompts: Sequence[Prompt], fraction: float, seed_key: str) -> list[Prompt]:
    """``prompts`` with ``fraction`` of them (seeded choice) carrying another chosen prompt's reference answer:
    the chosen ones' answers are rotated by one, so each is wrong wherever two answers differ."""
    out = list(prompts)
    rng = random.Random(stable_seed(seed_key, "label-noise"))
    chosen = sorted(rng.sample(range(len(out)), round(fraction * len(out))))
    if len(chosen) < 2:
        return out
    answers = [out[i].answer for i in chosen]
    for i, answer in zip(chosen, answers[1:] + answers[:1], strict=True):
        out[i] = dataclasses.replace(out[i], answer=answer, meta={**out[i].meta, "noisy_label": True})
    return out


def client_prompts(
    task: Task,
    name: str,
    clients: int,
    per_client: int,
    run_id: str,
    noisy_clients: int = 0,
    label_noise: float = 0.0,
) -> list[list[Prompt]]:
    """Every client's private prompts: the partition ``name``, then label noise on the last ``noisy_clients``."""
    parts = partition(task, name, clients, per_client, run_id)
    for i in range(clients - noisy_clients, clients):
        parts[i] = add_label_noise(parts[i], label_noise, f"{run_id}/client-{i}")
    return parts


def partition(task: Task, name: str, clients: int, per_client: int, run_id: str) -> list[list[Prompt]]:
    """``clients`` disjoint lists of ``per_client`` prompts (fewer when the task has fewer), easiest first
    (a levelled partition: hardest first, see the module docstring)."""
    if name in LEVELS:
        return levelled(task, LEVELS.get(name), clients, per_client, run_id)
    key = PARTITIONS.get(name)
    pool = task.sample_prompts(clients * per_client, f"{run_id}/federated-pool")
    ordered = sorted(pool, key=key)
    size = len(ordered) // clients
    if size == 0:
        raise ConfigError(f"task {task.name!r} has {len(ordered)} prompts: too few for {clients} clients")
    return [ordered[i * size : (i + 1) * size] for i in range(clients)]
