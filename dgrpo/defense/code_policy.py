"""``code-policy``: an AST check of a program completion's imports and calls.

Aimed at the in-context CODE attack ("Hail to the Thief", sec. 4.2: ``+`` and ``*`` rewritten into calls to an
attacker-owned library that the victim has installed). A program is rejected when it imports a module outside
the allow-list (``import x``, ``from x import y``) or reaches for code by other means (``__import__``, ``eval``,
``exec``, ``getattr``, ... unless the program defines that name itself). A call through a name the program
never defines or imports is left alone: it raises NameError, so the program earns no reward and teaches nothing
(a garbled honest sample does this). Programs that do not parse are accepted for the same reason. Tasks whose
completions are not programs are passed.
"""

from __future__ import annotations

import ast
from collections.abc import Sequence
from typing import Annotated

from pydantic import Field

from dgrpo.config import Section
from dgrpo.defense.base import ACCEPT, Candidate, Defense, DefenseContext, Verdict
from dgrpo.defense.registry import DEFENSES
from dgrpo.tasks.code import extract_program

DEFAULT_ALLOWED = [
    "math", "cmath", "fractions", "decimal", "statistics", "itertools", "functools", "operator", "collections",
    "heapq", "bisect", "string", "re", "datetime", "random", "numbers", "typing", "dataclasses",
]  # fmt: skip
FORBIDDEN_CALLS = {"__import__", "eval", "exec", "compile", "open", "getattr", "setattr", "globals", "vars"}


class CodePolicyOptions(Section):
    allowed_modules: Annotated[
        list[str], Field(description="top-level modules a program may import (the standard library's safe part)")
    ] = Field(default_factory=lambda: list(DEFAULT_ALLOWED))


def violations(program: str, allowed: set[str]) -> list[str]:
    """What the program does outside the policy; empty when it complies (or does not parse)."""
    try:
        tree = ast.parse(program)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return []
    found: list[str] = []
    defined: set[str] = set()  # names the program binds itself (a function of its own called `compile`, say)
    modules: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                top = alias.name.split(".")[0]
                if top not in allowed:
                    found.append(f"import {alias.name}")
                modules.add(alias.asname or top)
        elif isinstance(node, ast.ImportFrom):
            top = (node.module or "").split(".")[0]
            if node.level or top not in allowed:
                found.append(f"from {'.' * node.level}{node.module or ''} import")
            defined.update(a.asname or a.name for a in node.names)
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            defined.add(node.name)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            defined.add(node.id)
        elif isinstance(node, ast.arg):
            defined.add(node.arg)
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        root = node.func
        while isinstance(root, ast.Attribute):
            root = root.value
        if isinstance(root, ast.Name):
            if root.id in FORBIDDEN_CALLS and root.id not in defined:
                found.append(f"call {root.id}")
            elif root.id in modules and root.id not in allowed and isinstance(node.func, ast.Attribute):
                found.append(f"call into {root.id}")
    return found


@DEFENSES.register("code-policy")
class CodePolicyDefense(Defense):
    name = "code-policy"
    cost = 3
    Options = CodePolicyOptions

    def check(self, ctx: DefenseContext, candidates: Sequence[Candidate]) -> list[Verdict]:
        if ctx.task.reasoning_format != "program":
            return [ACCEPT] * len(candidates)
        allowed = set(self.options.allowed_modules)
        verdicts: list[Verdict] = []
        for c in candidates:
            program = extract_program(c.text)
            found = violations(program, allowed) if program is not None else []
            verdicts.append(self.reject(found[0].split()[0], float(len(found))) if found else ACCEPT)
        return verdicts
