"""``gym``: any of reasoning-gym's procedural datasets by name, rewarded by the dataset's own ``score_answer``.

Community swarms train on these tasks (SAPO, arXiv 2509.08721, on reasoning-gym). A prompt is the dataset's
question and an instruction to end with ``<answer>...</answer>``; the reward is reasoning-gym's verifier on the
text of the last ``<answer>`` tag (its ``extract_answer``), a float in [0, 1] (several datasets give partial
credit). Options (``[task] options = {dataset = "basic_arithmetic", config = {...}}``):

- ``dataset``: a reasoning-gym dataset name (``reasoning_gym.factory.DATASETS``);
- ``config``: the dataset's own configuration (difficulty ranges and so on);
- ``seed``, ``size``: the training draw. Every node of a run builds the same procedural dataset from them, so
  prompts are the same everywhere and a prompt id (``gym/<dataset>/train/<index>``) is enough to rebuild a
  prompt and its answer: a peer's copy is never trusted;
- ``eval_size``: held-out prompts, drawn with another seed from a tenth of the question space (by hash) that
  training prompts never come from;
- ``answer_format``: ``tag`` (reasoning-gym's ``<answer>`` convention, the default), ``final`` (a closing
  "The final answer is X." line, for models too small to use the tag) or ``number`` (the question and "Reply with
  only the answer."; the answer is the last number in the completion, GSM8K-style: for numeric datasets only);
- ``trust_scorer``: allow a dataset whose scorer evaluates the answer as code (``eval``, sympy's
  ``parse_expr``; :mod:`dgrpo.tasks.gym_safety`), refused by default: peers' answers are hostile.

A peer's answer is hostile text and some scorers parse it with sympy, so scoring runs in a worker process with
a wall-time bound per answer and a memory cap (:mod:`dgrpo.tasks.bounded_worker`); verdicts are cached.
"""

from __future__ import annotations

import math
import re
import threading
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from dgrpo.errors import ConfigError, UnknownNameError
from dgrpo.seeds import stable_seed
from dgrpo.tasks.base import Prompt, Task
from dgrpo.tasks.bounded_worker import BoundedWorker, WorkerError
from dgrpo.tasks.gym_safety import scorer_evaluates_text
from dgrpo.tasks.registry import TASKS

# answer_format "tag": reasoning-gym's own convention. "final": a closing line "The final answer is X." for
# models too small to follow the tag (SmolLM2-135M-Instruct wrote the <answer> tag in 4 of 192 tries, and
# "The final answer is ..." in about half of its completions: docs/tasks.md); a last <answer> tag still counts.
PROMPTS = {
    "tag": "{question}\n\nThink it through step by step, then give only the final answer inside <answer> "
    "</answer> tags, like this: <answer>your answer</answer>",
    "final": '{question}\n\nWork it out briefly, then end with one line of the form "The final answer is X."',
    # "number": SmolLM2-135M-Instruct answers "3 * 8" with "The answer is 24", "4 * 8 = 32", "The final answer to
    # this arithmetic problem is 6": right far more often than it follows a format (docs/tasks.md), so the answer
    # is the last number it writes, as GSM8K's graders read a model's answer. Numeric datasets only.
    "number": "{question}\n\nReply with only the answer.",
}
PROMPT_TEMPLATE = PROMPTS["tag"]
ANSWER_RE = re.compile(r"<answer>\s?(.*?)\s?</answer>", re.DOTALL)  # reasoning-gym's extract_answer
# the last number: digits with optional thousands separators, sign and decimals ("1,234.5" -> "1234.5")
NUMBER_RE = re.compile(r"(?<![\w.])-?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?![\w])")
FINAL_RE = re.compile(r"final answer is[:\s]*(.+?)\s*\.?[ \t]*$", re.IGNORECASE | re.MULTILINE)
MAX_COMPLETION_CHARS = 64_000
MAX_ANSWER_CHARS = 2_048
CACHE_SIZE = 65_536
NUMERIC_CHECK_ITEMS = 64  # answers looked at to tell a numeric dataset
HELD_OUT_MODULUS = 10  # a tenth of the question space is held out
EVAL_DRAW_FACTOR = 20  # held-out draw per prompt wanted: a tenth of it is held out, minus repeats
SEED_MODULUS = 2**31
WARM_SECONDS = 60.0  # building a dataset in the worker (some load data files), before any answer counts


class GymError(ConfigError):
    """reasoning-gym is missing, or a dataset cannot be built with the given configuration."""


@dataclass
class GymStats:
    answers: int = 0
    cached: int = 0
    timeouts: int = 0
    out_of_memory: int = 0


def dataset_names() -> list[str]:
    from reasoning_gym.factory import DATASETS

    return sorted(DATASETS)


