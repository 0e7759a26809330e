"""Non-IID partitions: which training prompts each client holds (its private data).

A pool of ``clients x per_client`` training prompts is drawn once from the run id; the pool is sorted by a
difficulty key and cut into ``clients`` contiguous blocks, so client 0 holds the easiest prompts and the
last client the hardest (the paper splits MATH by difficulty level across its clients). ``iid`` sorts by a
hash instead, so every block looks like the whole.

Keys, registered by name: ``iid``; ``arith-carries`` (number of carries, then digit count): carries are what
makes addition hard for the tiny model; ``arith-digits`` (digit count of the operands, then carries);
``gsm8k-steps`` (lines in the reference solution, a proxy for GSM8K difficulty, then question length).
"""

from __future__ import annotations

from collections.abc import Callable

from dgrpo.errors import ConfigError
from dgrpo.registry import Registry
from dgrpo.seeds import stable_seed
from dgrpo.tasks.base import Prompt, Task

Key = Callable[[Prompt], tuple[int, ...]]
PARTITIONS: Registry[Key] = Registry("partition")


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


def partition(task: Task, name: str, clients: int, per_client: int, run_id: str) -> list[list[Prompt]]:
    """``clients`` disjoint lists of ``per_client`` prompts (fewer when the task has fewer), easiest first."""
    key = PARTITIONS.get(name)
    pool = task.sample_prompts(clients * per_client, f"{run_id}/federated-pool")
    ordered = sorted(pool, key=key)
    size = len(ordered) // clients
    if size == 0:
        raise ConfigError(f"task {task.name!r} has {len(ordered)} prompts: too few for {clients} clients")
    return [ordered[i * size : (i + 1) * size] for i in range(clients)]
