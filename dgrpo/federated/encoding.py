"""A sparse update as bytes: a 10-byte header, the positions, then the values.

Positions are written in whichever form is smaller: ``k`` little-endian uint32 indices (4k bytes) or a
bitmap of the ``n`` entries (ceil(n / 8) bytes; smaller once more than n/32 entries are sent). Values are
``k`` little-endian float32 or float16. Header: magic ``b"FG"``, version 1, position format (0 indices, 1
bitmap, 2 dense), value dtype (0 float32, 1 float16), one zero byte, ``n`` as uint32. A dense update is the third
position format (2, dense) with no positions at all: 4n + 10 bytes in float32.

Decoding is strict (hostile input gets a verdict): every length, count and index is checked, and a
malformed payload raises :class:`MalformedUpdate`, which the receiver turns into a counted rejection.
"""

from __future__ import annotations

import struct
from typing import Any

import numpy as np
import torch

from dgrpo.federated.sparse import SparseUpdate

MAGIC = b"FG"
VERSION = 1
HEADER = struct.Struct("<2sBBBxI")
INDEX_FORMAT, BITMAP_FORMAT, DENSE_FORMAT = 0, 1, 2
DTYPE_CODES = {"float32": 0, "float16": 1}
NUMPY: dict[int, np.dtype[Any]] = {0: np.dtype("<f4"), 1: np.dtype("<f2")}


class MalformedUpdate(ValueError):
    """The bytes are not a well-formed sparse update (the reason says what is wrong)."""


def _dtype_name(update: SparseUpdate) -> str:
    return "float16" if update.values.dtype == torch.float16 else "float32"


def encoded_size(size: int, entries: int, dtype: str = "float32") -> int:
    """Bytes of an update with ``entries`` of ``size`` sent (the smaller position format)."""
    value_bytes = 2 if dtype == "float16" else 4
    positions = 0 if entries == size else min(4 * entries, (size + 7) // 8)
    return HEADER.size + positions + value_bytes * entries


def encode(update: SparseUpdate) -> bytes:
    dtype = _dtype_name(update)
    code = DTYPE_CODES[dtype]
    idx = update.indices.numpy().astype("<u4")
    bitmap_bytes = (update.size + 7) // 8
    if idx.size == update.size:
        fmt, positions = DENSE_FORMAT, b""
    elif 4 * idx.size <= bitmap_bytes:
        fmt, positions = INDEX_FORMAT, idx.tobytes()
    else:
        bits = np.zeros(update.size, dtype=bool)
        bits[idx] = True
        fmt, positions = BITMAP_FORMAT, np.packbits(bits, bitorder="little").tobytes()
    values = update.values.numpy().astype(NUMPY[code]).tobytes()
    return bytes(HEADER.pack(MAGIC, VERSION, fmt, code, update.size) + positions + values)


def decode(data: bytes, expected_size: int | None = None) -> SparseUpdate:
    """The update in ``data``; ``expected_size`` (the receiver's model size) must match when given."""
    if len(data) < HEADER.size:
        raise MalformedUpdate("shorter than the header")
    magic, version, fmt, code, size = HEADER.unpack_from(data)
    if magic != MAGIC or version != VERSION:
        raise MalformedUpdate("bad magic or version")
    if code not in NUMPY or fmt not in (INDEX_FORMAT, BITMAP_FORMAT, DENSE_FORMAT):
        raise MalformedUpdate("unknown value dtype or position format")
    if expected_size is not None and size != expected_size:
        raise MalformedUpdate(f"update of {size} entries for a model of {expected_size}")
    body = memoryview(data)[HEADER.size :]
    value_bytes = NUMPY[code].itemsize
    if fmt == INDEX_FORMAT:
        if len(body) % (4 + value_bytes):
            raise MalformedUpdate("index and value bytes do not pair up")
        k = len(body) // (4 + value_bytes)
        idx = np.frombuffer(body[: 4 * k], dtype="<u4").astype(np.int64)
        if k and (idx[-1] >= size or np.any(np.diff(idx) <= 0)):
            raise MalformedUpdate("indices not strictly ascending within the model")
        raw_values = body[4 * k :]
    elif fmt == DENSE_FORMAT:
        if len(body) != value_bytes * size:
            raise MalformedUpdate("dense values do not match the model size")
        idx = np.arange(size, dtype=np.int64)
        raw_values = body
    else:
        bitmap_bytes = (size + 7) // 8
        if len(body) < bitmap_bytes:
            raise MalformedUpdate("bitmap shorter than the model")
        bits = np.unpackbits(np.frombuffer(body[:bitmap_bytes], dtype=np.uint8), bitorder="little")
        if bits[size:].any():
            raise MalformedUpdate("bitmap marks entries beyond the model")
        idx = np.flatnonzero(bits[:size]).astype(np.int64)
        raw_values = body[bitmap_bytes:]
        if len(raw_values) != value_bytes * idx.size:
            raise MalformedUpdate("value bytes do not match the bitmap")
    values = np.frombuffer(raw_values, dtype=NUMPY[code]).astype(NUMPY[code].newbyteorder("="))
    if not np.isfinite(values).all():
        raise MalformedUpdate("non-finite value")
    torch_dtype = torch.float16 if code == 1 else torch.float32
    return SparseUpdate(int(size), torch.from_numpy(idx.copy()), torch.from_numpy(values.copy()).to(torch_dtype))
