"""Plain data across the process boundary of a function job: the strict codec between the tests' process and
the candidate's. Standard library only; copied into the sandbox beside :mod:`runner`.

What crosses is a value built only of exact builtin types: None, bool, int, float, str, bytes, list, tuple
and dict (keys of those types that are hashable). The encoder refuses anything else, subclasses included
(``type(v) is int``, never ``isinstance``): an ``int`` subclass with its own ``__eq__`` does not become an
``int``, it fails the call. The decoder is what the tests' process trusts: it reads a frame through the
standard library's JSON parser (safe on any input) and rebuilds exact builtins from a tagged form, bounded
in size, depth and item count, so that whatever bytes the candidate's process writes, the tests compare
builtin values with builtin comparisons, and no method of the candidate's objects (``__eq__``, ``__hash__``,
``__repr__``, ``__del__``) ever runs there.

The tagged form (JSON text, UTF-8): None, booleans, floats, strings and ints of at most 63 bits are JSON
scalars; a larger int is ``["i", "<hex>"]`` (hex: no digit limit, linear to parse); bytes ``["b", "<hex>"]``;
a list ``["l", item, ...]``, a tuple ``["t", item, ...]``, a dict ``["d", key, value, key, value, ...]``.
A JSON object, an unknown tag, a malformed hex string or a bound exceeded is a :class:`PlainDataError`.

Why JSON and not msgpack (which the wire layer uses, with strict types): this runs under the sandbox's
interpreter, which has its standard library and nothing else; the standard library's JSON parser is the one
parser there that is written for untrusted input (``marshal`` and ``pickle`` are not).
"""

from __future__ import annotations

import json

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

MAX_BYTES = 8 << 20  # one encoded value (a call's arguments or its result)
MAX_DEPTH = 64  # containers nested in containers
MAX_ITEMS = 1 << 20  # values in one encoded value, containers included
SMALL_INT = 1 << 63
_CONTAINERS: dict[type, str] = {list: "l", tuple: "t"}
_SCALARS = frozenset({type(None), bool, float, str})


def _no_objects(pairs: Any) -> Any:
    raise PlainDataError("a JSON object is not part of the plain form")


# Made once: ``json.dumps``/``loads`` with options build a new coder on every call.
_ENCODER = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=True, check_circular=False)
_DECODER = json.JSONDecoder(object_pairs_hook=_no_objects)


class PlainDataError(ValueError):
    """A value that is not plain data (encoding), or bytes that do not decode to plain data."""


# ---------------------------------------------------------------------------------------------- encode
def encode(value: Any) -> bytes:
    """The tagged JSON form of ``value``; :class:`PlainDataError` if any part is not an exact builtin type
    of the plain set or a bound is exceeded."""
    counter = [0]
    tree = _tagged(value, 0, counter)
    try:
        text = _ENCODER.encode(tree)
    except (ValueError, TypeError, RecursionError) as exc:
        raise PlainDataError(f"cannot encode: {exc}") from None
    data = text.encode("utf-8", "surrogatepass")
    if len(data) > MAX_BYTES:
        raise PlainDataError(f"encoded value is {len(data)} bytes, over {MAX_BYTES}")
    return data


def _tagged(value: Any, depth: int, counter: list[int]) -> Any:
    counter[0] += 1
    if counter[0] > MAX_ITEMS:
        raise PlainDataError(f"more than {MAX_ITEMS} values")
    kind = type(value)
    if kind in _SCALARS:
        return value
    if kind is int:
        return value if -SMALL_INT < value < SMALL_INT else ["i", format(value, "x")]
    if kind is bytes:
        return ["b", value.hex()]
    if depth >= MAX_DEPTH:
        raise PlainDataError(f"nested deeper than {MAX_DEPTH}")
    tag = _CONTAINERS.get(kind)
    if tag is not None:
        return [tag, *[_tagged(item, depth + 1, counter) for item in value]]
    if kind is dict:
        out: list[Any] = ["d"]
        for key, item in value.items():
            out.append(_tagged(key, depth + 1, counter))
            out.append(_tagged(item, depth + 1, counter))
        return out
    raise PlainDataError(f"{_type_name(value)} is not plain data")


def _type_name(value: Any) -> str:
    """The value's type name, read from the type object without calling anything of the value."""
    name = type.__dict__["__name__"].__get__(type(value))
    return name if type(name) is str else "?"


# ---------------------------------------------------------------------------------------------- decode
def decode(data: bytes) -> Any:
    """The value ``data`` encodes, built of exact builtins only; :class:`PlainDataError` otherwise."""
    if type(data) is not bytes:
        raise PlainDataError("not bytes")
    if len(data) > MAX_BYTES:
        raise PlainDataError(f"{len(data)} bytes, over {MAX_BYTES}")
    try:
        tree = _DECODER.decode(data.decode("utf-8", "surrogatepass"))
    except PlainDataError:
        raise
    except (ValueError, RecursionError, MemoryError) as exc:  # UnicodeDecodeError and JSON errors among them
        raise PlainDataError(f"malformed: {type(exc).__name__}") from None
    return _value(tree, 0, [0])


def _value(tree: Any, depth: int, counter: list[int]) -> Any:
    counter[0] += 1
    if counter[0] > MAX_ITEMS:
        raise PlainDataError(f"more than {MAX_ITEMS} values")
    kind = type(tree)
    if kind in _SCALARS:
        return tree
    if kind is int:
        if not -SMALL_INT < tree < SMALL_INT:
            raise PlainDataError("a large int must be tagged")
        return tree
    if kind is not list or not tree or type(tree[0]) is not str:
        raise PlainDataError("untagged container")
    tag = tree[0]
    if tag in ("i", "b"):
        if len(tree) != 2 or type(tree[1]) is not str:
            raise PlainDataError(f"malformed {tag!r}")
        return _from_hex(tag, tree[1])
    if depth >= MAX_DEPTH:
        raise PlainDataError(f"nested deeper than {MAX_DEPTH}")
    items = [_value(item, depth + 1, counter) for item in tree[1:]]
    if tag == "l":
        return items
    if tag == "t":
        return tuple(items)
    if tag == "d":
        if len(items) % 2:
            raise PlainDataError("a dict needs key, value pairs")
        out = {}
        for i in range(0, len(items), 2):
            try:
                out[items[i]] = items[i + 1]
            except TypeError:  # an unhashable key (a list, a dict): builtin hashing, nothing else runs
                raise PlainDataError("unhashable dict key") from None
        return out
    raise PlainDataError("unknown tag")


def _from_hex(tag: str, text: str) -> Any:
    digits = text[1:] if tag == "i" and text.startswith("-") else text
    if digits.strip("0123456789abcdef"):  # a character that is not a lower-case hex digit
        raise PlainDataError(f"malformed {tag!r}")
    if tag == "b":
        if len(digits) % 2:
            raise PlainDataError("malformed 'b'")
        return bytes.fromhex(digits)
    if not digits:
        raise PlainDataError("malformed 'i'")
    value = int(text, 16)
    if -SMALL_INT < value < SMALL_INT:
        raise PlainDataError("a small int must not be tagged")  # one encoding per value
    return value
