"""``ast.parse`` behind one lock. CPython 3.11's AST constructor keeps its recursion depth in per-interpreter
state that concurrent parses corrupt ("SystemError: AST constructor recursion depth mismatch", CPython
gh-106905): the nodes of a simulation check claims and programs in parallel threads, so every parse of
untrusted text goes through here."""

from __future__ import annotations

import ast
import threading
from typing import Any

PARSE_LOCK = threading.Lock()


def parse(source: str, mode: str = "exec") -> Any:
    """``ast.parse(source, mode=mode)``, one at a time per process."""
    with PARSE_LOCK:
        return ast.parse(source, mode=mode)
