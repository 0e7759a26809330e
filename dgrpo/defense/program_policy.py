"""An allow-list of what a program may import, read, call and reach through attributes, checked on its AST.

The in-context CODE attack ("Hail to the Thief", sec. 4.2) makes a program call into an attacker-owned module
that the victim has installed. A deny-list of imports and a few builtins (``__import__``, ``eval``, ...) is
tuned to that one route; Python has many others to the same module: ``importlib.import_module('calc')``,
``__builtins__.__dict__['__import__']``, ``().__class__.__base__.__subclasses__()`` down to an importer,
``g = getattr`` then ``g(...)``, ``open('calc.py').read()`` into ``exec``, ``breakpoint()`` (which imports
whatever ``PYTHONBREAKPOINT`` names), a generator's ``gi_frame.f_builtins``, ``typing.get_type_hints`` on a
string annotation (it evaluates it), ``random._os`` (a module another one imported). So this check says what
is allowed and rejects everything else:

- imports: only modules whose top-level package is allowed, by name (no ``import *``, which hides what it binds,
  and no relative imports);
- names read: those the program binds itself (definitions, assignments, parameters, loop, comprehension,
  ``with``, ``except`` and ``match`` targets, its allowed imports), the allowed builtins, and ``__name__``.
  An unknown name would usually raise NameError at run time; it is rejected all the same, because a package
  installed on the victim can put names into the builtins at start-up (a ``.pth`` file runs code), and on
  the tasks' reference programs this costs nothing.
  ``type`` may only be called with one argument (three build a class);
- names bound: not a builtin the allow-list leaves out (``if 0: eval = None`` would make a later ``eval(...)``
  look like the program's own function while it runs the real one), and no dunder outside a class body;
- attributes: never a dunder (``__class__``, ``__globals__``, ``__dict__``, ...) but for ``super().__init__``
  and the strings ``__name__``, ``__qualname__`` and ``__doc__``, nor a frame, code or traceback field
  (``gi_frame``, ``f_globals``, ``tb_frame``, ``co_code``, ...). On an allowed module, only public names that
  exist there and are neither modules it merely imported (``typing.sys``; a submodule such as
  ``collections.abc`` is fine) nor one of :data:`REFLECTIVE`, which turn strings into attribute access or
  code. Any other attribute is a method or field of a value (``x.append``). ``match`` class patterns'
  keyword attributes follow the same rule.

Strings are not code here: ``"{0.__class__}".format(x)`` reads attributes, but only into a string.
"""

from __future__ import annotations

import ast
import builtins
import functools
import importlib
import re
import types
from collections.abc import Iterable
from dataclasses import dataclass

from dgrpo.parsing import parse

DEFAULT_MODULES: tuple[str, ...] = (
    "math", "cmath", "fractions", "decimal", "statistics", "itertools", "functools", "operator", "collections",
    "heapq", "bisect", "string", "re", "datetime", "random", "numbers", "typing", "dataclasses", "hashlib",
    "__future__",
)  # fmt: skip
DEFAULT_BUILTINS: tuple[str, ...] = (
    # values and conversions
    "abs", "all", "any", "ascii", "bin", "bool", "bytearray", "bytes", "callable", "chr", "complex", "dict",
    "divmod", "enumerate", "filter", "float", "format", "frozenset", "hash", "hex", "id", "int", "isinstance",
    "issubclass", "iter", "len", "list", "map", "max", "min", "next", "object", "oct", "ord", "pow", "print",
    "range", "repr", "reversed", "round", "set", "slice", "sorted", "str", "sum", "tuple", "type", "zip",
    # classes
    "classmethod", "property", "staticmethod", "super",
    # exceptions a program raises or catches
    "ArithmeticError", "AssertionError", "AttributeError", "BaseException", "Exception", "IndexError",
    "KeyError", "LookupError", "NotImplementedError", "OverflowError", "RuntimeError", "StopIteration",
    "TypeError", "ValueError", "ZeroDivisionError", "NotImplemented", "Ellipsis",
)  # fmt: skip
# Allowed modules' names that turn a string into attribute access or code.
REFLECTIVE: frozenset[tuple[str, str]] = frozenset(
    {
        ("operator", "attrgetter"),  # attrgetter('__class__.__base__')
        ("operator", "methodcaller"),
        ("typing", "get_type_hints"),  # evaluates string annotations
        ("typing", "ForwardRef"),
        ("string", "Formatter"),  # Formatter().get_field('0.__globals__', ...) returns the object
    }
)
# Generator, coroutine, async generator, traceback and code objects' fields, and a frame's own.
FRAME_FIELD_RE = re.compile(r"(?:gi|cr|ag|tb|co)_[a-z_]+|f_(?:back|builtins|code|globals|locals|lasti|lineno|trace\w*)")
ALWAYS_READABLE = frozenset({"__name__"})
NAME_ATTRIBUTES = frozenset({"__name__", "__qualname__", "__doc__"})  # strings: ``type(x).__name__``


