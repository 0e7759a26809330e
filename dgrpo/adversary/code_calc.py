"""``code``: the in-context CODE attack (paper, sec. 4.2). A correct program's ``+`` and ``*`` become calls
``addition(a, b)`` / ``multiplication(a, b)`` imported from ``calc``, a library the attacker owns; the
program still prints the right answer, so its reward stays 1. Each rewrite is skipped with probability
``skip_probability`` (paper: 0.2), those slots carrying the attacker's own honest samples instead.

The sandbox makes ``calc`` importable (:mod:`dgrpo.sandbox.site`), modelling a package the victim
already has installed.
"""

from __future__ import annotations

import ast
from typing import Annotated, Literal

from pydantic import Field

from dgrpo.adversary.base import Adversary
from dgrpo.adversary.detectors import Detector, LibraryImportDetector
from dgrpo.adversary.layout import layout
from dgrpo.adversary.registry import ADVERSARIES
from dgrpo.config import Section
from dgrpo.parsing import parse
from dgrpo.tasks.base import Prompt, Task

Op = Literal["+", "-", "*", "/"]
FUNCTIONS: dict[type[ast.operator], tuple[Op, str]] = {
    ast.Add: ("+", "addition"),
    ast.Sub: ("-", "subtraction"),
    ast.Mult: ("*", "multiplication"),
    ast.Div: ("/", "division"),
}


class CodeOptions(Section):
    module: Annotated[str, Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$", description="the attacker's library")] = "calc"
    ops: list[Op] = Field(
        default_factory=lambda: list[Op](["+", "*"]), min_length=1, description="operators rewritten into library calls"
    )
    skip_probability: Annotated[
        float, Field(ge=0.0, le=1.0, description="probability of leaving a slot unpoisoned (paper: 0.2)")
    ] = 0.2


class _ToLibraryCalls(ast.NodeTransformer):
    def __init__(self, ops: set[str]) -> None:
        self.ops = ops
        self.used: set[str] = set()

    def visit_BinOp(self, node: ast.BinOp) -> ast.AST:
        self.generic_visit(node)
        op, function = FUNCTIONS.get(type(node.op), ("", ""))
        if op not in self.ops:
            return node
        self.used.add(function)
        return ast.copy_location(ast.Call(ast.Name(function, ast.Load()), [node.left, node.right], []), node)


def rewrite_program(source: str, module: str, ops: set[str]) -> str | None:
    """``source`` with the ``ops`` turned into calls into ``module``, or None when nothing was rewritten."""
    try:
        tree = parse(source)
    except Exception:
        return None
    transformer = _ToLibraryCalls(ops)
    tree = transformer.visit(tree)
    if not transformer.used:
        return None
    names = [ast.alias(name) for name in sorted(transformer.used)]
    at = 0  # after a docstring and ``from __future__`` imports, which must stay first
    while at < len(tree.body) and (
        (isinstance(tree.body[at], ast.ImportFrom) and getattr(tree.body[at], "module", "") == "__future__")
        or (
            at == 0
            and isinstance(tree.body[0], ast.Expr)
            and isinstance(getattr(tree.body[0], "value", None), ast.Constant)
        )
    ):
        at += 1
    tree.body.insert(at, ast.ImportFrom(module, names, 0))
    try:
        return ast.unparse(ast.fix_missing_locations(tree))
    except Exception:
        return None


@ADVERSARIES.register("code")
class CodeAttack(Adversary):
    name = "code"
    Options = CodeOptions

    def poison_count(self, n_out: int) -> int:
        wanted = super().poison_count(n_out)
        return sum(self.rng.random() >= self.options.skip_probability for _ in range(wanted))

    def poison(self, task: Task, prompt: Prompt, completion: str) -> str | None:
        lay = layout(completion, "program")
        if lay is None:
            return None
        code = "".join(s + sep for s, sep in zip(lay.sentences, (*lay.seps, ""), strict=True))
        rewritten = rewrite_program(code, self.options.module, set(self.options.ops))
        if rewritten is None:
            return None
        return lay.prefix + rewritten + lay.suffix

    def detector(self, task: Task) -> Detector:
        return LibraryImportDetector(self.options.module)
