"""The sandbox: normal runs, every limit, cleanup, batches, the weak mode and the refusal to run without
isolation. Escapes through the reward path are in test_sandbox_escape.py."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dgrpo.errors import ConfigError
from dgrpo.sandbox import Sandbox, SandboxLimits, SandboxUnavailableError
from dgrpo.sandbox import sandbox as sandbox_module
from dgrpo.sandbox.batch import FunctionJob, run_batch
from dgrpo.sandbox.confine import audit_hook
from dgrpo.sandbox.launch import DirectLauncher

FAST = SandboxLimits(cpu_seconds=1.0, wall_seconds=2.0)


@pytest.fixture(scope="module")
def sandbox() -> Sandbox:
    return Sandbox()


@pytest.fixture(scope="module")
def capabilities(sandbox: Sandbox) -> dict[str, bool | str]:
    return sandbox.capabilities()


def _processes_of(uid: int) -> set[int]:
    """Pids of every process on the machine whose real uid is ``uid``."""
    pids = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            status = Path(f"/proc/{entry}/status").read_text()
        except OSError:
            continue  # exited while we looked
        uid_line = next(line for line in status.splitlines() if line.startswith("Uid:"))
        if int(uid_line.split()[1]) == uid:
            pids.add(int(entry))
    return pids


def test_program_prints_and_succeeds(sandbox: Sandbox) -> None:
    result = sandbox.run("print(6 * 7)")
    assert result.ok
    assert result.returncode == 0
    assert result.stdout == "42\n"
    assert result.limit is None
    assert not result.timed_out


def test_stdin_reaches_the_program(sandbox: Sandbox) -> None:
    result = sandbox.run("import sys\nprint(sys.stdin.read().upper())", stdin="hello sandbox")
    assert result.ok
    assert result.stdout.strip() == "HELLO SANDBOX"


def test_failing_program_is_not_ok_and_reports_its_traceback(sandbox: Sandbox) -> None:
    result = sandbox.run("print('partial')\nraise ValueError('boom')")
    assert not result.ok
    assert result.returncode == 1
    assert result.limit is None
    assert "ValueError: boom" in result.stderr
    assert 'File "solution.py"' in result.stderr


def test_sys_exit_codes_are_kept_and_a_clean_early_exit_is_a_clean_end(sandbox: Sandbox) -> None:
    # A program job is judged by what it printed and its exit status, both observed by the keeper: an early
    # exit(0) is a clean end (nothing the program holds could say otherwise), any other status a failure.
    failed = sandbox.run("import sys\nsys.exit(3)")
    assert (failed.returncode, failed.ok) == (3, False)
    early = sandbox.run("import sys\nprint(1)\nsys.exit(0)\nprint(2)")
    assert (early.returncode, early.ok, early.stdout) == (0, True, "1\n")
    assert not sandbox.run("import sys\nsys.exit('message')").ok
    assert sandbox.run("x = 1").ok


def test_syntax_error_is_a_verdict(sandbox: Sandbox) -> None:
    result = sandbox.run("def (:\n")
    assert not result.ok
    assert "SyntaxError" in result.stderr


def test_infinite_loop_hits_the_cpu_limit() -> None:
    started = time.monotonic()
    result = Sandbox(FAST).run("while True: pass")
    elapsed = time.monotonic() - started
    assert not result.ok
    assert result.limit in ("cpu", "wall")
    assert elapsed < FAST.wall_seconds + 2


def test_sleeping_program_hits_the_wall_limit() -> None:
    limits = SandboxLimits(cpu_seconds=5.0, wall_seconds=1.0)
    started = time.monotonic()
    result = Sandbox(limits).run("import time\nprint('started', flush=True)\ntime.sleep(60)")
    elapsed = time.monotonic() - started
    assert not result.ok
    assert result.timed_out
    assert result.limit == "wall"
    assert elapsed < limits.wall_seconds + 2


def test_fork_bomb_is_contained_and_cleaned_up(sandbox: Sandbox, capabilities: dict[str, bool | str | int]) -> None:
    uid = int(capabilities["sandbox_uid"])
    before = _processes_of(uid) if uid != os.getuid() else set()
    started = time.monotonic()
    result = sandbox.run("import os\nwhile True: os.fork()\n")
    elapsed = time.monotonic() - started
    assert not result.ok
    assert result.limit in ("processes", "wall", "cpu")
    assert elapsed < sandbox.limits.wall_seconds + 2
    if uid != os.getuid():
        # Every process of the bomb is gone (killed ones may take a moment to be released).
        deadline = time.monotonic() + 5.0
        while _processes_of(uid) - before and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _processes_of(uid) <= before
    if capabilities["pids_cgroup"]:
        assert result.limit == "processes"
        leftovers = list(Path(str(capabilities["cgroup_dir"])).glob("dgrpo-sandbox-*"))
        assert leftovers == []


def test_fork_bomb_that_ignores_errors_is_stopped() -> None:
    program = "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n"
    started = time.monotonic()
    result = Sandbox(FAST).run(program)
    assert not result.ok
    assert result.limit in ("wall", "cpu", "processes")
    assert time.monotonic() - started < FAST.wall_seconds + 2


def test_huge_allocation_hits_the_memory_limit(sandbox: Sandbox) -> None:
    result = sandbox.run("x = bytearray(10 * 1024**3)\nprint('allocated')")
    assert not result.ok
    assert result.limit == "memory"
    assert "allocated" not in result.stdout


def test_network_is_unreachable(sandbox: Sandbox) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        program = f"import socket\ns = socket.create_connection(('127.0.0.1', {port}), timeout=2)\nprint('connected')\n"
        result = sandbox.run(program)
        server.setblocking(False)
        with pytest.raises(BlockingIOError):
            server.accept()  # nothing ever connected
    assert not result.ok
    assert "connected" not in result.stdout


def test_raw_socket_creation_is_refused(sandbox: Sandbox) -> None:
    result = sandbox.run("import socket\ns = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\nprint('made')")
    assert not result.ok
    assert "PermissionError" in result.stderr


def test_output_flood_is_truncated_and_fails(sandbox: Sandbox) -> None:
    started = time.monotonic()
    result = sandbox.run("while True: print('x' * 1000)")
    assert not result.ok
    assert result.limit == "output"
    assert len(result.stdout.encode()) <= sandbox.limits.max_output_bytes
    assert result.stdout.startswith("x" * 1000)
    assert time.monotonic() - started < sandbox.limits.wall_seconds + 2


def test_environment_is_fixed_and_holds_nothing_of_the_node(sandbox: Sandbox, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DGRPO_SANDBOX_CANARY", "leaked-secret")
    result = sandbox.run("import json, os\nprint(json.dumps(dict(os.environ)))")
    assert result.ok
    env = json.loads(result.stdout)
    assert "DGRPO_SANDBOX_CANARY" not in env
    assert "leaked-secret" not in result.stdout
    assert set(env) <= {"HOME", "TMPDIR", "LANG", "PYTHONHASHSEED", "LD_LIBRARY_PATH"}
    assert env["PYTHONHASHSEED"] == "0"
    assert env["HOME"] == env["TMPDIR"]


def test_each_program_has_a_private_working_folder(sandbox: Sandbox) -> None:
    program = "import os\nprint(os.getcwd(), sorted(os.listdir('.')))\nopen('note.txt', 'w').write('hi')"
    # Three programs in one sandbox, then one in another: none sees the note of the one before it.
    results = [*sandbox.run_jobs([(program, "")] * 3, max_workers=1), sandbox.run(program)]
    assert all(r.ok for r in results)
    assert all("note.txt" not in r.stdout for r in results)


def test_output_is_captured_in_memory_the_program_cannot_redirect(sandbox: Sandbox) -> None:
    program = (
        "import os\nprint('honest', flush=True)\nos.close(1)\n"
        "os.open('/tmp/out', os.O_CREAT | os.O_WRONLY)\nprint('lost')"
    )
    result = sandbox.run(program)
    assert result.stdout == "honest\n"


def test_extra_paths_make_a_module_importable(tmp_path: Path) -> None:
    (tmp_path / "calc_helper.py").write_text("def addition(a, b):\n    return a + b\n")
    program = "from calc_helper import addition\nprint(addition(2, 3))"
    assert Sandbox(extra_paths=[tmp_path]).run(program).stdout == "5\n"
    without = Sandbox().run(program)
    assert not without.ok
    assert "ModuleNotFoundError" in without.stderr


def test_installed_packages_are_not_importable(sandbox: Sandbox) -> None:
    for name in ("dgrpo", "torch", "msgpack"):  # installed in the node's environment, not the sandbox's
        result = sandbox.run(f"import {name}")
        assert not result.ok
        assert "ModuleNotFoundError" in result.stderr


def test_program_cannot_signal_host_processes(sandbox: Sandbox) -> None:
    victim = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    try:
        result = sandbox.run(f"import os, signal\nos.kill({victim.pid}, signal.SIGKILL)")
        assert not result.ok  # the pid does not exist in the program's namespace
        assert "ProcessLookupError" in result.stderr
        assert victim.poll() is None
    finally:
        victim.kill()
        victim.wait()


def test_run_many_preserves_order(sandbox: Sandbox) -> None:
    # Decreasing amounts of work, so later programs tend to finish first.
    sources = [f"print(sum(range({(8 - i) * 200_000})) % 1000, {i})" for i in range(8)]
    results = sandbox.run_many(sources, max_workers=4)
    assert [r.stdout.split()[1] for r in results] == [str(i) for i in range(8)]
    assert all(r.ok for r in results)
    assert sandbox.run_many([]) == []


def test_run_many_rejects_a_nonsense_worker_count(sandbox: Sandbox) -> None:
    with pytest.raises(ConfigError):
        sandbox.run_many(["pass"], max_workers=0)


def test_hostile_source_text_is_a_verdict(sandbox: Sandbox) -> None:
    assert not sandbox.run("\ud800 = 1").ok  # a lone surrogate cannot even be encoded
    assert not sandbox.run("x = 1\x00").ok


def test_trivial_program_is_fast(sandbox: Sandbox) -> None:
    durations = sorted(sandbox.run("print(1)").wall_seconds for _ in range(5))
    assert durations[2] < 0.5  # measured ~25 ms here; the bound only catches a pathological regression


@pytest.mark.parametrize(
    "kwargs",
    [
        {"cpu_seconds": 0},
        {"cpu_seconds": -1.0},
        {"wall_seconds": float("nan")},
        {"wall_seconds": float("inf")},
        {"memory_bytes": 1024},
        {"max_processes": 0},
        {"max_output_bytes": 0},
        {"max_output_bytes": 2 * 1024 * 1024, "max_file_bytes": 1024 * 1024},
        {"max_processes": True},
    ],
)
def test_nonsense_limits_are_config_errors(kwargs: dict[str, object]) -> None:
    with pytest.raises(ConfigError):
        SandboxLimits(**kwargs)  # type: ignore[arg-type]


def test_missing_extra_path_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError):
        Sandbox(extra_paths=[tmp_path / "absent"])


def test_capabilities_describe_the_mechanisms(capabilities: dict[str, bool | str | int]) -> None:
    assert capabilities["probe_ok"] is True
    assert capabilities["isolation"] == "bwrap"
    for key in ("user_namespace", "mount_namespace", "pid_namespace", "net_namespace", "ipc_namespace"):
        assert capabilities[key] is True
    for key in ("fresh_proc", "no_capabilities", "no_new_privs", "read_only_root", "seccomp", "sandbox_seccomp"):
        assert capabilities[key] is True
    if os.geteuid() == 0:
        assert capabilities["sandbox_uid"] == 65534


@pytest.mark.parametrize(
    ("event", "args", "refuse_exec", "refuse_fork", "refused"),
    [
        ("socket.__new__", (None, socket.AF_INET, socket.SOCK_STREAM, 0), False, False, True),
        ("socket.__new__", (None, socket.AF_UNIX, socket.SOCK_STREAM, 0), False, False, False),
        ("socket.connect", (None, ("127.0.0.1", 80)), False, False, True),
        ("os.fork", (), False, False, False),
        ("os.fork", (), False, True, True),
        ("subprocess.Popen", ("ls", [], None, None), False, False, False),
        ("subprocess.Popen", ("ls", [], None, None), True, False, True),
        ("ctypes.dlopen", (None,), False, False, True),
        ("ctypes.string_at", (0, 8), False, False, True),
        ("gc.get_objects", (None,), False, False, True),
        ("gc.get_referrers", ((),), False, False, True),
        ("sys._current_frames", (), False, False, True),
        ("sys.settrace", (None,), False, False, True),
        ("open", ("x", "r", 0), True, True, False),
        ("open", ("/proc/1/mem", "r", 0), False, False, True),
        ("open", ("/proc/self/pagemap", "r", 0), False, False, True),
        ("open", (3, "r", 0), False, False, False),
    ],
)
def test_audit_hook_policy(
    event: str, args: tuple[object, ...], refuse_exec: bool, refuse_fork: bool, refused: bool
) -> None:
    hook = audit_hook(refuse_exec=refuse_exec, refuse_fork=refuse_fork)
    if refused:
        with pytest.raises(PermissionError):
            hook(event, args)
    else:
        hook(event, args)


def test_a_program_may_fork_and_exec_inside_the_sandbox(sandbox: Sandbox) -> None:
    result = sandbox.run(
        "import os, subprocess, sys\npid = os.fork()\nif pid == 0:\n    os._exit(0)\nos.waitpid(pid, 0)\n"
        "print(subprocess.run([sys.executable, '-c', 'print(7)'], capture_output=True, text=True).stdout.strip())"
    )
    assert result.ok
    assert result.stdout == "7\n"


# ---------------------------------------------------------------------------------------------- no isolation
@pytest.fixture
def no_bwrap(monkeypatch: pytest.MonkeyPatch) -> None:
    """This process sees no bubblewrap (and forgets the launcher it probed)."""
    monkeypatch.setattr(sandbox_module, "find_bwrap", lambda: None)
    sandbox_module._bwrap_launcher.cache_clear()
    yield
    sandbox_module._bwrap_launcher.cache_clear()


@pytest.mark.usefixtures("no_bwrap")
def test_without_bubblewrap_code_tasks_refuse_to_start() -> None:
    from dgrpo.tasks import get_task

    with pytest.raises(SandboxUnavailableError, match="bubblewrap") as info:
        get_task("arith-code")
    assert "--unsafe-weak-sandbox" in str(info.value)


@pytest.mark.usefixtures("no_bwrap")
def test_the_weak_sandbox_needs_the_flag_and_says_so_loudly(caplog: pytest.LogCaptureFixture) -> None:
    from dgrpo.tasks import get_task
    from dgrpo.tasks.arith_code import make_prompt

    with caplog.at_level("WARNING"):
        task = get_task("arith-code", unsafe_weak_sandbox=True)
    assert any("UNSAFE" in r.getMessage() for r in caplog.records)
    assert not task.sandbox.isolated  # type: ignore[attr-defined]
    prompt = make_prompt("sum", 345, 78)
    completions = ["print(345+78)", "print(1)", "import sys; print(423); sys.exit(1)"]
    assert task.rewards(prompt, completions) == [1.0, 0.0, 0.0]


# A child interpreter (no audit hook) tries an AF_INET socket: only the seccomp filter, which a child
# inherits, refuses it where no network namespace could be made.
INET_FROM_A_CHILD = (
    "import subprocess, sys\n"
    'code = \'import socket\\ntry:\\n    socket.socket(socket.AF_INET)\\n    print("made")\\n'
    'except OSError as e:\\n    print("refused", e.errno)\'\n'
    "print(subprocess.run([sys.executable, '-S', '-c', code], capture_output=True, text=True).stdout.strip())"
)


def test_the_weak_direct_runner_still_applies_limits_seccomp_and_function_jobs() -> None:
    limits = SandboxLimits(cpu_seconds=1.0, wall_seconds=2.0)
    tests = "def check(candidate):\n    assert candidate(2) == 3\n"
    jobs = [
        ("print(6 * 7)", ""),
        ("import sys; sys.exit(1)", ""),
        ("import time; time.sleep(30)", ""),
        ("x = bytearray(10 * 1024**3)", ""),
        FunctionJob("def f(x):\n    return x + 1\n", tests, "f"),
        FunctionJob("def f(x):\n    class A:\n        __eq__ = lambda s, o: True\n    return A()\n", tests, "f"),
    ]
    results, mechanisms = run_batch(DirectLauncher(), limits, [], jobs)
    assert [r.ok for r in results] == [True, False, False, False, True, False]
    assert results[0].stdout == "42\n"
    assert results[2].limit == "wall"
    assert results[3].limit == "memory"
    assert mechanisms["no_new_privs"] is True
    assert mechanisms["seccomp"] is True
    [inet], _ = run_batch(DirectLauncher(), limits, [], [(INET_FROM_A_CHILD, "")])
    if mechanisms["net_namespace"]:  # as root: the audit hook lets the child run; seccomp still refuses
        assert inet.stdout.strip() == f"refused {1}", inet
