"""Code rewards: program extraction, output comparison, and the arith-code, humaneval and code tasks."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from dgrpo.errors import DataNotFoundError
from dgrpo.sandbox import SandboxLimits
from dgrpo.tasks import get_task
from dgrpo.tasks.arith_code import ArithCodeTask, reference_program
from dgrpo.tasks.base import Prompt, Task
from dgrpo.tasks.code import MAX_PROGRAM_CHARS, extract_program, humaneval_job, output_matches


@pytest.mark.parametrize(
    ("completion", "expected"),
    [
        ("print(1)", "print(1)"),
        ("  print(1)\n\n", "print(1)"),
        ("Here you go:\n```python\nprint(2)\n```\nDone.", "print(2)"),
        ("```python\nprint(1)\n```\nBetter:\n```python\nprint(3)\n```", "print(3)"),
        ("```py\nx = 4\nprint(x)\n```", "x = 4\nprint(x)"),
        ("```\nprint(5)\n```", "print(5)"),
        ("```Python\nprint(6)\n```", "print(6)"),
        ("Sure!\n```python\nprint(7)", "print(7)"),  # cut off before the closing fence
    ],
)
def test_extract_program_finds_the_program(completion: str, expected: str) -> None:
    assert extract_program(completion) == expected


@pytest.mark.parametrize(
    "completion",
    [
        "",
        "   \n\t",
        "```python\n\n```",
        "print(",
        "The answer is 423.",
        "```bash\nls -la\n```",
        "x = 1\x00",
        "(" * 500 + ")" * 500,
        "-" * 15_000 + "1",
        "x = 1\n" * (MAX_PROGRAM_CHARS // 6 + 1),
        "\ud800\udfff garbage \x00\x01\x02",
        "a" * 1_000_000,
    ],
)
def test_extract_program_rejects_non_programs(completion: str) -> None:
    assert extract_program(completion) is None


def test_extract_program_never_raises_on_non_text() -> None:
    assert extract_program(None) is None  # type: ignore[arg-type]
    assert extract_program(b"print(1)") is None  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("stdout", "expected", "matches"),
    [
        ("423\n", "423", True),
        ("423.0", "423", True),
        ("  423  ", "423.00", True),
        ("1e3", "1000", True),
        ("-7", "-7.0", True),
        ("424", "423", False),
        ("100000000000000000001", "100000000000000000000", False),  # floats would call these equal
        ("hello\n", "hello", True),
        ("Hello", "hello", False),
        ("423\n424", "423", False),
        ("", "", False),
        ("", "0", False),
        ("nan", "423", False),
        ("inf", "Infinity", False),
        ("sNaN", "sNaN1", False),
        ("9" * 5000, "9" * 4999, False),
    ],
)
def test_output_matches(stdout: str, expected: str, matches: bool) -> None:
    assert output_matches(stdout, expected) is matches


@pytest.fixture(scope="module")
def arith_code() -> ArithCodeTask:
    return ArithCodeTask(limits=SandboxLimits(cpu_seconds=1.0, wall_seconds=2.0))


def test_arith_code_rewards(arith_code: ArithCodeTask) -> None:
    prompt = arith_code.train_prompt(123)
    completions = [
        reference_program(prompt),
        f"print({prompt.answer})",
        f"```python\nresult = {prompt.answer}\nprint(result)\n```",
        f"print({int(prompt.answer) + 1})",
        "",
        "print(",
        "\x00\xff\xfe garbage \ud800",
        "print(1)\n" * 5000,
        "while True: pass",
        f"print({prompt.answer})\nraise SystemExit(1)",
    ]
    assert arith_code.rewards(prompt, completions) == [1.0, 1.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0]
    assert arith_code.reward(prompt, reference_program(prompt)) == 1.0
    assert arith_code.parse_answer(reference_program(prompt)) == prompt.answer
    assert arith_code.parse_answer("print(") is None


def test_arith_code_held_out_prompts_are_not_training_prompts(arith_code: ArithCodeTask) -> None:
    held_out = {p.id for p in arith_code.eval_prompts(50)}
    assert len(held_out) == 50
    training = {p.id for p in arith_code.sample_prompts(2000, "check")}
    assert not held_out & training


@pytest.fixture(scope="module")
def humaneval() -> Task:
    return get_task("humaneval")


def test_humaneval_canonical_solution_passes_and_wrong_body_fails(humaneval: Task) -> None:
    for prompt in [*humaneval.eval_prompts(2), humaneval.train_prompt(0)]:
        assert humaneval.reward(prompt, prompt.answer) == 1.0
        assert humaneval.reward(prompt, "    return None\n") == 0.0


def test_humaneval_restated_signature_and_garbage(humaneval: Task) -> None:
    prompt = humaneval.eval_prompts(1)[0]
    restated = f"```python\n{prompt.text}{prompt.answer}```"
    assert humaneval.reward(prompt, restated) == 1.0
    assert humaneval.reward(prompt, "") == 0.0
    assert humaneval.reward(prompt, "\x00" * 10) == 0.0
    assert humaneval_job(prompt, "    return (\n") is None  # not Python: never reaches the sandbox


def test_humaneval_infinite_loop_scores_zero() -> None:
    task = get_task("humaneval", limits=SandboxLimits(cpu_seconds=1.0, wall_seconds=2.0))
    prompt = task.eval_prompts(1)[0]
    assert task.reward(prompt, "    while True:\n        pass\n") == 0.0


def test_humaneval_split_is_deterministic_and_disjoint(humaneval: Task) -> None:
    held_out = [p.id for p in humaneval.eval_prompts(1000)]
    training = [humaneval.train_prompt(i).id for i in range(humaneval.num_train)]
    assert len(held_out) + len(training) == 164
    assert not set(held_out) & set(training)
    assert held_out == [p.id for p in get_task("humaneval").eval_prompts(1000)]
    assert held_out[0] == "humaneval/HumanEval/0"


def _write_jsonl(path: Path, rows: list[dict[str, object]]) -> None:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))


def test_code_task_from_jsonl(tmp_path: Path) -> None:
    data = tmp_path / "code.jsonl"
    _write_jsonl(
        data,
        [
            {"id": "q1", "question": "What is 17 * 23?", "answer": "391", "split": "train"},
            {"id": "q2", "question": "What is half of 9?", "answer": 4.5, "split": "train"},
            {"id": "q3", "question": "What is 2 + 2?", "answer": "4", "split": "test"},
        ],
    )
    task = get_task("code", data=str(data))
    assert task.num_train == 2
    first = task.train_prompt(0)
    assert first.id == "code/q1"
    assert "What is 17 * 23?" in first.text
    assert task.reward(first, "```python\nprint(17 * 23)\n```") == 1.0
    assert task.reward(first, "print(390)") == 0.0
    assert task.reward(first, "import socket; socket.socket(); print(391)") == 0.0
    assert task.reward(task.train_prompt(1), "print(9 / 2)") == 1.0
    assert task.rewards(first, ["print(391)", "", "print(391.0)"]) == [1.0, 0.0, 1.0]
    assert [p.id for p in task.eval_prompts(5)] == ["code/q3"]
    assert task.parse_answer("print(17 * 23)") == "391"


def test_code_task_hash_split_without_split_field(tmp_path: Path) -> None:
    data = tmp_path / "code.jsonl"
    _write_jsonl(data, [{"question": f"q{i}", "answer": str(i)} for i in range(200)])
    task = get_task("code", data=str(data))
    held_out = {p.id for p in task.eval_prompts(200)}
    training = {task.train_prompt(i).id for i in range(task.num_train)}
    assert len(held_out) + len(training) == 200
    assert 0 < len(held_out) < 60
    assert not held_out & training


def test_code_task_missing_file_names_the_path(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere" / "code.jsonl"
    with pytest.raises(DataNotFoundError, match="nowhere"):
        get_task("code", data=str(missing))
    with pytest.raises(DataNotFoundError, match="--data"):
        get_task("code")


def test_code_task_malformed_rows_are_reported(tmp_path: Path) -> None:
    data = tmp_path / "bad.jsonl"
    data.write_text('{"question": "q"}\n')
    with pytest.raises(DataNotFoundError, match="answer"):
        get_task("code", data=str(data))
    data.write_text("not json\n")
    with pytest.raises(DataNotFoundError, match=re.escape(str(data))):
        get_task("code", data=str(data))


def test_rewards_never_raise_on_non_text(arith_code: ArithCodeTask) -> None:
    prompt = Prompt(id="x", text="", answer="1", meta={"reference": "print(1)"})
    assert arith_code.rewards(prompt, [None, 12, b"print(1)"]) == [0.0, 0.0, 0.0]  # type: ignore[list-item]
