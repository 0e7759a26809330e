"""The GSM8K task: the paper's tag format, math-verify answers, data loading, thread safety."""

from __future__ import annotations

import json
import re
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from dgrpo.errors import DataNotFoundError
from dgrpo.tasks import get_task
from dgrpo.tasks.base import Prompt, Task
from dgrpo.tasks.gsm8k import ENV_VAR, gold_answer, safe_for_math_verify

SHARED_GSM8K = Path(__file__).resolve().parents[2] / "shared" / "data" / "gsm8k"
GOLD_72 = Prompt(id="gsm8k/test/x", text="", answer="72")

TINY_TRAIN = [
    {"question": "Tom has 3 apples and buys 4 more. How many apples?", "answer": "3+4=<<3+4=7>>7\n#### 7"},
    {"question": "A box holds 12 eggs. How many eggs in 6 boxes?", "answer": "12*6=<<12*6=72>>72\n#### 72"},
    {"question": "Ann earns $1,200 a week. How much in 2 weeks?", "answer": "1200*2=2400\n#### 2,400"},
]
TINY_TEST = [
    {"question": "Sam reads 5 pages a day for 9 days. How many pages?", "answer": "5*9=45\n#### 45"},
    {"question": "What is 100 minus 58?", "answer": "100-58=42\n#### 42"},
]


