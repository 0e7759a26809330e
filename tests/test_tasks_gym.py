"""The reasoning-gym task: the same prompts on every node, held-out prompts apart from training ones, the
dataset's own scorer as the reward (bounded in a worker), strict prompt ids, and scorers that would run a
peer's answer as code refused."""

from __future__ import annotations

import time
from typing import Any

import pytest

from dgrpo.errors import UnknownNameError
from dgrpo.tasks import get_task
from dgrpo.tasks.gym import GymError, GymTask, parse_completion
from dgrpo.tasks.gym_safety import scorer_evaluates_text

EASY = {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 2, "allow_parentheses": False,
        "allow_negation": False, "operators": ["+", "-"]}  # fmt: skip


@pytest.fixture(scope="module")
def task() -> GymTask:
    t = get_task("gym", dataset="basic_arithmetic", config=EASY, size=300, eval_size=50)
    assert isinstance(t, GymTask)
    return t


def test_every_node_draws_the_same_prompts_and_another_seed_others(task: GymTask) -> None:
    other_node = get_task("gym", dataset="basic_arithmetic", config=EASY, size=300, eval_size=50)
    mine = task.sample_prompts(8, "run/round-3")
    theirs = other_node.sample_prompts(8, "run/round-3")
    assert [(p.id, p.text, p.answer) for p in mine] == [(p.id, p.text, p.answer) for p in theirs]
    reseeded = get_task("gym", dataset="basic_arithmetic", config=EASY, size=300, eval_size=50, seed=1)
    assert [reseeded.train_prompt(i).text for i in range(20)] != [task.train_prompt(i).text for i in range(20)]
    assert "<answer>" in task.train_prompt(0).text  # the prompt asks for the tag the reward reads


def test_held_out_prompts_are_never_training_questions(task: GymTask) -> None:
    held = task.eval_prompts(50)
    assert len(held) == 50 and held == task.eval_prompts(50)
    training = {task.train_prompt(i).meta["question"] for i in range(task.num_train)}
    assert not training & {p.meta["question"] for p in held}
    assert all(p.id.startswith("gym/basic_arithmetic/test/") for p in held)


def test_the_reward_is_the_datasets_own_scorer(task: GymTask) -> None:
    p = task.train_prompt(5)
    gold = p.answer
    reference = task.reference_completion(p)
    assert reference is not None and task.reward(p, reference) == 1.0
    wrong = str(int(gold) + 1)
    assert task.rewards(p, [f"x <answer>{wrong}</answer>", "no tags at all", f"<answer>{gold}"]) == [0.0, 0.0, 0.0]
    # reasoning-gym's default scorer: the gold answer inside a longer answer earns len(gold) / len(answer)
    padded = f"{gold} apples"
    assert task.reward(p, f"<answer>{padded}</answer>") == pytest.approx(len(gold) / len(padded))
    # the last <answer> tag counts (reasoning-gym's extract_answer), one optional space inside stripped
    assert task.reward(p, f"<answer>{wrong}</answer> no, <answer> {gold} </answer>") == 1.0
    assert task.reward(p, f"<answer>{gold}</answer> no, <answer>{wrong}</answer>") == 0.0
    held = task.eval_prompts(1)[0]
    assert task.reward(held, f"<answer>{held.answer}</answer>") == 1.0  # scored against the held-out draw


def test_oversized_text_scores_zero_without_the_scorer(task: GymTask) -> None:
    p = task.train_prompt(1)
    asked = task.stats.answers
    assert task.reward(p, "x" * 70_000 + f"<answer>{p.answer}</answer>") == 0.0
    assert task.reward(p, f"<answer>{p.answer}{' ' * 3000}0</answer>") == 0.0
    assert task.stats.answers == asked
    assert parse_completion(f"<answer>{'1' * 2049}</answer>") is None


def test_prompt_ids_name_only_this_runs_training_draw(task: GymTask) -> None:
    p = task.train_prompt(42)
    assert task.prompt_by_id("gym/basic_arithmetic/train/42") == p
    for forged in ("gym/basic_arithmetic/train/042", "gym/basic_arithmetic/train/300", "gym/basic_arithmetic/train/-1",
                   "gym/basic_arithmetic/train/4e1", "gym/basic_arithmetic/test/0", "gym/chain_sum/train/1",
                   "gym/basic_arithmetic/train/", "gym/basic_arithmetic/train/9" * 3):  # fmt: skip
        assert task.prompt_by_id(forged) is None, forged


def test_unknown_datasets_and_bad_configs_are_configuration_errors() -> None:
    with pytest.raises(UnknownNameError, match="basic_arithmetic"):
        get_task("gym", dataset="no_such_dataset")
    with pytest.raises(GymError, match="cannot build"):
        get_task("gym", dataset="basic_arithmetic", config={"min_terms": 5, "max_terms": 2})


def test_a_scorer_that_evaluates_the_answer_is_refused_unless_trusted() -> None:
    with pytest.raises(GymError, match="evaluates the answer text as code"):
        get_task("gym", dataset="puzzle24")
    trusted = get_task("gym", dataset="puzzle24", trust_scorer=True, size=20, eval_size=2)
    p = trusted.train_prompt(0)
    # A power tower keeps sympy's parse_expr busy for ever: bounded to the timeout, the worker restarted.
    trusted.timeout_seconds = 1.0
    started = time.monotonic()
    assert trusted.reward(p, "<answer>9**9**9**9</answer>") == 0.0
    assert time.monotonic() - started < 10
    assert trusted.reward_statistics()["gym_timeouts"] == 1
    reference = trusted.reference_completion(p)
    assert reference is not None and trusted.reward(p, reference) == 1.0  # a fresh worker scores the next one
    assert trusted.reward_statistics()["gym_worker_restarts"] == 1


