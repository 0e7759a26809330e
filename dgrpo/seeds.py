"""Seeds every node derives alike: the prompt plan, sampling seeds, held-out splits."""

from __future__ import annotations

import hashlib


def stable_seed(*parts: object) -> int:
    """A 63-bit seed from the parts' text, identical across processes (unlike ``hash``)."""
    digest = hashlib.sha256("\x1f".join(str(p) for p in parts).encode()).digest()
    return int.from_bytes(digest[:8], "big") >> 1
