"""``gsm8k``: grade-school math word problems in the paper's format, scored with math-verify.

A completion must be exactly ``<think>reasoning</think>`` then ``<answer>final answer</answer>`` (whitespace
between and around them allowed), with each of the four tags exactly once: no duplicates, no nesting, no text
outside. The reward is 1 only for that format with an answer math-verify finds equal to GSM8K's (the number
after ``#### ``, thousands separators removed), e.g. ``\\boxed{72}`` or ``72 dollars`` for ``72``.

A peer's answer is hostile text. Two bounds keep it from stalling a node: an answer is only handed to
math-verify when it is short and made of plain arithmetic (no powers, factorials, big operators or function
calls: short inputs such as ``9**9**9`` or ``\\boxed{99999999!}`` keep sympy busy indefinitely), and
math-verify itself runs in a worker process with a time limit per answer and a memory cap
(:mod:`dgrpo.tasks.math_verifier`), for whatever the filter lets through.

Data is never part of the repository: a local JSONL (``question``/``answer`` per line, GSM8K's own format),
a directory with ``train.jsonl`` and ``test.jsonl``, the ``DGRPO_GSM8K`` environment variable naming either,
or the hub dataset ``openai/gsm8k`` through the ``datasets`` package.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from pathlib import Path

from dgrpo.errors import DataNotFoundError
from dgrpo.seeds import stable_seed
from dgrpo.tasks.base import Prompt, Task, per_item, read_jsonl
from dgrpo.tasks.math_verifier import BoundedVerifier, shared_verifier
from dgrpo.tasks.registry import TASKS

ENV_VAR = "DGRPO_GSM8K"
HUB_DATASET = ("openai/gsm8k", "main")
TAGS = ("<think>", "</think>", "<answer>", "</answer>")
CALC_ANNOTATION_RE = re.compile(r"<<[^<>]*>>")  # GSM8K's calculator annotations: 2*3=<<2*3=6>>6
FORMAT_RE = re.compile(r"<think>(.*?)</think>\s*<answer>(.*?)</answer>", re.DOTALL)
MAX_COMPLETION_CHARS = 64_000
MAX_ANSWER_CHARS = 256
EVAL_MODULUS = 10  # a single JSONL file: questions with stable_seed % 10 == 0 are held out
# Plain arithmetic only (see the module docstring): ASCII letters for units and words, digits, + - * / =,
# brackets, and the LaTeX below. No ``^``, ``!``, ``_`` (sub/superscripts of sums and products) or ``**``.
SAFE_ANSWER_RE = re.compile(r"[0-9A-Za-z \t\n.,+\-*/=$%(){}\[\]:;'\\]*")
SAFE_COMMANDS = frozenset(
    {"boxed", "frac", "dfrac", "tfrac", "text", "textbf", "textrm", "mathrm", "mathbf", "left", "right"}
    | {"cdot", "times", "div", "approx", "quad", "qquad"}
)
COMMAND_RE = re.compile(r"\\([A-Za-z]+)")
# ``name(``: sympy would evaluate a function call. LaTeX commands (``\left(``) are checked separately.
CALL_RE = re.compile(r"(?<![\\A-Za-z0-9_])[A-Za-z_][A-Za-z0-9_]*[ \t]*\(")

PROMPT_TEMPLATE = (
    "Solve the following math problem. First reason step by step inside <think> </think> tags, then give "
    "only the final answer inside <answer> </answer> tags, like this:\n"
    "<think> reasoning here </think>\n<answer> final answer here </answer>\n\n"
    "Problem: {question}\n"
)
MISSING_DATA_HELP = (
    "GSM8K data not found: pass --data PATH (a GSM8K-format JSONL file, or a directory holding train.jsonl "
    f"and test.jsonl), or set {ENV_VAR}, or install the 'datasets' package with network access to the hub"
)


def gold_answer(solution: str) -> str:
    """The final answer of a GSM8K solution: the text after ``#### ``, without thousands separators."""
    final = solution.rpartition("####")[2] if "####" in solution else solution
    return final.strip().replace(",", "")


def parse_completion(completion: str) -> str | None:
    """The text inside ``<answer>`` of a well-formed completion, stripped; None when malformed."""
    if not isinstance(completion, str) or len(completion) > MAX_COMPLETION_CHARS:
        return None
    text = completion.strip()
    if any(text.count(tag) != 1 for tag in TAGS):
        return None
    match = FORMAT_RE.fullmatch(text)
    if match is None:
        return None
    answer = match.group(2).strip()
    return answer if answer and len(answer) <= MAX_ANSWER_CHARS else None


def safe_for_math_verify(answer: str) -> bool:
    """Whether math-verify can look at ``answer`` without risking unbounded work (see the module docstring)."""
    return (
        len(answer) <= MAX_ANSWER_CHARS
        and "**" not in answer
        and SAFE_ANSWER_RE.fullmatch(answer) is not None
        and CALL_RE.search(answer) is None
        and all(command in SAFE_COMMANDS for command in COMMAND_RE.findall(answer))
    )


def answers_match_many(pairs: Sequence[tuple[str, str]], verifier: BoundedVerifier | None = None) -> list[bool]:
    """math-verify's judgement of each (answer, gold), bounded (see the module docstring); an answer the
    filter refuses is not equal without ever reaching math-verify."""
    verifier = verifier or shared_verifier()
    safe = [i for i, (answer, _) in enumerate(pairs) if safe_for_math_verify(answer)]
    verdicts = dict(zip(safe, verifier.verify_many([pairs[i] for i in safe]), strict=True))
    return [verdicts.get(i, False) for i in range(len(pairs))]


