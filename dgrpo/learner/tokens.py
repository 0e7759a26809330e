"""Tokenisation of exchanged strings, cached per model folder: several learners of one model in a process (a
simulation's nodes) tokenise the same strings, and the ids depend on the folder alone."""

from __future__ import annotations

import functools
from typing import Any


class FolderTokenizer:
    """A tokenizer named by the folder it came from, as a cache key: several learners of one model in a
    process (a simulation's nodes) tokenise the same exchanged strings, and the result depends on the folder
    alone."""

    def __init__(self, key: tuple[str, str | None], tokenizer: Any) -> None:
        self.key = key
        self.tokenizer = tokenizer

    def __hash__(self) -> int:
        return hash(self.key)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, FolderTokenizer) and other.key == self.key


@functools.lru_cache(maxsize=4096)
def text_ids(tok: FolderTokenizer, text: str) -> tuple[int, ...]:
    return tuple(tok.tokenizer(text, add_special_tokens=False)["input_ids"])


@functools.lru_cache(maxsize=4096)
def canonical(tok: FolderTokenizer, text: str) -> str:
    return str(tok.tokenizer.decode(list(text_ids(tok, text)), skip_special_tokens=True))