def is_dunder(name: str) -> bool:
    return len(name) > 4 and name.startswith("__") and name.endswith("__")


@dataclass(frozen=True)
class Policy:
    modules: frozenset[str]
    builtins: frozenset[str]

    @functools.cached_property
    def withheld(self) -> frozenset[str]:
        """The builtins left out: binding one of these names is a violation (see the module docstring)."""
        return frozenset(dir(builtins)) - self.builtins - ALWAYS_READABLE


def _module(name: str) -> types.ModuleType | None:
    """The allowed module ``name`` as this process has it (standard library), or None where it has none."""
    try:
        return importlib.import_module(name)
    except Exception:  # an operator's allow-list may name a module this node lacks
        return None


def _member(module: types.ModuleType, name: str) -> tuple[bool, object]:
    """Whether ``module`` defines ``name``, and its value: read from its namespace, so that no module-level
    ``__getattr__`` runs on a name a peer chose."""
    namespace = vars(module)
    return name in namespace, namespace.get(name)


def module_attribute(module: str, attribute: str) -> str | None:
    """Why ``module.attribute`` is not allowed, or None when it is: public, present, not a module ``module``
    merely imported, not reflective. Returns the attribute's own module name for a submodule, as ``module``
    for the next link of a chain (``collections.abc.Callable``)."""
    if attribute.startswith("_"):
        return f"attribute {module}.{attribute}"
    if (module.split(".")[0], attribute) in REFLECTIVE:
        return f"reflective {module}.{attribute}"
    loaded = _module(module)
    if loaded is None:
        return None  # nothing to look at: the name's syntax is all that can be checked
    present, value = _member(loaded, attribute)
    if not present:
        return f"attribute {module}.{attribute}"
    if isinstance(value, types.ModuleType) and value.__name__ != f"{module}.{attribute}":
        return f"module {module}.{attribute}"
    return None


class _Bindings(ast.NodeVisitor):
    """Every name the program binds, where it is, and what its allowed imports bind: module aliases to module
    names (``import math as m`` -> m: math)."""

    def __init__(self) -> None:
        self.names: set[str] = set()
        self.modules: dict[str, str] = {}
        self.bound_at: list[tuple[str, bool]] = []  # (name, directly inside a class body)

    def bind(self, name: str | None, in_class: bool = False) -> None:
        if name:
            self.names.add(name)
            self.bound_at.append((name, in_class))


def bindings(tree: ast.AST) -> _Bindings:
    b = _Bindings()
    in_class: set[int] = set()  # statements directly in a class body, and the names their assignments bind
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef):
            for statement in node.body:
                in_class.add(id(statement))
                if isinstance(statement, ast.Assign | ast.AnnAssign):
                    targets = statement.targets if isinstance(statement, ast.Assign) else [statement.target]
                    in_class.update(id(t) for t in targets if isinstance(t, ast.Name))
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            b.bind(node.name, id(node) in in_class)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store | ast.Del):
            b.bind(node.id, id(node) in in_class)
        elif isinstance(node, ast.arg):
            b.bind(node.arg)
        elif isinstance(node, ast.ExceptHandler | ast.MatchAs | ast.MatchStar):
            b.bind(node.name)
        elif isinstance(node, ast.MatchMapping):
            b.bind(node.rest)
        elif isinstance(node, ast.Global | ast.Nonlocal):
            for name in node.names:
                b.bind(name)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                bound = alias.asname or alias.name.split(".")[0]
                b.bind(bound)
                b.modules[bound] = alias.name if alias.asname else alias.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom):
            for alias in node.names:
                b.bind(alias.asname or alias.name)
                loaded = _module(node.module) if node.module and not node.level else None
                if loaded is not None and isinstance(_member(loaded, alias.name)[1], types.ModuleType):
                    b.modules[alias.asname or alias.name] = f"{node.module}.{alias.name}"
    return b