def _write_jsonl(path: Path, rows: list[dict[str, str]]) -> None:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The shared GSM8K copy when this checkout has one beside it, else a tiny file in its format."""
    if (SHARED_GSM8K / "train.jsonl").is_file() and (SHARED_GSM8K / "test.jsonl").is_file():
        return SHARED_GSM8K
    path = tmp_path_factory.mktemp("gsm8k")
    _write_jsonl(path / "train.jsonl", TINY_TRAIN)
    _write_jsonl(path / "test.jsonl", TINY_TEST)
    return path


@pytest.fixture(scope="module")
def task(data_dir: Path) -> Task:
    return get_task("gsm8k", data=str(data_dir))


def _completion(answer: str, think: str = "12 eggs per box times 6 boxes is 72.") -> str:
    return f"<think>{think}</think>\n<answer>{answer}</answer>"


def test_well_formed_correct_answer_earns_one(task: Task) -> None:
    assert task.reward(GOLD_72, _completion("72")) == 1.0
    assert task.reward(GOLD_72, "  <think>x</think><answer> 72 </answer>\n") == 1.0
    assert task.parse_answer(_completion("72")) == "72"


@pytest.mark.parametrize("answer", [r"\boxed{72}", r"$\boxed{72}$", "72.0", "72 dollars", r"\frac{144}{2}"])
def test_math_verify_equivalent_answers(task: Task, answer: str) -> None:
    assert task.reward(GOLD_72, _completion(answer)) == 1.0


@pytest.mark.parametrize("answer", ["73", r"\boxed{7}", "seventy-two", "72 and 73", "-72"])
def test_wrong_answers_earn_zero(task: Task, answer: str) -> None:
    assert task.reward(GOLD_72, _completion(answer)) == 0.0


@pytest.mark.parametrize(
    "completion",
    [
        "72",
        "<answer>72</answer>",
        "<think>reasoning</think>",
        "<think>reasoning</think> 72",
        "<think>reasoning<answer>72</answer>",
        "<answer>72</answer><think>reasoning</think>",
        "<think>a</think><think>b</think><answer>72</answer>",
        "<think>a</think><answer>72</answer><answer>72</answer>",
        "<think>a <answer>72</answer></think><answer>72</answer>",
        "<think>a <think>b</think></think><answer>72</answer>",
        "<think>a</think><answer><answer>72</answer></answer>",
        "<think>a</think>\n<answer>72</answer> trailing text",
        "preamble <think>a</think>\n<answer>72</answer>",
        "<think>a</think> between <answer>72</answer>",
        "<think>a</think><answer></answer>",
        "<think>a</think><answer>   </answer>",
        "<THINK>a</THINK><ANSWER>72</ANSWER>",
    ],
)
def test_malformed_tags_earn_zero(task: Task, completion: str) -> None:
    assert task.reward(GOLD_72, completion) == 0.0
    assert task.parse_answer(completion) is None


@pytest.mark.parametrize(
    "completion",
    [
        "",
        "\x00\xff\ud800 garbage",
        "x" * 200_000,
        _completion("7" * 300),  # an answer longer than any GSM8K answer
        _completion("72", think="step " * 20_000),  # a completion far longer than the model's budget
    ],
)
def test_garbage_empty_and_huge_completions_earn_zero(task: Task, completion: str) -> None:
    assert task.reward(GOLD_72, completion) == 0.0


@pytest.mark.parametrize(
    "answer", ["9**9**9", "2^{2^{40}}", r"\boxed{99999999!}", r"\binom{999999999}{499999999}", "factorial(10**9)"]
)
def test_answers_that_would_stall_math_verify_are_refused_quickly(task: Task, answer: str) -> None:
    assert not safe_for_math_verify(answer)
    started = time.monotonic()
    assert task.reward(GOLD_72, _completion(answer)) == 0.0
    assert time.monotonic() - started < 1.0


def test_reward_never_raises_on_non_text(task: Task) -> None:
    assert task.reward(GOLD_72, None) == 0.0  # type: ignore[arg-type]
    assert task.reward(GOLD_72, 72) == 0.0  # type: ignore[arg-type]


def test_reward_works_in_worker_threads(task: Task) -> None:
    cases = [(_completion("72"), 1.0), (_completion(r"\boxed{72}"), 1.0), (_completion("71"), 0.0)] * 20
    with ThreadPoolExecutor(max_workers=8) as pool:
        rewards = list(pool.map(lambda case: task.reward(GOLD_72, case[0]), cases))
    assert rewards == [expected for _, expected in cases]


def test_gold_answer_extraction() -> None:
    assert gold_answer("work\n#### 1,234") == "1234"
    assert gold_answer("a #### b\n#### 72") == "72"
    assert gold_answer(" 18 ") == "18"


def test_data_loading_and_prompt_format(task: Task, data_dir: Path) -> None:
    train_lines = (data_dir / "train.jsonl").read_text().splitlines()
    assert task.num_train == len(train_lines)
    first = task.train_prompt(0)
    row = json.loads(train_lines[0])
    assert first.id == "gsm8k/train/0"
    assert row["question"] in first.text
    assert "<think>" in first.text and "<answer>" in first.text
    assert first.answer == gold_answer(row["answer"])
    assert "####" not in first.answer and "," not in first.answer
    assert task.reward(first, _completion(first.answer)) == 1.0


def test_held_out_prompts_come_from_the_test_split(task: Task, data_dir: Path) -> None:
    held_out = task.eval_prompts(2)
    assert [p.id for p in held_out] == ["gsm8k/test/0", "gsm8k/test/1"]
    assert held_out == task.eval_prompts(2)
    test_questions = {json.loads(line)["question"] for line in (data_dir / "test.jsonl").read_text().splitlines()}
    assert all(p.meta["question"] in test_questions for p in held_out)
    training = {task.train_prompt(i).meta["question"] for i in range(min(task.num_train, 500))}
    assert not training & {p.meta["question"] for p in held_out}


def test_single_file_is_split_deterministically(tmp_path: Path) -> None:
    rows = [{"question": f"What is {i} plus 1?", "answer": f"#### {i + 1}"} for i in range(100)]
    _write_jsonl(tmp_path / "all.jsonl", rows)
    task = get_task("gsm8k", data=str(tmp_path / "all.jsonl"))
    held_out = task.eval_prompts(100)
    training = [task.train_prompt(i) for i in range(task.num_train)]
    assert len(held_out) + len(training) == 100
    assert 0 < len(held_out) < 30
    assert not {p.meta["question"] for p in held_out} & {p.meta["question"] for p in training}
    again = get_task("gsm8k", data=str(tmp_path / "all.jsonl"))
    assert [p.id for p in again.eval_prompts(100)] == [p.id for p in held_out]


def test_environment_variable_names_the_data(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _write_jsonl(tmp_path / "train.jsonl", TINY_TRAIN)
    _write_jsonl(tmp_path / "test.jsonl", TINY_TEST)
    monkeypatch.setenv(ENV_VAR, str(tmp_path))
    task = get_task("gsm8k")
    assert task.num_train == len(TINY_TRAIN)
    assert task.train_prompt(2).answer == "2400"


def test_missing_data_path_is_a_clear_error(tmp_path: Path) -> None:
    missing = tmp_path / "no-such-gsm8k"
    with pytest.raises(DataNotFoundError, match="no-such-gsm8k") as info:
        get_task("gsm8k", data=str(missing))
    assert "--data" in str(info.value)


def test_directory_without_test_split_is_an_error(tmp_path: Path) -> None:
    _write_jsonl(tmp_path / "train.jsonl", TINY_TRAIN)
    with pytest.raises(DataNotFoundError, match=re.escape("test.jsonl")):
        get_task("gsm8k", data=str(tmp_path))


def test_malformed_data_file_is_an_error(tmp_path: Path) -> None:
    (tmp_path / "bad.jsonl").write_text('{"question": "only a question"}\n')
    with pytest.raises(DataNotFoundError, match=re.escape("bad.jsonl")):
        get_task("gsm8k", data=str(tmp_path / "bad.jsonl"))
