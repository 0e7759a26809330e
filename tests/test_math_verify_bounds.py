"""Peers' math answers against math-verify and sympy: bounded in time and memory, fuzzed with hostile text.

Two layers are checked: the GSM8K reward as a node runs it (the plain-arithmetic filter, then the bounded
worker), and the bounded worker alone with the filter bypassed, so that its own bound is what holds.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dgrpo.tasks.base import Prompt
from dgrpo.tasks.gsm8k import Gsm8kTask
from dgrpo.tasks.math_verifier import BoundedVerifier

GOLD = Prompt(id="gsm8k/test/x", text="", answer="72")
TIMEOUT = 0.5
# A verdict may take the time limit, plus a worker restart (it imports sympy) paid by the next answer.
BOUND = TIMEOUT + 10.0

LATEX_PIECES = [r"\frac", r"\sum", r"\prod", r"\int", r"\binom", r"\sqrt", r"\boxed", r"\left(", r"\right)"]
PIECES = [*LATEX_PIECES, "^", "_", "{", "}", "(", ")", "[", "]", "9", "99999", "x", "!", "**", "*", "/", "=", " "]


def _nested(opening: str, closing: str) -> st.SearchStrategy[str]:
    return st.integers(1, 400).map(lambda n: opening * n + "9" + closing * n)


HOSTILE = st.one_of(
    # huge exponents and factorials, in LaTeX and in Python spelling
    st.lists(st.integers(2, 99999), min_size=2, max_size=6).map(lambda xs: "^{".join(map(str, xs)) + "}" * len(xs)),
    st.lists(st.integers(2, 99999), min_size=2, max_size=6).map(lambda xs: "**".join(map(str, xs))),
    st.integers(100, 10**9).map(lambda n: f"\\boxed{{{n}!}}"),
    st.integers(2, 10**6).map(lambda n: f"{n}!!!"),
    # deep nesting
    _nested("(", ")"),
    _nested("{", "}"),
    _nested("[", "]"),
    _nested(r"\frac{", "}{2}"),
    _nested(r"\sqrt{", "}"),
    _nested(r"\left(", r"\right)"),
    # long inputs
    st.text(alphabet="0123456789+-*/^!(){}[]\\=. x", min_size=200, max_size=5000),
    st.integers(200, 20000).map(lambda n: "9" * n),
    # free mixtures of LaTeX and operators
    st.lists(st.sampled_from(PIECES), min_size=1, max_size=200).map("".join),
    st.text(max_size=300),
)


@pytest.fixture(scope="module")
def task(tmp_path_factory: pytest.TempPathFactory) -> Gsm8kTask:
    path: Path = tmp_path_factory.mktemp("gsm8k") / "train.jsonl"
    path.write_text('{"question": "q", "answer": "#### 72"}\n')
    return Gsm8kTask(data=str(path))


@pytest.fixture(scope="module")
def verifier() -> BoundedVerifier:
    v = BoundedVerifier(timeout_seconds=TIMEOUT)
    v.start()
    return v


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(answer=HOSTILE)
def test_hostile_answers_get_a_verdict_within_the_bound_through_the_reward(task: Gsm8kTask, answer: str) -> None:
    started = time.monotonic()
    reward = task.reward(GOLD, f"<think>x</think><answer>{answer}</answer>")
    assert reward in (0.0, 1.0)
    assert time.monotonic() - started < task.verifier.timeout_seconds + 10.0


@pytest.mark.slow
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(answer=HOSTILE)
def test_hostile_answers_get_a_verdict_within_the_bound_without_the_filter(
    verifier: BoundedVerifier, answer: str
) -> None:
    started = time.monotonic()
    assert verifier.verify(answer, "72") in (True, False)
    assert time.monotonic() - started < BOUND


def test_an_answer_that_would_run_forever_is_cut_off_and_the_worker_comes_back() -> None:
    v = BoundedVerifier(timeout_seconds=TIMEOUT)
    v.start()
    started = time.monotonic()
    assert v.verify("9**9**9", "72") is False  # sympy evaluates the tower: minutes, if allowed
    assert time.monotonic() - started < TIMEOUT + 1.0
    assert v.stats.timeouts == 1
    assert v.verify("72", "72") is True  # a fresh worker
    assert v.stats.restarts == 1
    assert v.verify("9**9**9", "72") is False  # cached: the timeout is not paid twice
    assert v.stats.timeouts == 1
    v.close()


def test_the_worker_runs_under_a_memory_cap() -> None:
    v = BoundedVerifier(timeout_seconds=TIMEOUT, memory_bytes=768 << 20)
    v.start()
    pid = v._worker.pid
    assert pid is not None
    limits = Path(f"/proc/{pid}/limits").read_text()
    line = next(row for row in limits.splitlines() if row.startswith("Max address space"))
    assert line.split()[3:5] == [str(768 << 20), str(768 << 20)]
    v.close()


def test_honest_answers_are_judged_as_before(task: Gsm8kTask) -> None:
    answers = ["72", "\\boxed{72}", "72 dollars", "$72", "72.0", "71", "\\frac{144}{2}", "seventy-two"]
    rewards = task.rewards(GOLD, [f"<think>t</think><answer>{a}</answer>" for a in answers])
    assert rewards == [1.0, 1.0, 1.0, 1.0, 1.0, 0.0, 1.0, 0.0]