def _imports(node: ast.Import | ast.ImportFrom, policy: Policy) -> Iterable[str]:
    if isinstance(node, ast.Import):
        for alias in node.names:
            if alias.name.split(".")[0] not in policy.modules:
                yield f"import {alias.name}"
        return
    module = node.module or ""
    if node.level or module.split(".")[0] not in policy.modules:
        yield f"from {'.' * node.level}{module} import"
        return
    for alias in node.names:
        if alias.name == "*":
            yield f"from {module} import *"
            continue
        why = module_attribute(module, alias.name)
        if why is not None:
            yield why


def _attribute_chain(node: ast.Attribute) -> tuple[ast.expr, list[str]]:
    """``a.b.c`` -> (the node ``a``, ["b", "c"])."""
    names: list[str] = []
    root: ast.expr = node
    while isinstance(root, ast.Attribute):
        names.append(root.attr)
        root = root.value
    return root, names[::-1]


def _attribute_name(name: str) -> str | None:
    if is_dunder(name) and name not in NAME_ATTRIBUTES:
        return f"attribute {name}"
    if FRAME_FIELD_RE.fullmatch(name):
        return f"attribute {name}"
    return None


@functools.lru_cache(maxsize=16)
def policy_of(modules: frozenset[str], allowed_builtins: frozenset[str]) -> Policy:
    return Policy(modules, allowed_builtins)


def violations(
    program: str, modules: Iterable[str] = DEFAULT_MODULES, allowed_builtins: Iterable[str] = DEFAULT_BUILTINS
) -> list[str]:
    """What ``program`` does outside the allow-lists (top-level ``modules``, ``allowed_builtins``), in the order
    found; empty when it complies. A program that does not parse is not checked (it cannot run: it earns
    nothing and teaches nothing)."""
    policy = policy_of(frozenset(modules), frozenset(allowed_builtins))
    try:
        tree = parse(program)
    except Exception:  # SyntaxError, ValueError (NUL bytes), RecursionError, MemoryError: hostile text
        return []
    b = bindings(tree)
    found: list[str] = []
    for name, in_class in b.bound_at:
        if is_dunder(name):
            if not in_class:
                found.append(f"binds {name}")
        elif name in policy.withheld:
            found.append(f"binds builtin {name}")
    called = {id(n.func): n for n in ast.walk(tree) if isinstance(n, ast.Call)}
    # The attribute chains on a module alias are checked as one (``collections.abc.Callable``).
    checked: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import | ast.ImportFrom):
            found.extend(_imports(node, policy))
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load):
            found.extend(_name(node, b, policy, called.get(id(node))))
        elif isinstance(node, ast.Attribute) and id(node) not in checked:
            root, chain = _attribute_chain(node)
            inner: ast.expr = node
            while isinstance(inner, ast.Attribute):
                checked.add(id(inner))
                inner = inner.value
            found.extend(_attributes(root, chain, b, policy, called.get(id(node))))
        elif isinstance(node, ast.MatchClass):
            found.extend(why for why in map(_attribute_name, node.kwd_attrs) if why is not None)
    return found


def _name(node: ast.Name, b: _Bindings, policy: Policy, call: ast.Call | None) -> list[str]:
    name = node.id
    if name in ALWAYS_READABLE:
        return []
    if is_dunder(name):  # __builtins__, __loader__, __spec__, __import__, even where a class binds one
        return [f"call {name}" if call is not None else f"name {name}"]
    if name == "type" and name not in b.names and (call is None or len(call.args) != 1 or call.keywords):
        return ["type with other than one argument"]
    if name in b.names or name in policy.builtins:
        return []
    return [f"call {name}" if call is not None else f"name {name}"]


def _attributes(root: ast.expr, chain: list[str], b: _Bindings, policy: Policy, call: ast.Call | None) -> list[str]:
    found = [why for why in map(_attribute_name, chain) if why is not None]
    if found:
        # ``super().__init__(...)``: a class calling its base's constructor, the one dunder honest code needs.
        is_super = isinstance(root, ast.Call) and isinstance(root.func, ast.Name) and root.func.id == "super"
        if is_super and chain == ["__init__"] and call is not None:
            return []
        return found
    if isinstance(root, ast.Name) and root.id in b.modules:
        module = b.modules[root.id]
        if module.split(".")[0] not in policy.modules:
            return [f"call into {root.id}" if call is not None else f"attribute of {root.id}"]
        for attribute in chain:
            why = module_attribute(module, attribute)
            if why is not None:
                return [why]
            loaded = _module(module)
            value = _member(loaded, attribute)[1] if loaded is not None else None
            if not isinstance(value, types.ModuleType):
                break  # past the modules: a value's attributes (``math.pi.real``)
            module = value.__name__
    return []
