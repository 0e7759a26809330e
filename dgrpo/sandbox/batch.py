"""One batch: start the runner, hand it the jobs, collect one record per job, turn records into results.
Whatever goes wrong (the sandbox fails to start, the runner dies, the batch overruns), every job gets a
result; a job without a trustworthy record fails.

Two kinds of job: a program (``(source, stdin)``: its result is what it printed and how it exited) and a
:class:`FunctionJob` (an untrusted solution called by trusted tests across a process boundary: its result is
the tests' verdict). :mod:`dgrpo.sandbox.runner` says who runs what and what decides a result."""

from __future__ import annotations

import ast
import contextlib
import fcntl
import json
import logging
import marshal
import math
import os
import select
import shutil
import signal
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dgrpo.errors import ConfigError
from dgrpo.sandbox.cgroup import PidsCgroup
from dgrpo.sandbox.confine import EXIT_CPU, EXIT_MEMORY, EXIT_PROCESSES, EXIT_SETUP
from dgrpo.sandbox.frames import FRAME
from dgrpo.sandbox.launch import Launcher, Started
from dgrpo.sandbox.limits import SandboxLimits, SandboxResult

log = logging.getLogger(__name__)

Job = tuple[str, str]  # a program job: (source, stdin)


@dataclass(frozen=True)
class FunctionJob:
    """An untrusted ``solution`` (a module defining ``entry_point``) and trusted ``tests`` (a module defining
    ``check(candidate)``): ``check`` runs in a process of its own and calls the solution's function in
    another, arguments and results crossing as plain data (:mod:`dgrpo.sandbox.function`). The result is
    ``ok`` only when ``check`` returned."""

    solution: str
    tests: str
    entry_point: str
    preload: tuple[str, ...] = ()  # standard library modules the tests import (see :func:`trusted_imports`)

    def __post_init__(self) -> None:
        if not self.entry_point.isidentifier():
            raise ConfigError(f"a function job's entry point must be an identifier, got {self.entry_point!r}")


def trusted_imports(source: str) -> tuple[str, ...]:
    """The top-level names of the modules ``source`` imports (trusted source only: the fork server imports
    them once per batch, before it forks any job, so that each job's two interpreters do not both pay for,
    say, ``typing``). Each job still gets fresh copies (fork); nothing of one job reaches another."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return ()
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module.split(".")[0])
    return tuple(sorted(n for n in names if n.isidentifier()))


AnyJob = Job | FunctionJob
FUNCTION_EXTRA_PIDS = 1  # a function job's second process (the tests')
START_SECONDS = 30.0  # allowance for the sandbox's start-up within the batch's deadline
PER_PROGRAM_SLACK = 1.0  # the keeper's own work per program, beyond the wall limit
MAX_RECORD = 16 << 20


def pack_jobs(jobs: Sequence[AnyJob]) -> tuple[bytes, list[tuple[object, ...]]]:
    """The batch's texts in one blob (the runner gets it as a memfd) and the index the runner reads: per
    job its kind and the (offset, length) of each text, never the texts themselves.

    Why: every process of a batch is a fork of the runner, so whatever the runner's memory holds, every
    program can read (its own memory, after disarming the audit hook). The runner and the keepers therefore
    never read a text: a program process reads its own source and stdin, a candidate its own solution, a
    tests' process its own tests, each from the memfd, whose fd is closed before any code it was given
    runs. No program sees another job's program, and no candidate sees the tests it is called by."""
    blob = bytearray()

    def span(text: str) -> tuple[int, int]:
        data = _clean(text).encode("utf-8")
        start = len(blob)
        blob.extend(data)
        return start, len(data)

    index: list[tuple[object, ...]] = []
    for job in jobs:
        if isinstance(job, FunctionJob):
            index.append(("function", span(job.solution), span(job.tests), job.entry_point))
        else:
            source, stdin = job
            index.append(("program", span(source), span(stdin)))
    return bytes(blob), index


def sealed_memfd(name: str, data: bytes) -> int:
    """An inheritable memfd holding ``data``, sealed: no process that holds it can write, grow or shrink it
    (a process of the batch that kept it open could not change a later job's texts)."""
    fd = os.memfd_create(name, os.MFD_ALLOW_SEALING)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        seals = fcntl.F_SEAL_WRITE | fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, seals)
    except BaseException:
        os.close(fd)
        raise
    return fd


def run_batch(
    launcher: Launcher, limits: SandboxLimits, extra_paths: Sequence[Path], jobs: Sequence[AnyJob]
) -> tuple[list[SandboxResult], dict[str, bool]]:
    """Run ``jobs`` one after another in one sandbox. Returns their results, in order, and the mechanisms the
    sandbox reported (empty when no job got as far as its setup)."""
    if not jobs:
        return [], {}
    started_at = time.monotonic()
    records: dict[int, dict[str, Any]] = {}
    failure = ""
    extra = FUNCTION_EXTRA_PIDS if any(isinstance(j, FunctionJob) for j in jobs) else 0
    cgroup = PidsCgroup.create(limits.max_processes + launcher.overhead_pids + extra)
    blob, index = pack_jobs(jobs)
    with tempfile.TemporaryFile() as stderr:
        started: Started | None = None
        try:
            jobs_fd = sealed_memfd("jobs", blob)  # the runner reads spans of it, never the whole
            try:
                started = launcher.start(extra_paths, cgroup, stderr, jobs_fd)
            finally:
                os.close(jobs_fd)
            config = {
                **started.config,
                "limits": {**limits.__dict__},
                "nproc_base": launcher.nproc_base,
                "pids_cgroup": cgroup is not None,
                "jobs_fd": jobs_fd,
                "jobs": index,
                "preload": sorted({name for job in jobs if isinstance(job, FunctionJob) for name in job.preload}),
            }
            _send(started, marshal.dumps(config))
            deadline = START_SECONDS + len(jobs) * (limits.wall_seconds + PER_PROGRAM_SLACK)
            failure = _collect(started.records, records, len(jobs), started_at + deadline)
        except Exception as exc:  # the environment failed: every program gets a verdict, logged once
            failure = f"sandbox failed to start: {exc}"
        finally:
            if started is not None:
                _finish(started)
            if cgroup is not None:
                cgroup.destroy()
        if failure:
            stderr.seek(0)
            detail = stderr.read(4096).decode("utf-8", "replace").strip()
            log.warning("sandbox: %s%s", failure, f" ({detail})" if detail else "")
    wall = time.monotonic() - started_at
    results = [_result(limits, records.get(i), failure, wall) for i in range(len(jobs))]
    mechanisms: dict[str, bool] = next((r["mechanisms"] for r in records.values() if r.get("mechanisms")), {})
    return results, mechanisms