def parse_completion(completion: str, answer_format: str = "tag") -> str | None:
    """The stripped text of the last ``<answer>`` tag (as reasoning-gym's ``extract_answer``), or with
    ``answer_format="final"`` of whichever comes last of that and a "final answer is X" line, or with
    ``answer_format="number"`` the last number written (separators dropped); None when there
    is none or the completion or answer is oversized."""
    if not isinstance(completion, str) or len(completion) > MAX_COMPLETION_CHARS:
        return None
    if answer_format == "number":
        numbers = NUMBER_RE.findall(completion)
        return numbers[-1].replace(",", "") if numbers else None
    found = [(m.start(), m.group(1)) for m in ANSWER_RE.finditer(completion)]
    if answer_format == "final":
        found += [(m.start(), m.group(1)) for m in FINAL_RE.finditer(completion)]
    if not found:
        return None
    answer = str(max(found)[1]).strip()
    if answer_format == "final":
        answer = answer.strip("*`").strip()  # "The final answer is **12**." (markdown emphasis)
    return answer if len(answer) <= MAX_ANSWER_CHARS else None


@TASKS.register("gym")
class GymTask(Task):
    """One reasoning-gym dataset as a task (see the module docstring)."""

    name = "gym"
    reasoning_format = "text"

    def __init__(
        self,
        dataset: str = "basic_arithmetic",
        config: Mapping[str, Any] | None = None,
        seed: int = 0,
        size: int = 5_000,
        eval_size: int = 1_000,
        timeout_seconds: float = 2.0,
        memory_bytes: int = 2 << 30,
        trust_scorer: bool = False,
        answer_format: str = "tag",
    ) -> None:
        try:
            import reasoning_gym
        except ImportError as exc:
            raise GymError("the gym task needs reasoning-gym: pip install 'dgrpo[gym]'") from exc
        from reasoning_gym.factory import DATASETS

        if dataset not in DATASETS:
            raise UnknownNameError("reasoning-gym dataset", dataset, dataset_names())
        evaluates = scorer_evaluates_text(DATASETS[dataset][0])
        if evaluates and not trust_scorer:
            raise GymError(
                f"gym: reasoning-gym's scorer for {dataset!r} evaluates the answer text as code "
                f"({'; '.join(evaluates)}): a peer's <answer> would run in this node. Pick another dataset, or "
                "set task option trust_scorer = true where every node is your own (docs/tasks.md)"
            )
        if answer_format not in PROMPTS:
            raise GymError(f"gym: answer_format must be one of {', '.join(PROMPTS)}, not {answer_format!r}")
        self.answer_format = answer_format
        if size < 1 or eval_size < 0:
            raise GymError(f"gym: size must be >= 1 and eval_size >= 0 (got {size}, {eval_size})")
        self.dataset = dataset
        self.config = dict(config or {})
        self.timeout_seconds = timeout_seconds
        self.stats = GymStats()
        base = stable_seed("gym", dataset, seed)
        self.train_spec = {"name": dataset, "config": self.config, "seed": base % SEED_MODULUS, "size": size}
        self.eval_spec = {
            "name": dataset,
            "config": self.config,
            # reasoning-gym draws item i from Random(seed + i): seeds right after the training range
            "seed": base % SEED_MODULUS + size,
            "size": max(eval_size * EVAL_DRAW_FACTOR, 1),
        }
        try:
            self._train = reasoning_gym.create_dataset(dataset, seed=self.train_spec["seed"], size=size, **self.config)
            self._held = reasoning_gym.create_dataset(
                dataset, seed=self.eval_spec["seed"], size=self.eval_spec["size"], **self.config
            )
        except Exception as exc:  # reasoning-gym validates its configs with asserts and ValueErrors
            raise GymError(f"gym: cannot build {dataset!r} with config {self.config}: {exc!r}") from exc
        if answer_format == "number":
            self._require_numeric(dataset)
        self.size = size
        self.eval_size = eval_size
        self._eval: list[Prompt] | None = None
        self._train_ok: list[int] | None = None
        self._train_set: frozenset[int] = frozenset()
        self._lock = threading.Lock()
        self._cache: OrderedDict[tuple[str, str], float] = OrderedDict()
        self._worker = BoundedWorker("dgrpo.tasks.gym_worker", memory_bytes, "reasoning-gym")
        try:
            self._worker.start()  # fail at construction, not silently inside every reward
            for spec in (self.train_spec, self.eval_spec):  # the worker builds each dataset once, unbounded
                self._worker.ask({"d": spec, "i": 0, "a": ""}, WARM_SECONDS)
        except WorkerError as exc:
            raise GymError(str(exc)) from None

    def _require_numeric(self, dataset: str) -> None:
        """``answer_format="number"`` reads the last number of a completion: refuse a dataset whose answers are
        not numbers (a word, a list), which that reading could never match."""
        for i in range(min(NUMERIC_CHECK_ITEMS, len(self._train))):
            answer = self._train[i].get("answer")
            if answer is not None and NUMBER_RE.fullmatch(str(answer).strip()) is None:
                raise GymError(
                    f"gym: answer_format 'number' needs a numeric dataset; {dataset!r} answers {str(answer)[:40]!r}"
                )

    # ------------------------------------------------------------------ prompts
    def _held_out(self, question: str) -> bool:
        """Whether ``question`` belongs to the held-out part of the dataset's question space: a fixed tenth by
        hash, never trained on. Small spaces (one-digit products: 81 questions) are covered whole by a training
        draw of thousands, so drawing held-out items from other seeds alone would leave none unseen."""
        return stable_seed("gym-held-out", self.dataset, question) % HELD_OUT_MODULUS == 0

    def _train_indices(self) -> list[int]:
        """The training draw's items whose question is not held out (built once: ``size`` items)."""
        if self._train_ok is None:
            self._train_ok = [i for i in range(self.size) if not self._held_out(self._train[i]["question"])]
            self._train_set = frozenset(self._train_ok)
        return self._train_ok

    @property
    def num_train(self) -> int:
        return len(self._train_indices())

    def _prompt(self, split: str, index: int, entry: Mapping[str, Any]) -> Prompt:
        answer = entry.get("answer")
        return Prompt(
            id=f"gym/{self.dataset}/{split}/{index}",
            text=PROMPTS[self.answer_format].format(question=entry["question"]),
            answer="" if answer is None else str(answer),
            meta={"question": entry["question"], "split": split, "index": index, "has_answer": answer is not None},
        )

    def train_prompt(self, index: int) -> Prompt:
        raw = self._train_indices()[index]  # the id names the item of the draw, stable whatever is held out
        return self._prompt("train", raw, self._train[raw])

    def prompt_by_id(self, prompt_id: str) -> Prompt | None:
        prefix = f"gym/{self.dataset}/train/"
        if not isinstance(prompt_id, str) or not prompt_id.startswith(prefix):
            return None
        digits = prompt_id[len(prefix) :]
        if not digits.isdigit() or len(digits) > 9 or str(int(digits)) != digits:
            return None  # a canonical index of this run's draw only: "007" and "1e3" name nothing
        self._train_indices()
        raw = int(digits)
        return self._prompt("train", raw, self._train[raw]) if raw in self._train_set else None

    def eval_prompts(self, n: int) -> list[Prompt]:
        """The first ``n`` distinct held-out questions (see :meth:`_held_out`) of the held-out draw."""
        with self._lock:
            if self._eval is None:
                self._eval, seen = [], set()
                for i in range(len(self._held)):
                    entry = self._held[i]
                    question = entry["question"]
                    if question in seen or not self._held_out(question):
                        continue
                    seen.add(question)
                    self._eval.append(self._prompt("test", i, entry))
                    if len(self._eval) >= self.eval_size:
                        break
        return self._eval[:n]

    # ------------------------------------------------------------------ rewards
    def parse_answer(self, completion: str) -> str | None:
        return parse_completion(completion, self.answer_format)

    def reference_completion(self, prompt: Prompt) -> str | None:
        if not prompt.meta.get("has_answer", True):
            return None
        if self.answer_format == "final":
            return f"The final answer is {prompt.answer}."
        if self.answer_format == "number":
            return f"The answer is {prompt.answer}."
        return f"The answer is {prompt.answer}.\n<answer>{prompt.answer}</answer>"

    def reward(self, prompt: Prompt, completion: str) -> float:
        return self.rewards(prompt, [completion])[0]

    def rewards(self, prompt: Prompt, completions: Sequence[str]) -> list[float]:
        split, index = prompt.meta.get("split"), prompt.meta.get("index")
        spec = {"train": self.train_spec, "test": self.eval_spec}.get(str(split))
        if spec is None or not isinstance(index, int):
            return [0.0] * len(completions)  # not one of this task's prompts
        with self._lock:
            return [self._score(spec, index, parse_completion(c, self.answer_format)) for c in completions]

    def _score(self, spec: dict[str, Any], index: int, answer: str | None) -> float:
        if answer is None:
            return 0.0  # reasoning-gym scores a missing answer 0 too; no need to ask
        key = (f"{spec['seed']}/{index}", answer)
        self.stats.answers += 1
        if key in self._cache:
            self._cache.move_to_end(key)
            self.stats.cached += 1
            return self._cache[key]
        line, reason = self._worker.ask({"d": spec, "i": index, "a": answer}, self.timeout_seconds)
        value = 0.0
        if reason == "timeout":
            self.stats.timeouts += 1
        elif line == "m":
            self.stats.out_of_memory += 1
            self._worker.close()
        elif line is not None:
            try:
                value = float(line)
            except ValueError:
                self._worker.close()
            value = min(max(value, 0.0), 1.0) if math.isfinite(value) else 0.0
        self._cache[key] = value
        if len(self._cache) > CACHE_SIZE:
            self._cache.popitem(last=False)
        return value

    def reward_statistics(self) -> dict[str, int]:
        s = self.stats
        return {
            "gym_answers": s.answers,
            "gym_cached": s.cached,
            "gym_timeouts": s.timeouts,
            "gym_out_of_memory": s.out_of_memory,
            "gym_worker_restarts": self._worker.restarts,
        }
