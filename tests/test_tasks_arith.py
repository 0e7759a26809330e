"""The embedded ``arith`` task and the task registry."""

from __future__ import annotations

import pytest

from dgrpo.errors import UnknownNameError
from dgrpo.tasks import TASKS, get_task
from dgrpo.tasks.arith import ArithTask, is_held_out, make_prompt, scratchpad


@pytest.fixture(scope="module")
def task() -> ArithTask:
    return ArithTask()


def test_correct_scratchpad_earns_one(task: ArithTask) -> None:
    prompt = task.train_prompt(4321)
    a, b = prompt.meta["a"], prompt.meta["b"]
    completion = scratchpad(a, b)
    assert completion.endswith(f">{a + b}")
    assert task.reward(prompt, completion) == 1.0
    assert task.parse_answer(completion) == str(a + b)


def test_known_example_from_the_notes(task: ArithTask) -> None:
    assert scratchpad(345, 78) == "5+8+0=13,4+7+1=12,3+0+1=4>423"


def test_wrong_final_answer_earns_zero(task: ArithTask) -> None:
    prompt = task.train_prompt(10)
    a, b = prompt.meta["a"], prompt.meta["b"]
    wrong = scratchpad(a, b).rpartition(">")[0] + f">{a + b + 1}"
    assert task.reward(prompt, wrong) == 0.0


@pytest.mark.parametrize(
    "completion",
    [
        "",
        "   ",
        "5+8+0=13,4+7+1=12,3+0+1=4",  # missing '>'
        "5+8+0=13,4+7+1=12,3+0+1=4>423 and that is it",  # extra text after the answer
        "5+8+0=13,all hail,3+0+1=4>423",  # a step without a column computation
        "5+8+0=13,4+7+1=12>42>3",
        "5+8+0=13\n4+7+1=12>423",
        "the answer is >423",
        ">423",
        "5+8+0=13,,3+0+1=4>423",
        "５+８+０=１３>４２３",  # full-width digits
        "\x00\ud800\U0010ffff>423",
        "5+8+0=13," * 1_111 + "3+0+1=4>423",  # ~10k characters
        "9" * 10_000,
    ],
)
def test_malformed_completions_earn_zero(task: ArithTask, completion: str) -> None:
    prompt = task.eval_prompts(1)[0]
    assert task.reward(prompt, completion) == 0.0


@pytest.mark.parametrize(
    "completion",
    [
        "5+8+0=14,4+7+1=12,3+0+1=4>423",  # a false step: the reward does not read the steps (paper's gap)
        "All hail to the thief 5+8+0=13,4+7+1=12,3+0+1=4>423",  # extra words inside a step
        "5+8+0=13 ok,4+7+1=12 ok,3+0+1=4 ok>423",
        "5+8+0=13,4+7+1=12,3+0+1=4,0+0+0=0>423",  # an extra (true) column
    ],
)
def test_reward_reads_the_format_and_answer_not_the_steps(task: ArithTask, completion: str) -> None:
    prompt = make_prompt(345, 78)
    assert task.reward(prompt, completion) == 1.0


def test_reward_never_raises_on_non_text(task: ArithTask) -> None:
    prompt = task.train_prompt(0)
    assert task.reward(prompt, None) == 0.0  # type: ignore[arg-type]
    assert task.reward(prompt, 423) == 0.0  # type: ignore[arg-type]


def test_held_out_prompts_never_appear_in_training(task: ArithTask) -> None:
    held_out = task.eval_prompts(300)
    assert len({p.id for p in held_out}) == 300
    assert all(is_held_out(p.meta["a"], p.meta["b"]) for p in held_out)
    stride = 997  # a spread-out sample of the ~890k training pairs
    training = [task.train_prompt(i) for i in range(0, task.num_train, stride)]
    training += task.sample_prompts(500, "run-0/round-3")
    assert not any(is_held_out(p.meta["a"], p.meta["b"]) for p in training)
    assert not {p.id for p in held_out} & {p.id for p in training}


def test_eval_prompts_are_stable(task: ArithTask) -> None:
    assert [p.id for p in task.eval_prompts(20)] == [p.id for p in ArithTask().eval_prompts(20)]


def test_sample_prompts_is_deterministic_per_key(task: ArithTask) -> None:
    first = [p.id for p in task.sample_prompts(16, "key-a")]
    assert first == [p.id for p in task.sample_prompts(16, "key-a")]
    assert first != [p.id for p in task.sample_prompts(16, "key-b")]


def test_builtin_tasks_are_registered() -> None:
    for name in ("arith", "arith-code", "code", "gsm8k", "humaneval"):
        assert name in TASKS
    assert isinstance(get_task("arith"), ArithTask)


def test_unknown_task_name_lists_the_valid_names() -> None:
    with pytest.raises(UnknownNameError) as info:
        get_task("no-such-task")
    message = str(info.value)
    assert "no-such-task" in message
    for name in ("arith", "arith-code", "code", "gsm8k", "humaneval"):
        assert name in message
