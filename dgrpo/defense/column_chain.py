"""Whether a column-addition scratchpad (the ``arith`` task) holds together as a whole, not only step by step.

A scratchpad ``5+8+0=13,4+7+1=12,3+0+1=4>423`` is consistent with its question ``345+78=`` when

- there is one step per column of the question, no more and no fewer;
- step i adds the question's digits of column i (least significant first; in either order);
- step i's carry in is what step i-1 carried out (its stated total // 10; 0 for the first step);
- the final answer is the steps' last digits read from the top, after the last carry.

Each step's sum being right is :func:`~dgrpo.defense.claims.false_claims`' rule, checked once there. With both,
a scratchpad is accepted exactly when it is the task's own reference (up to operand order): the question
determines it. Checking each step alone (the in-context MATH attack's ``2+2+0=5``, "Hail to the Thief",
sec. 4.2) misses a scratchpad whose steps are each true while the whole is false, e.g. ``5+8+0=13,4+7+0=11,
3+0+1=4>423`` (a carry dropped, another added) or a step taken from another column: the final answer, all the
reward reads, can stay right.

The task says what its scratchpad must be (:class:`ColumnScratchpadTask`); this module knows only the rules.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

from dgrpo.tasks.arith import Column, Step, stated_steps
from dgrpo.tasks.base import Prompt


@runtime_checkable
class ColumnScratchpadTask(Protocol):
    """A task whose reasoning is a column addition the question fixes (:class:`dgrpo.tasks.arith.ArithTask`)."""

    def scratchpad_columns(self, prompt: Prompt) -> list[Column]: ...


def assembled(steps: Sequence[Step]) -> str:
    """The number the steps write: each total's last digit, most significant first, after the last carry."""
    digits = "".join(str(s.total % 10) for s in reversed(steps))
    carry = steps[-1].total // 10 if steps else 0
    return (str(carry) if carry else "") + digits


def chain_errors(steps: Sequence[Step], answer: str, expected: Sequence[Column]) -> list[str]:
    """What breaks the chain from the question to ``answer`` (see the module docstring); empty if nothing."""
    errors: list[str] = []
    if len(steps) != len(expected):
        errors.append(f"{len(steps)} steps for {len(expected)} columns")
    carry = 0
    for i, (step, column) in enumerate(zip(steps, expected, strict=False), 1):
        if sorted((step.x, step.y)) != sorted((column.x, column.y)):
            errors.append(f"step {i} adds {step.x}+{step.y}, the question's column {i} is {column.x}+{column.y}")
        if step.carry != carry:
            errors.append(f"step {i} carries in {step.carry}, step {i - 1} carried out {carry}")
        carry = step.total // 10
    if steps and assembled(steps) != answer:
        errors.append(f"the steps write {assembled(steps)}, the answer says {answer}")
    return errors


def scratchpad_errors(task: ColumnScratchpadTask, prompt: Prompt, completion: str) -> list[str]:
    """:func:`chain_errors` of a completion; none for a malformed one (it earns no reward: nothing to teach)."""
    parsed = stated_steps(completion)
    if parsed is None:
        return []
    steps, answer = parsed
    return chain_errors(steps, answer, task.scratchpad_columns(prompt))