class _Safe:
    def score_answer(self, answer: Any, entry: Any) -> float:
        return 1.0 if self._norm(answer) == entry["answer"] else 0.0

    def _norm(self, text: Any) -> str:
        return str(text).strip()


class _EvalInHelper(_Safe):
    def _norm(self, text: Any) -> str:
        return str(eval(text))  # the very thing the check looks for


def _sympy_helper(text: str) -> Any:
    import sympy

    return sympy.sympify(text)


class _SympyInModuleFunction(_Safe):
    def score_answer(self, answer: Any, entry: Any) -> float:
        return float(_sympy_helper(answer) == entry["answer"])


def test_the_scorer_check_follows_helpers_and_module_functions() -> None:
    assert scorer_evaluates_text(_Safe) == []
    assert scorer_evaluates_text(_EvalInHelper) == ["_norm: eval"]
    assert scorer_evaluates_text(_SympyInModuleFunction)[0].startswith("_sympy_helper: sympy.sympify")
    from reasoning_gym.factory import DATASETS

    refused = {n for n, (cls, _) in DATASETS.items() if scorer_evaluates_text(cls)}
    assert {"binary_matrix", "n_queens", "puzzle24", "polynomial_multiplication", "countdown"} <= refused
    assert not refused & {"basic_arithmetic", "chain_sum", "leg_counting", "spell_backward", "gcd"}


def test_the_final_answer_format_for_small_models() -> None:
    final = get_task("gym", dataset="basic_arithmetic", config=EASY, size=50, eval_size=5, answer_format="final")
    p = final.train_prompt(3)
    assert "The final answer is X." in p.text and "<answer>" not in p.text
    reference = final.reference_completion(p)
    assert reference == f"The final answer is {p.answer}." and final.reward(p, reference) == 1.0
    wrong = str(int(p.answer) + 1)
    assert final.reward(p, f"So the final answer is **{p.answer}**.\n") == 1.0  # markdown emphasis stripped
    assert final.reward(p, f"<answer>{wrong}</answer> The final answer is {p.answer}.") == 1.0  # the last one counts
    assert final.reward(p, f"The final answer is {p.answer}. No: <answer>{wrong}</answer>") == 0.0
    assert parse_completion(f"The final answer is {p.answer}.") is None  # not in the tag format
    with pytest.raises(GymError, match="answer_format"):
        get_task("gym", dataset="basic_arithmetic", answer_format="json")


@pytest.mark.parametrize(
    ("completion", "parsed"),
    [
        ("The answer is 24", "24"),
        ("4 * 8 = 32", "32"),  # the last number written
        ("The final answer to this arithmetic problem is 6.", "6"),
        ("It is 1,234.", "1234"),  # thousands separators dropped
        ("x = -5.", "-5"),
        ("3.25 then 2.5", "2.5"),
        ("v2 and A1", None),  # digits inside words are not numbers
        ("no number here", None),
    ],
)
def test_the_number_format_reads_the_last_number(completion: str, parsed: str | None) -> None:
    assert parse_completion(completion, "number") == parsed


def test_the_number_format_scores_the_last_number_and_needs_a_numeric_dataset() -> None:
    number = get_task("gym", dataset="basic_arithmetic", config=EASY, size=50, eval_size=5, answer_format="number")
    p = number.train_prompt(3)
    assert p.text.endswith("Reply with only the answer.") and "<answer>" not in p.text
    reference = number.reference_completion(p)
    assert reference is not None and number.reward(p, reference) == 1.0
    wrong = str(int(p.answer) + 1)
    assert number.reward(p, f"{p.answer}") == 1.0
    assert number.reward(p, f"Not {wrong}: it is {p.answer}.") == 1.0
    assert number.reward(p, f"It is {p.answer}, or maybe {wrong}.") == 0.0  # only the last one counts
    assert number.reward(p, "I do not know.") == 0.0
    with pytest.raises(GymError, match="numeric"):
        get_task("gym", dataset="spell_backward", size=20, eval_size=2, answer_format="number")


def test_a_small_question_space_keeps_a_held_out_tenth() -> None:
    """One-digit products: about a hundred questions, all of them in a training draw of 2,000 items; a tenth of
    the space by hash is never trained on, so held-out prompts still exist and are unseen."""
    small = get_task("gym", dataset="products", config={"min_digits": 1, "max_digits": 1}, size=2000, eval_size=50)
    training = {small.train_prompt(i).meta["question"] for i in range(small.num_train)}
    held = small.eval_prompts(50)
    questions = [p.meta["question"] for p in held]
    assert 3 <= len(held) < 50 and len(set(questions)) == len(questions)
    assert not training & set(questions)
    assert small.num_train < 2000  # the held-out tenth's items left the training draw
    raw = small.train_prompt(0).meta["index"]
    assert small.prompt_by_id(f"gym/products/train/{raw}") == small.train_prompt(0)
    held_index = next(i for i in range(2000) if small._held_out(small._train[i]["question"]))
    assert small.prompt_by_id(f"gym/products/train/{held_index}") is None  # a held-out question is no training id