def answers_match(answer: str, gold: str) -> bool:
    return answers_match_many([(answer, gold)])[0]


def _read_rows(path: Path) -> list[dict[str, str]]:
    return [
        {"question": r["question"], "answer": r["answer"]} for r in read_jsonl(path, "GSM8K", ("question", "answer"))
    ]


def _load_local(path: Path) -> tuple[list[dict[str, str]], list[dict[str, str]]]:
    if path.is_dir():
        missing = [name for name in ("train.jsonl", "test.jsonl") if not (path / name).is_file()]
        if missing:
            raise DataNotFoundError(f"{MISSING_DATA_HELP}; {path} lacks {', '.join(missing)}")
        return _read_rows(path / "train.jsonl"), _read_rows(path / "test.jsonl")
    if path.is_file():
        rows = _read_rows(path)
        held = [stable_seed("gsm8k", row["question"]) % EVAL_MODULUS == 0 for row in rows]
        return [r for r, h in zip(rows, held, strict=True) if not h], [r for r, h in zip(rows, held, strict=True) if h]
    raise DataNotFoundError(f"{MISSING_DATA_HELP}; no such file or directory: {path}")


def _load_hub() -> tuple[list[dict[str, str]], list[dict[str, str]]]:
    try:
        import datasets
    except ImportError as exc:
        raise DataNotFoundError(MISSING_DATA_HELP) from exc
    try:
        loaded = datasets.load_dataset(*HUB_DATASET)
        splits = [
            [{"question": str(r["question"]), "answer": str(r["answer"])} for r in loaded[name]]
            for name in ("train", "test")
        ]
    except Exception as exc:
        raise DataNotFoundError(f"{MISSING_DATA_HELP} (loading {HUB_DATASET[0]} failed: {exc})") from exc
    return splits[0], splits[1]


def load_gsm8k(data: str | Path | None) -> tuple[list[dict[str, str]], list[dict[str, str]]]:
    """Training and held-out rows from ``data``, else ``$DGRPO_GSM8K``, else the hub."""
    source = data if data is not None else os.environ.get(ENV_VAR) or None
    return _load_local(Path(source).expanduser()) if source is not None else _load_hub()


def _make_prompt(split: str, index: int, row: dict[str, str]) -> Prompt:
    reasoning = row["answer"].rpartition("####")[0].strip()
    return Prompt(
        id=f"gsm8k/{split}/{index}",
        text=PROMPT_TEMPLATE.format(question=row["question"]),
        answer=gold_answer(row["answer"]),
        meta={"question": row["question"], "solution": reasoning},
    )


@TASKS.register("gsm8k")
class Gsm8kTask(Task):
    """GSM8K with the binary format-and-correctness reward of the paper's math setting."""

    name = "gsm8k"
    reasoning_format = "think"

    def __init__(self, data: str | Path | None = None) -> None:
        self._train_rows, self._test_rows = load_gsm8k(data)
        self.verifier = shared_verifier()
        self.verifier.start()  # fail at construction, not silently inside every reward, if math-verify is missing

    @property
    def num_train(self) -> int:
        return len(self._train_rows)

    def train_prompt(self, index: int) -> Prompt:
        return _make_prompt("train", index, self._train_rows[index])

    def eval_prompts(self, n: int) -> list[Prompt]:
        return [_make_prompt("test", i, row) for i, row in enumerate(self._test_rows[:n])]

    def parse_answer(self, completion: str) -> str | None:
        return parse_completion(completion)

    def reward_statistics(self) -> dict[str, int]:
        s = self.verifier.stats
        return {
            "math_verify_answers": s.answers,
            "math_verify_cached": s.cached,
            "math_verify_timeouts": s.timeouts,
            "math_verify_out_of_memory": s.out_of_memory,
            "math_verify_restarts": s.restarts,
        }

    def reference_completion(self, prompt: Prompt) -> str | None:
        """The dataset's worked solution in the paper's format (calculator annotations ``<<...>>`` removed)."""
        reasoning = CALC_ANNOTATION_RE.sub("", str(prompt.meta.get("solution", ""))).strip()
        return f"<think>{reasoning}</think><answer>{prompt.answer}</answer>" if reasoning else None

    def reward(self, prompt: Prompt, completion: str) -> float:
        return self.rewards_batch([(prompt, [completion])])[0][0]

    def rewards(self, prompt: Prompt, completions: Sequence[str]) -> list[float]:
        return self.rewards_batch([(prompt, completions)])[0]

    def rewards_batch(self, items: Sequence[tuple[Prompt, Sequence[str]]]) -> list[list[float]]:
        try:
            answers = [(parse_completion(c), p.answer) for p, completions in items for c in completions]
            found = [i for i, (a, _) in enumerate(answers) if a is not None]
            matches = answers_match_many([(str(answers[i][0]), answers[i][1]) for i in found], self.verifier)
            flat = [0.0] * len(answers)
            for i, match in zip(found, matches, strict=True):
                flat[i] = 1.0 if match else 0.0
        except Exception:  # a reward never raises (hostile input gets a verdict)
            return [[0.0] * len(completions) for _, completions in items]
        return per_item(flat, items)
