"""The run manifest's request/response stream (``docs/protocol.md``, "Run manifest", "Stream"): the bytes a
joiner and a serving node exchange. The protocol id names no run: a joiner does not know the run yet.

Request: the 5 bytes ``"DGM1" || 0x01``. Answer: the document's length as a big-endian uint32, then the
document (:meth:`dgrpo.protocol.manifest.SignedManifest.document`), at most
:data:`~dgrpo.protocol.manifest.MAX_MANIFEST_BYTES`; the server then closes its side. Anything else is
answered with a reset.
"""

from __future__ import annotations

from typing import Final

from dgrpo.protocol.manifest import MAX_MANIFEST_BYTES

MANIFEST_PROTOCOL: Final = "/dgrpo/manifest/1.0.0"
REQUEST: Final = b"DGM1\x01"
LENGTH_BYTES: Final = 4
FETCH_REASONS = ("unavailable", "timeout")  # besides the document's reasons (the stream failed, or was too slow)
SERVE_REASONS = ("bad_request", "busy")  # what a server counts of a requesting peer


def encode_answer(document: bytes) -> bytes:
    if len(document) > MAX_MANIFEST_BYTES:
        raise ValueError(f"a manifest document of {len(document)} bytes exceeds {MAX_MANIFEST_BYTES}")
    return len(document).to_bytes(LENGTH_BYTES, "big") + document


def answer_length(prefix: bytes) -> int | None:
    """The declared document length, None when it is beyond the bound (read no further: ``oversize``)."""
    length = int.from_bytes(prefix, "big")
    return length if length <= MAX_MANIFEST_BYTES else None
