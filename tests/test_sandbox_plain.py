"""What crosses between a function job's tests and its candidate (issue 22): the strict plain-data codec
(worked examples, round trips, refusals, hostile bytes) and the tests' end of the call pipes against a
scripted candidate, then a few whole function jobs in the sandbox."""

from __future__ import annotations

import json
import math
import os
import threading
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dgrpo.sandbox import FunctionJob, Sandbox, plain
from dgrpo.sandbox.frames import FRAME, write_frame
from dgrpo.sandbox.function import Calls, CandidateError
from dgrpo.sandbox.plain import PlainDataError, decode, encode


# ---------------------------------------------------------------------------------------------- codec
@pytest.mark.parametrize(
    ("value", "wire"),
    [
        (None, b"null"),
        (True, b"true"),
        (7, b"7"),
        (-(2**63) + 1, b"-9223372036854775807"),
        (2**63, b'["i","8000000000000000"]'),
        (-(2**64), b'["i","-10000000000000000"]'),
        (1.5, b"1.5"),
        ("é", '"é"'.encode()),
        (b"\x00\xff", b'["b","00ff"]'),
        ([1, [2]], b'["l",1,["l",2]]'),
        ((1, "a"), b'["t",1,"a"]'),
        ({1: b"", "k": (None,)}, b'["d",1,["b",""],"k",["t",null]]'),
    ],
)
def test_worked_examples(value: object, wire: bytes) -> None:
    assert encode(value) == wire
    assert decode(wire) == value


