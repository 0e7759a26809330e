"""``code-policy``: a program completion may only import, read, call and reach what an allow-list names.

Aimed at the in-context CODE attack ("Hail to the Thief", sec. 4.2: ``+`` and ``*`` rewritten into calls to an
attacker-owned library that the victim has installed). Issue 12 found the first version, a deny-list of imports
and a few builtins, tuned to that attack's one route: a program reached the attacker's module by another and
earned reward 1. The rules are now an allow-list, :mod:`dgrpo.defense.program_policy`: allowed modules (by
top-level name), allowed builtins, the program's own names, public non-module attributes of allowed modules
and methods of values; no dunder attributes, frame fields, ``import *`` or shadowed builtins.

The program checked is the one the task runs for the completion, without the task's own test code
(:meth:`~dgrpo.tasks.code.SandboxedTask.submitted_program`: HumanEval's prompt and completion together, so the
prompt's imports and parameters are in scope). Programs that do not parse are accepted (they cannot run: no
reward, nothing taught). Tasks whose completions are not programs are passed.

False positives on honest programs, measured with the defaults: none among the reference programs of every
one of ``arith-code``'s 1,077,904 prompts (training and held out; a test walks a sample), and 1 of HumanEval's
164 canonical solutions (HumanEval/160 builds an expression string and calls ``eval`` on it: exactly what the
policy must refuse). On the tiny model's own samples (``dgrpo simulate code-vertical``, 20 rounds, reputation
off) it rejected 8 of 1,920 honest completions of other nodes (FPR 0.004; the deny-list: 0) with stop rate
1.000 (both): all calls to a misspelt name (``primt(199*51)``), which would raise NameError and earn nothing.
Such names are rejected all the same because a name the program never binds may still exist when it runs: a
package installed on the victim can add it to the builtins from a ``.pth`` file at start-up.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated

from pydantic import Field

from dgrpo.config import Section
from dgrpo.defense.base import ACCEPT, Candidate, Defense, DefenseContext, Verdict
from dgrpo.defense.program_policy import DEFAULT_BUILTINS, DEFAULT_MODULES, violations
from dgrpo.defense.registry import DEFENSES
from dgrpo.tasks.code import SandboxedTask, extract_program

__all__ = ["CodePolicyDefense", "CodePolicyOptions", "violations"]


class CodePolicyOptions(Section):
    allowed_modules: Annotated[
        list[str], Field(description="top-level modules a program may import (the standard library's safe part)")
    ] = Field(default_factory=lambda: list(DEFAULT_MODULES))
    allowed_builtins: Annotated[
        list[str],
        Field(description="builtins a program may use; every other builtin (eval, open, getattr, ...) is refused"),
    ] = Field(default_factory=lambda: list(DEFAULT_BUILTINS))
    extra_builtins: Annotated[
        list[str], Field(description="builtins allowed on top of allowed_builtins (keeps the defaults)")
    ] = Field(default_factory=list)


@DEFENSES.register("code-policy")
class CodePolicyDefense(Defense):
    name = "code-policy"
    cost = 3
    Options = CodePolicyOptions

    def check(self, ctx: DefenseContext, candidates: Sequence[Candidate]) -> list[Verdict]:
        if ctx.task.reasoning_format != "program":
            return [ACCEPT] * len(candidates)
        modules = self.options.allowed_modules
        allowed = [*self.options.allowed_builtins, *self.options.extra_builtins]
        verdicts: list[Verdict] = []
        for c in candidates:
            program = (
                ctx.task.submitted_program(c.prompt, c.text)
                if isinstance(ctx.task, SandboxedTask)
                else extract_program(c.text)
            )
            found = violations(program, modules, allowed) if program is not None else []
            verdicts.append(self.reject(found[0].split()[0], float(len(found))) if found else ACCEPT)
        return verdicts
