"""Prompts and verifiable rewards. Importing this package registers the built-in tasks."""

from dgrpo.seeds import stable_seed
from dgrpo.tasks import arith as arith
from dgrpo.tasks import arith_code as arith_code
from dgrpo.tasks import code as code
from dgrpo.tasks import gsm8k as gsm8k
from dgrpo.tasks import gym as gym
from dgrpo.tasks.base import Prompt, Task
from dgrpo.tasks.registry import TASKS, get_task

__all__ = ["TASKS", "Prompt", "Task", "get_task", "stable_seed"]