def same(a: Any, b: Any) -> bool:
    """Equal and of the same exact types all the way down (1 == 1.0 == True would not do)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, float):
        return (math.isnan(a) and math.isnan(b)) or (a == b and math.copysign(1, a) == math.copysign(1, b))
    if isinstance(a, list | tuple):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict):
        return list(a) == list(b) and all(same(a[k], b[k]) and same(k, k2) for k, k2 in zip(a, b, strict=True))
    return bool(a == b)


keys = st.none() | st.booleans() | st.integers() | st.text(max_size=8) | st.binary(max_size=8)
scalars = keys | st.floats(allow_nan=True)
values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=4) | st.lists(inner, max_size=4).map(tuple) | st.dictionaries(keys, inner, max_size=4)
    ),
    max_leaves=20,
)


@given(values)
@settings(max_examples=300, deadline=None)
def test_every_plain_value_round_trips_with_its_exact_types(value: object) -> None:
    assert same(decode(encode(value)), value)


class EqualToAll:
    def __eq__(self, other: object) -> bool:
        return True

    __hash__ = object.__hash__


class IntEqualToAll(int):
    def __eq__(self, other: object) -> bool:
        return True

    __hash__ = int.__hash__


@pytest.mark.parametrize(
    "value",
    [
        EqualToAll(),
        IntEqualToAll(3),
        type("S", (str,), {})("x"),
        type("L", (list,), {})(),
        type("D", (dict,), {})(),
        type("F", (float,), {})(1.0),
        type("T", (tuple,), {})(),
        {1, 2},
        frozenset(),
        bytearray(b"x"),
        [1, [2, EqualToAll()]],
        {"k": IntEqualToAll(1)},
        {IntEqualToAll(1): 1},
        print,
        range(3),
        1j,
    ],
)
def test_anything_but_exact_plain_types_is_refused(value: object) -> None:
    with pytest.raises(PlainDataError):
        encode(value)


def test_bounds_are_enforced_both_ways() -> None:
    deep: list[Any] = []
    for _ in range(plain.MAX_DEPTH + 1):
        deep = [deep]
    with pytest.raises(PlainDataError, match="deeper"):
        encode(deep)
    with pytest.raises(PlainDataError, match="deeper"):
        decode(b'["l",' * (plain.MAX_DEPTH + 1) + b"1" + b"]" * (plain.MAX_DEPTH + 1))
    with pytest.raises(PlainDataError):
        decode(b"[" * 100_000)  # beyond the JSON parser's own recursion limit
    with pytest.raises(PlainDataError, match="over"):
        encode("x" * (plain.MAX_BYTES + 1))
    with pytest.raises(PlainDataError, match="over"):
        decode(b" " * (plain.MAX_BYTES + 1))
    with pytest.raises(PlainDataError, match="values"):
        encode([0] * (plain.MAX_ITEMS + 1))


@pytest.mark.parametrize(
    "wire",
    [
        b'{"a": 1}',  # a JSON object is never part of the plain form
        b'["l", {"a": 1}]',
        b"[1, 2]",  # untagged
        b"[]",
        b'["x", 1]',  # unknown tag
        b'["i", "5"]',  # a small int must not be tagged
        b'["i", "zz"]',
        b'["i", 5]',
        b'["i", ""]',
        b'["b", "abc"]',  # odd hex
        b'["b", "0g"]',
        b'["d", 1]',  # not pairs
        b'["d", ["l"], 1]',  # unhashable key
        b"18446744073709551616",  # a large int must be tagged
        b"1" * 5000,  # past int's digit limit
        b"\xff\xfe",
        b"",
        b"nul",
        b'["l", 1',
    ],
)
def test_malformed_wire_is_a_plain_data_error(wire: bytes) -> None:
    with pytest.raises(PlainDataError):
        decode(wire)


@given(st.binary(max_size=200) | st.text(alphabet='[]{}",:0123456789abdilt-e.nulrus ', max_size=200).map(str.encode))
@settings(max_examples=500, deadline=None)
def test_hostile_bytes_decode_to_plain_data_or_fail_cleanly(wire: bytes) -> None:
    try:
        value = decode(wire)
    except PlainDataError:
        return
    assert same(decode(encode(value)), value)  # whatever decodes is plain data of exact types


# ---------------------------------------------------------------------------------------------- the call pipes
Answer = Callable[[Any], bytes | None]


def scripted(answer: Answer, ready: bytes | None = None, raw: bool = False) -> tuple[Calls, threading.Thread]:
    """The tests' end of real pipes, facing a candidate that answers each request with ``answer(request)``
    (frame bodies, or with ``raw`` the bytes written as they are; None closes the pipe)."""
    calls_r, calls_w = os.pipe()
    results_r, results_w = os.pipe()

    def candidate() -> None:
        from dgrpo.sandbox.frames import read_frame

        write_frame(results_w, encode(("ready",)) if ready is None else ready)
        while (frame := read_frame(calls_r)) is not None:
            body = answer(decode(frame))
            if body is None:
                break
            if raw:
                os.write(results_w, body)
            else:
                write_frame(results_w, body)
        os.close(results_w)
        os.close(calls_r)

    thread = threading.Thread(target=candidate, daemon=True)
    thread.start()
    return Calls(calls_w, results_r), thread


def test_a_call_returns_the_decoded_value() -> None:
    calls, _ = scripted(lambda req: encode(("return", req[1], [req[2][0] + 1, (True, None)])))
    calls.wait_ready()
    assert calls.stand_in("f")(1) == [2, (True, None)]
    assert calls.stand_in("f")(41) == [42, (True, None)]


@pytest.mark.parametrize(
    "reply",
    [
        lambda req: encode(("return", req[1] + 1, 1)),  # out of turn
        lambda req: encode(("return", True, 1)),  # True == 1, but not the int 1
        lambda req: encode(("return", req[1])),
        lambda req: encode(("refused", req[1], "a set")),
        lambda req: encode(["return", req[1], 1]),  # a list, not the tuple the protocol sends
        lambda req: b'{"return": 1}',
        lambda req: encode(("raise", req[1], "StopIteration", "")),
        lambda req: encode(("raise", req[1], "SystemExit", "")),
        lambda req: None,  # the candidate's process is gone
    ],
)
def test_every_other_answer_fails_the_call(reply: Answer) -> None:
    calls, _ = scripted(reply)
    calls.wait_ready()
    with pytest.raises(CandidateError):
        calls.stand_in("f")(1)


def test_a_raised_builtin_error_is_that_error_and_a_candidate_error() -> None:
    calls, _ = scripted(lambda req: encode(("raise", req[1], "ValueError", "bad input")))
    calls.wait_ready()
    with pytest.raises(ValueError, match="bad input") as info:
        calls.stand_in("f")(1)
    assert isinstance(info.value, CandidateError)


def test_a_candidate_stop_iteration_never_ends_a_tests_loop_early() -> None:
    # A StopIteration raised inside map() would end the for loop silently and skip every assertion.
    calls, _ = scripted(lambda req: encode(("raise", req[1], "StopIteration", "")))
    calls.wait_ready()
    candidate = calls.stand_in("f")
    with pytest.raises(CandidateError):
        for value in map(candidate, [1, 2, 3]):
            assert value == 0


def test_an_oversized_answer_is_refused_unread() -> None:
    calls, _ = scripted(lambda req: FRAME.pack(plain.MAX_BYTES + 1), raw=True)  # a header announcing too much
    calls.wait_ready()
    with pytest.raises(CandidateError, match="too large"):
        calls.stand_in("f")(1)


@pytest.mark.parametrize("ready", [encode(("ready", 1)), encode("ready"), b"\x00", json.dumps(["l", "ready"]).encode()])
def test_only_the_ready_frame_says_the_solution_loaded(ready: bytes) -> None:
    calls, _ = scripted(lambda req: None, ready=ready)
    with pytest.raises(CandidateError):
        calls.wait_ready()


# ---------------------------------------------------------------------------------------------- whole jobs
@pytest.fixture(scope="module")
def sandbox() -> Sandbox:
    return Sandbox()


LOOP_TESTS = "def check(candidate):\n    for value in map(candidate, [1, 2, 3]):\n        assert value == 0\n"


@pytest.mark.parametrize(
    ("solution", "ok"),
    [
        ("def f(x):\n    return 0\n", True),
        ("def f(x):\n    raise StopIteration\n", False),
        ("def f(x):\n    return 0.0\n", True),  # 0.0 == 0 for builtins: the tests' own semantics
        ("def f(x):\n    return False\n", True),
        ("import sys\ndef f(x):\n    return 0\nsys.exit(0)\n", False),  # the solution never loads
        ("def f(x):\n    return {x}\n", False),
        ("class Z(int):\n    pass\ndef f(x):\n    return Z(0)\n", False),
    ],
)
def test_function_jobs_in_the_sandbox(sandbox: Sandbox, solution: str, ok: bool) -> None:
    [result] = sandbox.run_functions([FunctionJob(solution, LOOP_TESTS, "f")])
    assert result.ok is ok, result.stderr


def test_the_tests_see_arguments_as_copies_and_helpers_of_their_own(sandbox: Sandbox) -> None:
    tests = (
        "def helper(x):\n    return x * 2\n"
        "def check(candidate):\n    xs = [1, 2]\n    assert candidate(xs) == [1, 2, 3]\n    assert xs == [1, 2]\n"
        "    assert helper(2) == 4\n"
    )
    solution = "def helper(x):\n    return 0\ndef f(xs):\n    xs.append(3)\n    return xs\n"
    [result] = sandbox.run_functions([FunctionJob(solution, tests, "f")])
    assert result.ok, result.stderr


def test_a_function_job_needs_an_identifier_entry_point() -> None:
    from dgrpo.errors import ConfigError

    with pytest.raises(ConfigError):
        FunctionJob("", "", "f(); import os")


def test_the_batchs_texts_are_sealed_against_writes() -> None:
    from dgrpo.sandbox.batch import pack_jobs, sealed_memfd

    blob, index = pack_jobs([("print(1)", "in"), FunctionJob("def f(): pass", "def check(c): pass", "f")])
    assert index == [("program", (0, 8), (8, 2)), ("function", (10, 13), (23, 18), "f")]
    fd = sealed_memfd("jobs", blob)
    try:
        assert os.pread(fd, len(blob), 0) == blob
        for attempt in (lambda: os.pwrite(fd, b"x", 0), lambda: os.ftruncate(fd, 0), lambda: os.write(fd, b"x")):
            with pytest.raises(PermissionError):
                attempt()
    finally:
        os.close(fd)