def _clean(text: str) -> str:
    """Hostile text may hold lone surrogates: replace them rather than fail to encode."""
    return text.encode("utf-8", "replace").decode("utf-8")


def _send(started: Started, payload: bytes) -> None:
    stdin = started.proc.stdin
    assert stdin is not None
    try:
        stdin.write(FRAME.pack(len(payload)) + payload)
        stdin.close()
    except BrokenPipeError:
        pass  # the runner died at start-up; _collect finds no records and says so


def _collect(fd: int, records: dict[int, dict[str, Any]], count: int, deadline: float) -> str:
    """Read records until ``count`` arrived, the runner closed its end, or ``deadline``. Returns why it
    stopped early ("" when every record came)."""
    poller = select.poll()
    poller.register(fd, select.POLLIN | select.POLLHUP)
    buffer = bytearray()
    while len(records) < count:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return "the batch overran its deadline"
        if not poller.poll(max(1, math.ceil(remaining * 1000))):
            continue
        chunk = os.read(fd, 1 << 20)
        if not chunk:
            return "" if len(records) == count else "the sandbox ended before reporting every program"
        buffer += chunk
        while len(buffer) >= FRAME.size:
            size = FRAME.unpack_from(buffer)[0]
            if size > MAX_RECORD:
                return "the sandbox sent an oversized record"
            if len(buffer) < FRAME.size + size:
                break
            try:
                record = json.loads(bytes(buffer[FRAME.size : FRAME.size + size]))
            except ValueError:
                return "the sandbox sent a malformed record"
            del buffer[: FRAME.size + size]
            index = record.get("index") if isinstance(record, dict) else None
            if isinstance(index, int) and 0 <= index < count:
                records[index] = record
    return ""


def _finish(started: Started) -> None:
    """Reap the runner; kill its session first if it is still running (it is unreaped, so its group id
    cannot have been reused), then close the pipe and remove the host folders of a direct run."""
    proc = started.proc
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    os.close(started.records)
    for path in started.cleanup:
        shutil.rmtree(path, ignore_errors=True)


def _result(limits: SandboxLimits, record: dict[str, Any] | None, failure: str, batch_wall: float) -> SandboxResult:
    """A job's result from its keeper's record. ``ok`` needs exit 0, no limit, a confirmed setup, and for a
    function job the tests' process's verdict; nothing else the record says can make a job pass."""
    if record is None:
        if "deadline" in failure:
            return SandboxResult(False, -signal.SIGKILL, "", failure, True, "wall", batch_wall)
        return SandboxResult(False, -1, "", failure or "no record", False, "setup", batch_wall)
    wall = float(record.get("wall", 0.0))
    if "error" in record:
        log.warning("sandbox: %s", record["error"])
        return SandboxResult(False, -1, "", str(record["error"]), False, "setup", wall)
    returncode = int(record["exit"])
    timed_out = bool(record["timed_out"])
    output_bytes = max(int(record["stdout_size"]), int(record["stderr_size"]))
    limit = classify(limits, returncode, timed_out, float(record["cpu"]), int(record["events"]), output_bytes)
    function = record.get("kind") == "function"
    if limit is None and function and record["candidate_exit"] is not None:
        # The candidate ended by itself: a limit it hit names the failure (one it ends in after answering
        # every call fails the job too: a limit only ever turns a result into a failure).
        limit = classify(limits, int(record["candidate_exit"]), False, float(record["candidate_cpu"]), 0, 0)
    if limit is None and not record["setup"]:
        limit = "setup"  # a process never confirmed its confinement: nothing it did counts
    stdout = str(record["stdout"]).encode("latin-1").decode("utf-8", errors="replace")
    stderr = str(record["stderr"]).encode("latin-1").decode("utf-8", errors="replace")
    ok = returncode == 0 and limit is None and (bool(record["passed"]) if function else True)
    return SandboxResult(ok, returncode, stdout, stderr, timed_out, limit, wall)


def classify(
    limits: SandboxLimits, returncode: int, timed_out: bool, cpu: float, events: int, output_bytes: int
) -> str | None:
    """The limit a run hit, by the most trustworthy evidence first (keeper and kernel, then exit codes)."""
    if timed_out:
        return "wall"
    if returncode in (-signal.SIGXCPU, EXIT_CPU) or (
        returncode == -signal.SIGKILL and cpu >= math.ceil(limits.cpu_seconds)
    ):
        return "cpu"
    if returncode == EXIT_MEMORY:
        return "memory"
    if events > 0 or returncode == EXIT_PROCESSES:
        return "processes"
    if output_bytes > limits.max_output_bytes:
        return "output"
    if returncode == EXIT_SETUP:
        return "setup"
    return None
