"""Length-prefixed frames on pipes: the batch into the runner, records out of it, and the calls between the
two halves of a function job. Standard library only; copied into the sandbox beside :mod:`runner`."""

from __future__ import annotations

import os
import struct

FRAME = struct.Struct(">Q")


class FrameTooLargeError(EOFError):
    """A frame announced more bytes than the reader accepts (the rest is left unread)."""


def read_frame(fd: int, max_bytes: int | None = None) -> bytes | None:
    """One frame from ``fd``, or None at a clean end of stream; EOFError when it is cut short,
    :class:`FrameTooLargeError` when it announces more than ``max_bytes``."""
    head = _read_exactly(fd, FRAME.size)
    if head is None:
        return None
    size = FRAME.unpack(head)[0]
    if max_bytes is not None and size > max_bytes:
        raise FrameTooLargeError(f"a frame of {size} bytes, over {max_bytes}")
    body = _read_exactly(fd, size)
    if body is None:
        raise EOFError("truncated frame")
    return body


def write_frame(fd: int, payload: bytes) -> None:
    data = memoryview(FRAME.pack(len(payload)) + payload)
    while data:
        data = data[os.write(fd, data) :]


def _read_exactly(fd: int, size: int) -> bytes | None:
    chunks: list[bytes] = []
    left = size
    while left:
        chunk = os.read(fd, min(left, 1 << 20))
        if not chunk:
            if left == size and size:
                return None
            raise EOFError("truncated frame")
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


class FrameReader:
    """Frames from one fd through a buffer: a call's answer usually arrives in one ``read``, not two."""

    def __init__(self, fd: int, max_bytes: int) -> None:
        self.fd, self.max_bytes = fd, max_bytes
        self.buffer = bytearray()

    def _fill(self, size: int) -> bool:
        """Read until ``size`` bytes are buffered; False at end of stream."""
        while len(self.buffer) < size:
            chunk = os.read(self.fd, max(1 << 16, size - len(self.buffer)))
            if not chunk:
                return False
            self.buffer += chunk
        return True

    def read(self) -> bytes | None:
        """The next frame, None at a clean end of stream; EOFError when cut short,
        :class:`FrameTooLargeError` when it announces more than ``max_bytes`` (its body is never read)."""
        if not self._fill(FRAME.size):
            if self.buffer:
                raise EOFError("truncated frame")
            return None
        size = FRAME.unpack_from(self.buffer)[0]
        if size > self.max_bytes:
            raise FrameTooLargeError(f"a frame of {size} bytes, over {self.max_bytes}")
        if not self._fill(FRAME.size + size):
            raise EOFError("truncated frame")
        body = bytes(self.buffer[FRAME.size : FRAME.size + size])
        del self.buffer[: FRAME.size + size]
        return body


def read_span(fd: int, span: tuple[int, int]) -> str:
    """The UTF-8 text at ``span`` (offset, length) of the batch's memfd ``fd``."""
    offset, length = span
    chunks: list[bytes] = []
    while length > 0:
        chunk = os.pread(fd, length, offset)
        if not chunk:
            raise EOFError("the batch's texts end early")
        chunks.append(chunk)
        offset += len(chunk)
        length -= len(chunk)
    return b"".join(chunks).decode("utf-8")
