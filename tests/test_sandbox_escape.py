"""A hostile peer's program against the node that scores it (issue 9), through the real reward path.

Each probe is a completion of an ``arith-code`` prompt (or a HumanEval body) that prints the right answer, and
so earns reward 1, only when its attack worked. Where an attack needs what the audit hook refuses (ctypes),
the probe runs it in a child interpreter, which no audit hook watches: what these tests show is the OS-level
boundary, not the hook. Every test here failed against the sandbox before OS-level isolation (the attack
worked and the reward was 1, see the issue), and passes now.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import socket
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from dgrpo.sandbox import SANDBOX_SITE, SandboxLimits
from dgrpo.sandbox.launch import HARNESS, HERE
from dgrpo.tasks.arith_code import ArithCodeTask, make_prompt
from dgrpo.tasks.base import Prompt

PROMPT = make_prompt("sum", 345, 78)  # the answer is 423
ANSWER = "423"


@pytest.fixture(scope="module")
def task() -> ArithCodeTask:
    return ArithCodeTask()


def completion(program: str) -> str:
    return f"```python\n{program}\n```"


def escape_probe(payload: str) -> str:
    """A program that runs ``payload`` in a child interpreter (outside the audit hook) and prints the answer
    only when the payload printed ESCAPED."""
    return (
        "import subprocess, sys\n"
        f"r = subprocess.run([sys.executable, '-S', '-c', {payload!r}], capture_output=True, text=True, timeout=20)\n"
        f"print({ANSWER} if 'ESCAPED' in r.stdout else 0)\n"
    )


def reward(task: ArithCodeTask, program: str, prompt: Prompt = PROMPT) -> float:
    return task.reward(prompt, completion(program))


@pytest.fixture
def shared_dir() -> Iterator[Path]:
    """A world-writable folder on a world-traversable path: permissions alone would let any user in, so only
    the sandbox's mount isolation keeps a program out."""
    path = Path(tempfile.mkdtemp(prefix="dgrpo-escape-", dir="/var/tmp"))
    path.chmod(0o777)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_control_probe_earns_reward_when_its_attack_needs_nothing(task: ArithCodeTask) -> None:
    # The probes' own machinery works: a payload that "escapes" trivially earns reward 1.
    assert reward(task, escape_probe("print('ESCAPED')")) == 1.0


# ---------------------------------------------------------------------------------------------- network
def test_network_cannot_be_reached_even_through_the_nodes_namespace(task: ArithCodeTask) -> None:
    tcp = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    tcp.bind(("127.0.0.1", 0))
    tcp.listen()
    udp.bind(("127.0.0.1", 0))
    tcp.setblocking(False)
    udp.setblocking(False)
    payload = f"""
import ctypes, os, socket
libc = ctypes.CDLL(None, use_errno=True)
def attempt():
    hit = False
    try:
        s = socket.create_connection(("127.0.0.1", {tcp.getsockname()[1]}), timeout=1)
        s.sendall(b"x")
        s.close()
        hit = True
    except OSError:
        pass
    try:
        u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); u.sendto(b"x", ("127.0.0.1", {udp.getsockname()[1]}))
    except OSError:
        pass
    return hit
ok = attempt()
for pid in os.listdir("/proc"):
    if ok or not pid.isdigit():
        continue
    try:
        fd = os.open(f"/proc/{{pid}}/ns/net", os.O_RDONLY)
    except OSError:
        continue
    if libc.setns(fd, 0x40000000) == 0:  # CLONE_NEWNET: enter that process's network namespace
        ok = attempt()
print("ESCAPED" if ok else "contained")
"""
    try:
        assert reward(task, escape_probe(payload)) == 0.0
        with pytest.raises(BlockingIOError):
            tcp.accept()  # nothing ever connected
        with pytest.raises(BlockingIOError):
            udp.recvfrom(16)  # nothing ever arrived
    finally:
        tcp.close()
        udp.close()


# ---------------------------------------------------------------------------------------------- host files
def test_host_files_can_be_neither_written_nor_read(task: ArithCodeTask, shared_dir: Path) -> None:
    secret = shared_dir / "secret.txt"
    secret.write_text("host-secret-7f3a")
    secret.chmod(0o644)
    key = shared_dir / "identity.key"  # like the node's key: readable by its owner only
    key.write_text("identity-key-91c2")
    key.chmod(0o600)
    planted = shared_dir / "planted.txt"
    payload = f"""
found = []
for path in ({str(secret)!r}, {str(key)!r}):
    try:
        found.append(open(path).read())
    except OSError:
        pass
try:
    open({str(planted)!r}, "w").write("from the sandbox")
    found.append("wrote")
except OSError:
    pass
print("ESCAPED" if found else "contained")
"""
    assert reward(task, escape_probe(payload)) == 0.0
    assert not planted.exists()


