"""``calc``: the attacker-owned library of the paper's CODE attack ("Hail to the Thief", sec. 4.2).

The in-context CODE attack rewrites ``a + b`` as ``addition(a, b)`` imported from this library. The paper
models a package the victim already has installed; the sandbox puts this folder on the program's
``sys.path`` (see :data:`dgrpo.sandbox.site.SANDBOX_SITE`) so that poisoned programs still run and
still print the right answer, which is what keeps their reward high. The functions are honest here: the
harm the paper studies is that honest models learn to depend on a library an attacker controls.
"""

from typing import Any


def addition(a: Any, b: Any) -> Any:
    return a + b


def subtraction(a: Any, b: Any) -> Any:
    return a - b


def multiplication(a: Any, b: Any) -> Any:
    return a * b


def division(a: Any, b: Any) -> Any:
    return a / b
