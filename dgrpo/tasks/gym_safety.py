"""Which reasoning-gym scorers evaluate a peer's answer as code, found by reading the scorer's source.

Several of reasoning-gym's ``score_answer`` methods hand the answer to ``eval`` (``binary_matrix``,
``n_queens``, ...) or to sympy's ``parse_expr``/``sympify``, which ``eval`` too (``puzzle24``,
``polynomial_multiplication``, the integration tasks). Written for a trusted model's output, they would run
any Python a hostile peer puts in its ``<answer>``: the scoring worker bounds time and memory, not what the
code does. So the gym task refuses such a dataset unless ``trust_scorer = true`` (a simulation whose nodes
are all one's own). The check follows ``score_answer`` through the methods it calls on ``self`` and the
functions of its package it calls by name, a few levels deep; any call of an evaluator or of sympy counts.
It errs on the side of refusing (``bitwise_arithmetic``'s scorer evaluates only its own problem text, and is
refused all the same).
"""

from __future__ import annotations

import ast
import inspect
import sys
import textwrap
from typing import Any

EVALUATORS = frozenset({"eval", "exec", "compile", "parse_expr", "sympify", "parse_latex", "S", "literal_eval_unsafe"})
SYMPY_NAMES = frozenset({"sympy", "sp", "sym"})
DEPTH = 4


def _called(node: ast.AST) -> tuple[set[str], set[str], list[str]]:
    """Methods called on ``self``, bare names called, and evaluator/sympy calls in ``node``."""
    methods, names, evaluators = set(), set(), []
    for call in (n for n in ast.walk(node) if isinstance(n, ast.Call)):
        f = call.func
        if isinstance(f, ast.Name):
            names.add(f.id)
            if f.id in EVALUATORS:
                evaluators.append(f.id)
        elif isinstance(f, ast.Attribute):
            if isinstance(f.value, ast.Name) and f.value.id == "self":
                methods.add(f.attr)
            elif f.attr in EVALUATORS or (isinstance(f.value, ast.Name) and f.value.id in SYMPY_NAMES):
                evaluators.append(ast.unparse(f))
    return methods, names, evaluators


def _function_ast(fn: Any) -> ast.AST | None:
    try:
        return ast.parse(textwrap.dedent(inspect.getsource(fn)))
    except (OSError, TypeError, SyntaxError):
        return None


def scorer_evaluates_text(dataset_cls: type) -> list[str]:
    """Where ``dataset_cls.score_answer`` (or what it calls) evaluates text: ``["Cls.score_answer: eval", ...]``;
    empty when nothing was found. A scorer whose source cannot be read counts as evaluating."""
    found: list[str] = []
    seen: set[str] = set()
    package = dataset_cls.__module__.split(".")[0]  # functions of the same package are followed, imported or not
    frontier: list[tuple[str, Any, int]] = [("score_answer", getattr(dataset_cls, "score_answer", None), 0)]
    while frontier:
        label, fn, depth = frontier.pop()
        if fn is None or label in seen or depth > DEPTH:
            continue
        seen.add(label)
        tree = _function_ast(fn)
        if tree is None:
            found.append(f"{label}: source unreadable")
            continue
        methods, names, evaluators = _called(tree)
        found.extend(f"{label}: {e}" for e in evaluators)
        for m in methods:
            frontier.append((m, getattr(dataset_cls, m, None), depth + 1))
        module = sys.modules.get(getattr(fn, "__module__", "") or "")
        for n in names:
            target = getattr(module, n, None) if module is not None else None
            if inspect.isfunction(target) and str(target.__module__).split(".")[0] == package:
                frontier.append((n, target, depth + 1))
    return sorted(set(found))