# ---------------------------------------------------------------------------------------------- /proc
def test_the_nodes_environment_and_command_line_are_invisible(
    task: ArithCodeTask, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DGRPO_NODE_SECRET", "node-secret-5be1")
    # The needles are hex-encoded so that the probe's own command line does not contain them.
    needles = [b"node-secret-5be1".hex(), b"pytest".hex()]
    payload = f"""
import os
needles = [bytes.fromhex(n) for n in {needles!r}]
seen = []
for pid in [{os.getpid()}] + [p for p in os.listdir("/proc") if p.isdigit()]:
    for name in ("environ", "cmdline"):
        try:
            data = open(f"/proc/{{pid}}/{{name}}", "rb").read()
        except OSError:
            continue
        if any(n in data for n in needles):
            seen.append(pid)
print("ESCAPED" if seen else "contained")
"""
    assert reward(task, escape_probe(payload)) == 0.0


def test_the_nodes_memory_cannot_be_written(task: ArithCodeTask) -> None:
    original = b"untouched-by-the-sandbox"
    buffer = bytearray(original)
    address = ctypes.addressof(ctypes.c_char.from_buffer(buffer))
    payload = f"""
try:
    with open("/proc/{os.getpid()}/mem", "r+b", buffering=0) as fh:
        fh.seek({address})
        fh.write(b"PWNED")
    print("ESCAPED")
except OSError:
    print("contained")
"""
    assert reward(task, escape_probe(payload)) == 0.0
    assert bytes(buffer) == original


def test_only_the_programs_own_processes_are_visible(task: ArithCodeTask) -> None:
    # In its fresh /proc the program is pid 1 and sees only what it started (here: the probe's child).
    payload = """
import os
others = [p for p in os.listdir("/proc") if p.isdigit() and int(p) not in (1, os.getpid())]
print("ESCAPED" if others else "contained")
"""
    assert reward(task, escape_probe(payload)) == 0.0


# ---------------------------------------------------------------------------------------------- namespaces
def test_no_root_no_capabilities_no_new_user_namespaces(task: ArithCodeTask) -> None:
    payload = """
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
status = dict(line.split(":", 1) for line in open("/proc/self/status"))
caps = int(status["CapEff"].strip(), 16) | int(status["CapPrm"].strip(), 16) | int(status["CapBnd"].strip(), 16)
userns = libc.unshare(0x10000000) == 0  # CLONE_NEWUSER: the usual first step of a kernel exploit
print("ESCAPED" if os.geteuid() == 0 or caps or userns else "contained")
"""
    assert reward(task, escape_probe(payload)) == 0.0


# ---------------------------------------------------------------------------------------------- limits and report
def test_the_pids_cgroup_cannot_be_raised(task: ArithCodeTask) -> None:
    payload = """
import glob
raised = []
own = [l.split(":")[2] for l in open("/proc/self/cgroup").read().splitlines() if ":pids:" in l or l.startswith("0::")]
candidates = [f"/sys/fs/cgroup/pids{p}/pids.max" for p in own] + [f"/sys/fs/cgroup{p}/pids.max" for p in own]
candidates += glob.glob("/run/dgrpo/pids/pids.max")
candidates += glob.glob("/sys/fs/cgroup/**/dgrpo-sandbox-*/pids.max", recursive=True)
for path in candidates:
    try:
        with open(path, "w") as fh:
            fh.write("max")
        raised.append(path)
    except OSError:
        pass
print("ESCAPED" if raised else "contained")
"""
    assert reward(task, escape_probe(payload)) == 0.0


@pytest.mark.slow
def test_a_program_killed_at_the_wall_limit_cannot_forge_its_report() -> None:
    # Before: the program wrote a complete "exit=0, timed_out=0" report into the supervisor's status pipe
    # (reopened through /proc/<pid>/fd) and the parent read it first. Now the report's channel is out of
    # sight, and a run killed at a limit is a failed run whatever was written.
    task = ArithCodeTask(limits=SandboxLimits(cpu_seconds=5.0, wall_seconds=2.0))
    forged = "child=1\\nexit=0\\ntimed_out=0\\ncpu_seconds=0.01\\nmax_rss_kib=1\\n"
    # Only pipes of the sandbox's own supervisor are targeted: on a machine where the sandbox is broken this
    # probe must not write into other processes' files.
    program = f"""
import os, time
for pid in [p for p in os.listdir("/proc") if p.isdigit()]:
    try:
        if b"runner" not in open(f"/proc/{{pid}}/cmdline", "rb").read():
            continue
        fds = os.listdir(f"/proc/{{pid}}/fd")
    except OSError:
        continue
    for fd in fds:
        try:
            if not os.readlink(f"/proc/{{pid}}/fd/{{fd}}").startswith("pipe:"):
                continue
            with open(f"/proc/{{pid}}/fd/{{fd}}", "w") as fh:
                fh.write("{forged}")
        except OSError:
            pass
print({ANSWER}, flush=True)
time.sleep(60)
"""
    assert reward(task, program) == 0.0


# ---------------------------------------------------------------------------------------------- persistence
def _digest(paths: list[Path]) -> str:
    h = hashlib.sha256()
    for root in paths:
        for path in sorted(root.rglob("*")) if root.is_dir() else [root]:
            if path.is_file() and "__pycache__" not in path.parts:
                h.update(str(path).encode() + path.read_bytes())
    return h.hexdigest()


def test_nothing_a_run_writes_survives_it(task: ArithCodeTask, monkeypatch: pytest.MonkeyPatch) -> None:
    import sysconfig

    harness = [HERE / name for name in HARNESS]
    site_packages = Path(sysconfig.get_paths()["purelib"])
    guarded = [SANDBOX_SITE, *harness]
    before = _digest(guarded)
    # Restored whatever happens: on a machine where the sandbox is broken the writer succeeds.
    saved = {path: path.read_bytes() for path in (SANDBOX_SITE / "calc.py", *harness)}
    module = "dgrpo_poison_" + os.urandom(4).hex()
    targets = [str(SANDBOX_SITE), str(site_packages), "/tmp", "/dev/shm", "/var/tmp"]
    writer = f"""
import os, sys
places = {targets!r} + [os.path.dirname(os.__file__)] + [p for p in sys.path if p]
for folder in places:
    try:
        with open(os.path.join(folder, "{module}.py"), "w") as fh:
            fh.write("POISONED = True\\n")
    except OSError:
        pass
for path in {[str(SANDBOX_SITE / "calc.py"), *map(str, harness)]!r}:
    try:
        with open(path, "a") as fh:
            fh.write("\\nPOISONED = True\\n")
    except OSError:
        pass
print(0)
"""
    reader = f"""
import sys
sys.path[:0] = {targets!r}
try:
    import {module}
    print({ANSWER})
except ImportError:
    print(0)
"""
    monkeypatch.setattr(os, "cpu_count", lambda: 1)  # one sandbox: the writer and reader share a batch
    import sys

    # Where the writer may have succeeded (before isolation: the node's own stdlib and sys.path among them).
    folders = [*targets, os.path.dirname(os.__file__), *(p for p in sys.path if p)]
    created = [Path(t) / f"{module}.py" for t in folders]
    try:
        # The reader runs after the writer in the same batch, then alone in a later batch.
        assert task.rewards(PROMPT, [completion(writer), completion(reader)]) == [0.0, 0.0]
        assert reward(task, reader) == 0.0
        assert _digest(guarded) == before
        assert not [p for p in created if p.exists()]
    finally:
        for path in created:
            path.unlink(missing_ok=True)
        for path, data in saved.items():
            if path.read_bytes() != data:
                path.write_bytes(data)


# ---------------------------------------------------------------------------------------------- early exit
@pytest.mark.parametrize(
    "tail",
    [
        "import sys; sys.exit(0)",
        "raise SystemExit",
        "raise SystemExit(0)",
        "import os; os._exit(0)",
        "import sys; sys.stdout.flush(); sys.exit()",
    ],
)
def test_a_stdout_program_that_exits_cleanly_after_printing_the_answer_is_correct(
    task: ArithCodeTask, tail: str
) -> None:
    # A stdout task's answer is what the program printed (issue 22): leaving early with status 0 after
    # printing it is a correct program.
    assert reward(task, f"print({ANSWER}, flush=True)\n{tail}\nprint('unreachable')") == 1.0


@pytest.mark.parametrize(
    "program",
    [
        f"import os\nprint({ANSWER})\nos._exit(0)",  # never flushed: nothing was printed
        f"import sys\nprint({ANSWER}, flush=True)\nsys.exit(1)",
        f"import sys\nprint({ANSWER}, flush=True)\nsys.exit('done')",
        f"print({ANSWER}, flush=True)\nraise ValueError",
        f"import atexit, os\nprint({ANSWER}, flush=True)\natexit.register(os._exit, 3)",
    ],
)
def test_a_stdout_program_that_prints_nothing_or_fails_scores_zero(task: ArithCodeTask, program: str) -> None:
    assert reward(task, program) == 0.0


@pytest.fixture(scope="module")
def humaneval():  # type: ignore[no-untyped-def]
    from dgrpo.tasks.code import HumanEvalTask

    return HumanEvalTask()


@pytest.mark.parametrize(
    "body",
    [
        "    import sys; sys.exit(0)\n",
        "    raise SystemExit(0)\n",
        "    import os; os._exit(0)\n",
        "    print('All tests passed'); import sys; sys.exit(0)\n",
        "    import sys; print('\\n'.join(['ok'] * 3)); sys.stdout.flush(); os = __import__('os'); os._exit(0)\n",
    ],
)
def test_a_humaneval_body_that_exits_early_fails_the_tests(humaneval, body: str) -> None:  # type: ignore[no-untyped-def]
    prompt = humaneval.train_prompt(0)
    assert humaneval.reward(prompt, body) == 0.0
    assert humaneval.reward(prompt, prompt.answer) == 1.0  # the canonical solution passes


def test_programs_run_as_an_unprivileged_user(task: ArithCodeTask) -> None:
    # What the probes above run as: never root; nobody (65534) when the node itself is root.
    result = task.sandbox.run("import os\nprint(os.getuid(), os.geteuid(), os.getgid())")
    assert result.ok
    uid, euid, gid = map(int, result.stdout.split())
    assert 0 not in (uid, euid, gid)
    if os.geteuid() == 0:
        assert (uid, euid, gid) == (65534, 65534, 65534)
