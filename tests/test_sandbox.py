"""The subprocess sandbox: normal runs, every limit, cleanup, and isolation from the parent."""

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
from dgrpo.tasks.sandbox import Sandbox, SandboxLimits
from dgrpo.tasks.sandbox_runner import audit_hook

FAST = SandboxLimits(cpu_seconds=1.0, wall_seconds=2.0)


@pytest.fixture(scope="module")
def sandbox() -> Sandbox:
    return Sandbox()


@pytest.fixture(scope="module")
def capabilities(sandbox: Sandbox) -> dict[str, bool | str]:
    return sandbox.capabilities()


def _process_groups() -> dict[int, int]:
    """pid -> process group of every process on the machine (zombies included)."""
    groups: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue  # exited while we looked
        fields = stat.rpartition(")")[2].split()  # the command name may hold spaces and parentheses
        groups[int(entry)] = int(fields[2])
    return groups


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


def test_sys_exit_codes_are_kept(sandbox: Sandbox) -> None:
    assert sandbox.run("import sys\nsys.exit(3)").returncode == 3
    assert sandbox.run("import sys\nsys.exit(0)").ok
    assert not sandbox.run("import sys\nsys.exit('message')").ok


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


def test_fork_bomb_is_contained_and_cleaned_up(sandbox: Sandbox, capabilities: dict[str, bool | str]) -> None:
    # The program reports its host pid (its process group id: every bomb process inherits it) and cgroup.
    program = (
        "import os\n"
        "cgroup = [l for l in open('/proc/self/cgroup').read().splitlines() if ':pids:' in l]\n"
        "print(os.readlink('/proc/self'), cgroup[0].split(':')[2] if cgroup else '-', flush=True)\n"
        "while True: os.fork()\n"
    )
    started = time.monotonic()
    result = sandbox.run(program)
    elapsed = time.monotonic() - started
    assert not result.ok
    assert elapsed < sandbox.limits.wall_seconds + 2
    host_pid, cgroup_path = result.stdout.split()[:2]
    leftovers = [pid for pid, group in _process_groups().items() if group == int(host_pid)]
    assert leftovers == []
    if capabilities["pids_cgroup"]:
        assert result.limit == "processes"
        assert "dgrpo-sandbox-" in cgroup_path
        assert not (Path(str(capabilities["cgroup_dir"])) / cgroup_path.lstrip("/")).exists()


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


def test_environment_is_scrubbed(sandbox: Sandbox, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DGRPO_SANDBOX_CANARY", "leaked-secret")
    result = sandbox.run("import json, os\nprint(json.dumps(dict(os.environ)))")
    assert result.ok
    env = json.loads(result.stdout)
    assert "DGRPO_SANDBOX_CANARY" not in env
    assert "leaked-secret" not in result.stdout
    assert set(env) == {"PATH", "HOME", "TMPDIR", "LANG", "PYTHONDONTWRITEBYTECODE", "PYTHONHASHSEED"}
    assert env["PATH"] == "/usr/bin:/bin"


def test_cwd_is_a_fresh_temp_dir_removed_afterwards(sandbox: Sandbox) -> None:
    program = "import os\nopen('note.txt', 'w').write('hi')\nprint(os.getcwd())\nprint(os.listdir('.'))"
    first, second = sandbox.run(program), sandbox.run(program)
    assert first.ok and second.ok
    cwd_first, cwd_second = first.stdout.splitlines()[0], second.stdout.splitlines()[0]
    assert cwd_first != cwd_second
    assert Path(cwd_first).resolve() != Path.cwd().resolve()
    assert "note.txt" in first.stdout
    assert not Path(cwd_first).exists()
    assert not Path(cwd_second).exists()


def test_output_is_read_from_the_parents_descriptor_not_the_name(sandbox: Sandbox, tmp_path: Path) -> None:
    secret = tmp_path / "secret.txt"
    secret.write_text("top secret contents")
    program = f"import os\nprint('honest')\nos.remove('stdout')\nos.symlink({str(secret)!r}, 'stdout')\n"
    result = sandbox.run(program)
    assert "top secret" not in result.stdout
    assert result.stdout == "honest\n"


def test_extra_paths_make_a_module_importable(tmp_path: Path) -> None:
    (tmp_path / "calc_helper.py").write_text("def addition(a, b):\n    return a + b\n")
    program = "from calc_helper import addition\nprint(addition(2, 3))"
    assert Sandbox(extra_paths=[tmp_path]).run(program).stdout == "5\n"
    without = Sandbox().run(program)
    assert not without.ok
    assert "ModuleNotFoundError" in without.stderr


def test_installed_packages_are_not_importable(sandbox: Sandbox) -> None:
    result = sandbox.run("import dgrpo")  # installed in the parent's environment, not the sandbox's
    assert not result.ok
    assert "ModuleNotFoundError" in result.stderr


def test_program_cannot_signal_host_processes(sandbox: Sandbox, capabilities: dict[str, bool | str]) -> None:
    victim = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    try:
        result = sandbox.run(f"import os, signal\nos.kill({victim.pid}, signal.SIGKILL)")
        if capabilities["pid_namespace"]:
            assert not result.ok  # the pid does not exist in the program's namespace
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


def test_capabilities_describe_the_mechanisms(capabilities: dict[str, bool | str]) -> None:
    assert capabilities["probe_ok"] is True
    for key in ("rlimits", "audit_hook", "fresh_tempdir", "scrubbed_env", "pid_namespace", "net_namespace"):
        assert isinstance(capabilities[key], bool)
    if os.geteuid() == 0:
        assert capabilities["rlimit_nproc_enforced"] is False


@pytest.mark.parametrize(
    ("event", "args", "no_netns", "unbounded", "refused"),
    [
        ("socket.__new__", (None, socket.AF_INET, socket.SOCK_STREAM, 0), False, False, True),
        ("socket.__new__", (None, socket.AF_UNIX, socket.SOCK_STREAM, 0), False, False, False),
        ("socket.connect", (None, ("127.0.0.1", 80)), False, False, True),
        ("os.fork", (), False, False, False),
        ("os.fork", (), False, True, True),
        ("subprocess.Popen", ("ls", [], None, None), False, False, False),
        ("subprocess.Popen", ("ls", [], None, None), True, False, True),
        ("ctypes.dlopen", (None,), True, False, True),
        ("ctypes.dlopen", (None,), False, True, True),
        ("open", ("x", "r", 0), True, True, False),
    ],
)
def test_audit_hook_policy(
    event: str, args: tuple[object, ...], no_netns: bool, unbounded: bool, refused: bool
) -> None:
    hook = audit_hook(no_netns=no_netns, unbounded_processes=unbounded)
    if refused:
        with pytest.raises(PermissionError):
            hook(event, args)
    else:
        hook(event, args)


def test_fork_is_allowed_exactly_when_processes_are_bounded(
    sandbox: Sandbox, capabilities: dict[str, bool | str]
) -> None:
    result = sandbox.run(
        "import os\npid = os.fork()\nif pid == 0:\n    os._exit(0)\nos.waitpid(pid, 0)\nprint('forked')"
    )
    assert result.ok is capabilities["processes_bounded"]
