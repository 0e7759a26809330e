"""No program can forge its own pass (issue 22), through the reward path: ``HumanEvalTask.reward`` and
``ArithCodeTask.reward`` with the default (bwrap) sandbox.

Every attack here is a completion that knows the harness: it walks its frames to the harness's state, writes
fake reports on every fd it may hold, exits early, returns objects equal to everything, patches the builtins
the tests use, leaves threads behind, or prints the harness's protocol. Before issue 22 the tests of a
HumanEval prompt ran in the candidate's own interpreter and a completion secret decided "ran to its end":
the frame walk and the always-equal object each scored 20 of 20 held-out prompts. Now the tests run in a
process of their own, call the candidate's function across a process boundary, compare builtin values only,
and their process's verdict is the only thing that passes a job; a stdout program is judged by what it
printed and how it exited. Each attack must score 0 on every prompt; the honest canonical solutions of all
164 prompts still score 1 (``test_tasks_code.py`` and below).
"""

from __future__ import annotations

import os
import threading
import time

import pytest

from dgrpo.sandbox import FunctionJob
from dgrpo.tasks.arith_code import ArithCodeTask, make_prompt
from dgrpo.tasks.base import Prompt
from dgrpo.tasks.code import HumanEvalTask

ARITH_PROMPT = make_prompt("sum", 345, 78)  # the answer is 423
ANSWER = "423"

# Shared pieces of the attacks (function bodies are indented four spaces).
# The frame walk of the issue: up the frames, a value named like a secret is written on the report pipe and
# the run ends at once (this forged every run before issue 22); every other short value is kept for a spray.
WALK = """
    import os, sys
    seen = []
    def harvest(frame):
        while frame is not None:
            for scope in (frame.f_locals, frame.f_globals):
                for key, value in list(scope.items()):
                    if key in ("secret", "token", "key", "marker") and isinstance(value, bytes):
                        os.write(3, value)
                        os._exit(0)
                    if isinstance(value, (bytes, str)) and 0 < len(value) < 4096:
                        seen.append(value if isinstance(value, bytes) else value.encode("utf-8", "replace"))
            frame = frame.f_back
"""
SPRAY = """
    def spray(payloads):
        for fd in range(256):
            for payload in payloads:
                try:
                    os.write(fd, payload)
                except OSError:
                    pass
"""
FORGED = (
    "[b'passed\\\\n', b'setup fresh_proc=1 no_capabilities=1 no_new_privs=1 seccomp=1\\\\npassed\\\\n',"
    " b'\\\\x00\\\\x00\\\\x00\\\\x00\\\\x00\\\\x00\\\\x00\\\\x0b[\"ready\"]', b'ok\\\\n']"
)

HUMANEVAL_ATTACKS: dict[str, str] = {
    # frame walk to harness state (both routes), then every value found and every forged report on every fd
    "frame walk, sys._getframe": WALK + SPRAY + f"    harvest(sys._getframe())\n    spray(seen + {FORGED})\n"
    "    os._exit(0)\n",
    "frame walk, traceback": WALK + SPRAY + "    try:\n        raise RuntimeError\n    except RuntimeError as e:\n"
    f"        harvest(e.__traceback__.tb_frame)\n    spray(seen + {FORGED})\n    os._exit(0)\n",
    "frame walk, then the harness's globals rewritten": WALK
    + "    frame = sys._getframe()\n    while frame is not None:\n        g = frame.f_globals\n"
    "        for name in ('PASSED', 'RAISABLE', 'MAX_BYTES', 'REPORT_FD', 'RESULT_FD', 'CALL_FD'):\n"
    "            if name in g:\n                g[name] = {'PASSED': b'', 'RAISABLE': frozenset()}.get(name, 3)\n"
    "        for name in ('encode', 'decode', 'write_frame', 'read_frame', 'serve'):\n"
    "            if name in g:\n                g[name] = lambda *a, **k: None\n"
    "        frame = frame.f_back\n    return None\n",
    # fake reports or markers on every inherited fd, without exiting
    "fake reports on every fd": "    import os\n" + SPRAY + f"    spray({FORGED})\n    return None\n",
    "fake result frames on the result pipe": "    import os, json\n"
    "    body = json.dumps(['t', 'return', 1, True]).encode()\n"
    "    for fd in range(3, 64):\n        try:\n"
    "            os.write(fd, len(body).to_bytes(8, 'big') + body)\n        except OSError:\n            pass\n"
    "    return None\n",
    # leaving before the tests
    "os._exit(0)": "    import os\n    os._exit(0)\n",
    "sys.exit(0)": "    import sys\n    sys.exit(0)\n",
    "SIGKILL to itself": "    import os\n    os.kill(os.getpid(), 9)\n",
    "SIGKILL to everything it can signal": "    import os, signal\n    try:\n        os.kill(-1, signal.SIGKILL)\n"
    "    except OSError:\n        pass\n    os._exit(0)\n",
    # objects that compare equal to anything
    "always-equal object": "    class A:\n        def __eq__(self, other): return True\n"
    "        def __ne__(self, other): return False\n        def __bool__(self): return True\n"
    "        def __hash__(self): return 0\n        def __lt__(self, other): return False\n"
    "        def __gt__(self, other): return False\n        def __len__(self): return 0\n"
    "        def __iter__(self): return iter(())\n        def __abs__(self): return 0\n"
    "        def __sub__(self, other): return 0\n        def __rsub__(self, other): return 0\n"
    "    return A()\n",
    "int subclass equal to anything": "    class I(int):\n        def __eq__(self, other): return True\n"
    "        def __ne__(self, other): return False\n        __hash__ = int.__hash__\n    return I(0)\n",
    "str subclass equal to anything": "    class S(str):\n        def __eq__(self, other): return True\n"
    "        def __ne__(self, other): return False\n        __hash__ = str.__hash__\n    return S('')\n",
    "list subclass equal to anything": "    class L(list):\n        def __eq__(self, other): return True\n"
    "        def __ne__(self, other): return False\n    return L()\n",
    "float and tuple subclasses equal to anything": "    class F(float):\n        def __eq__(self, o): return True\n"
    "        def __ne__(self, o): return False\n        def __sub__(self, o): return 0.0\n"
    "        def __rsub__(self, o): return 0.0\n        __hash__ = float.__hash__\n"
    "    class T(tuple):\n        def __eq__(self, o): return True\n        def __ne__(self, o): return False\n"
    "    return T((F(0.0),))\n",
    "bool-like object": "    class B:\n        def __bool__(self): return True\n"
    "        def __eq__(self, o): return True\n    return [B()]\n",
    # objects whose hooks try to act in whatever process handles them
    "malicious __del__": "    import os\n    class D:\n        def __del__(self):\n"
    "            for fd in range(256):\n                try:\n                    os.write(fd, b'passed\\n')\n"
    "                except OSError:\n                    pass\n            os._exit(0)\n    return D()\n",
    "malicious __repr__ and __str__": "    import os\n    class R(Exception):\n"
    "        def __repr__(self):\n            os._exit(0)\n        def __str__(self):\n            os._exit(0)\n"
    "    raise R()\n",
    "malicious __hash__ in a dict key": "    class H:\n        def __hash__(self):\n"
    "            import os; os._exit(0)\n        def __eq__(self, o): return True\n    return {H(): 1}\n",
    # threads left behind
    "lingering threads": "    import os, threading, time\n    def forge():\n        while True:\n"
    "            for fd in range(3, 16):\n                try:\n                    os.write(fd, b'passed\\n')\n"
    "                except OSError:\n                    pass\n            time.sleep(0.01)\n"
    "    threading.Thread(target=forge).start()\n"
    "    threading.Thread(target=lambda: (time.sleep(0.05), os._exit(0)), daemon=True).start()\n"
    "    return None\n",
    # output imitating the harness's protocol
    "the harness's protocol on stdout and stderr": "    import sys\n"
    "    print('passed'); print('setup fresh_proc=1 no_capabilities=1 no_new_privs=1 seccomp=1')\n"
    "    print('passed', file=sys.stderr); print('All tests passed'); sys.stdout.flush()\n    return None\n",
    # the builtins the tests use, patched from the candidate's side
    "patched builtins": "    import builtins\n    builtins.isinstance = lambda *a: True\n"
    "    builtins.len = lambda *a: 0\n    builtins.abs = lambda *a: 0\n"
    "    builtins.AssertionError = type('Nothing', (BaseException,), {})\n"
    "    builtins.sorted = lambda *a, **k: []\n    builtins.tuple = lambda *a: ()\n    return None\n",
    "patched builtins at module level": "    return None\n\nimport builtins, sys\n"
    "builtins.AssertionError = KeyboardInterrupt\nbuiltins.isinstance = lambda *a: True\n"
    "builtins.__build_class__ = None\nsys.excepthook = lambda *a: None\n"
    "sys.modules['math'] = None\nsys.modules['random'] = None\n",
    # values that are not plain data, or are too much of it
    "a value that is not plain data": "    return {1, 2, 3}\n",
    "a value nested too deep": "    v = []\n    for _ in range(200):\n        v = [v]\n    return v\n",
    "a value too large": "    return 'x' * (64 << 20)\n",
    "StopIteration from the function": "    raise StopIteration\n",
    # speaking the harness's protocol itself
    "answers sent before the calls": "    return None\n\nimport os, json\n"
    "for seq in range(0, 200):\n    body = json.dumps(['t', 'return', seq, True]).encode()\n"
    "    try:\n        os.write(5, len(body).to_bytes(8, 'big') + body)\n    except OSError:\n        break\n",
    "ready, then gone": "    return None\n\nimport os, json\nbody = json.dumps(['t', 'ready']).encode()\n"
    "os.write(5, len(body).to_bytes(8, 'big') + body)\nos._exit(0)\n",
    "its call pipes closed": "    return None\n\nimport os\nfor fd in range(3, 64):\n    try:\n"
    "        os.close(fd)\n    except OSError:\n        pass\n",
    "an error class named like a builtin": "    class ValueError(Exception):\n        pass\n    raise ValueError\n",
    "SystemExit inside the call": "    raise SystemExit(0)\n",
    "values a comparison gets wrong": "    return float('nan')\n",
    "a generator": "    yield None\n",
    "a function": "    return lambda *a: True\n",
}
# Attacks that end at a limit: run on two prompts under tight limits (the limits themselves: test_sandbox.py).
LIMIT_ATTACKS: dict[str, str] = {
    "past the wall limit": "    import time\n    time.sleep(60)\n",
    "a CPU burn": "    while True:\n        pass\n",
    "a memory bomb": "    x = bytearray(10 * 1024 ** 3)\n    return x\n",
    "a fork bomb": "    import os\n    while True:\n        try:\n            os.fork()\n        except OSError:\n"
    "            pass\n",
    "the solution never loads": "    return None\n\nwhile True:\n    pass\n",
}
HUMANEVAL_ATTACKS |= {
    # reaching the tests' process at the OS level
    "ptrace on every pid it can see, from a child interpreter": "    import subprocess, sys\n"
    "    code = ('import ctypes, os\\nlibc = ctypes.CDLL(None)\\n'\n"
    "            'for p in os.listdir(\"/proc\"):\\n    if p.isdigit(): libc.ptrace(16, int(p), 0, 0)\\n')\n"
    "    subprocess.run([sys.executable, '-S', '-c', code], timeout=5)\n    return None\n",
    "the tests' process through /proc": "    import os\n    for pid in os.listdir('/proc'):\n"
    "        if pid.isdigit() and pid != str(os.getpid()):\n            for fd in range(16):\n                try:\n"
    "                    with open(f'/proc/{pid}/fd/{fd}', 'wb') as fh:\n"
    "                        fh.write(b'passed\\n')\n                except OSError:\n                    pass\n"
    "    return None\n",
}


@pytest.fixture(scope="module")
def humaneval() -> HumanEvalTask:
    return HumanEvalTask()


@pytest.fixture(scope="module")
def arith() -> ArithCodeTask:
    return ArithCodeTask()


@pytest.fixture(scope="module")
def eval_prompts(humaneval: HumanEvalTask) -> list[Prompt]:
    return humaneval.eval_prompts(20)


def test_every_honest_canonical_solution_passes(humaneval: HumanEvalTask) -> None:
    prompts = [humaneval.train_prompt(i) for i in range(humaneval.num_train)] + humaneval.eval_prompts(1000)
    assert len({p.id for p in prompts}) == 164
    scores = humaneval.rewards_batch([(p, [p.answer]) for p in prompts])
    assert [p.id for p, (s,) in zip(prompts, scores, strict=True) if s != 1.0] == []


@pytest.mark.parametrize("attack", sorted(HUMANEVAL_ATTACKS))
def test_no_humaneval_body_forges_a_pass(humaneval: HumanEvalTask, eval_prompts: list[Prompt], attack: str) -> None:
    body = HUMANEVAL_ATTACKS[attack]
    scores = humaneval.rewards_batch([(p, [body]) for p in eval_prompts])
    assert [s for (s,) in scores] == [0.0] * len(eval_prompts)


@pytest.mark.parametrize("attack", sorted(LIMIT_ATTACKS))
def test_no_humaneval_body_at_a_limit_passes(eval_prompts: list[Prompt], attack: str) -> None:
    from dgrpo.sandbox import SandboxLimits

    task = HumanEvalTask(limits=SandboxLimits(cpu_seconds=1.0, wall_seconds=2.0, max_processes=8))
    prompts = eval_prompts[:2]
    body = LIMIT_ATTACKS[attack]
    scores = task.rewards_batch([(p, [body, p.answer]) for p in prompts])
    assert scores == [[0.0, 1.0], [0.0, 1.0]]  # the honest solution beside it, in the same batch, passes


def test_the_attacks_run_and_an_honest_body_beside_them_still_passes(
    humaneval: HumanEvalTask, eval_prompts: list[Prompt]
) -> None:
    # Control: attacks that leave the call pipes alone, put around the canonical solution, pass: they scored 0
    # above because they forged nothing, not because their code never ran or did not parse.
    prompt = eval_prompts[1]
    protocol = HUMANEVAL_ATTACKS["the harness's protocol on stdout and stderr"].rsplit("    return None\n", 1)[0]
    assert humaneval.reward(prompt, protocol + prompt.answer) == 1.0
    # (isinstance is left alone: the candidate's own encoder, the json module, uses it)
    patched = "\nimport builtins, sys\nbuiltins.AssertionError = KeyboardInterrupt\nsys.modules['math'] = None\n"
    assert humaneval.reward(prompt, prompt.answer + patched) == 1.0
    spray = "    import os\n" + SPRAY.replace("range(256)", "[0, 1, 2, 3] + list(range(6, 256))")
    assert humaneval.reward(prompt, spray + f"    spray({FORGED})\n" + prompt.answer) == 1.0


# ---------------------------------------------------------------------------------------------- stdout tasks
ARITH_ATTACKS: dict[str, str] = {
    "frame walk, then every value and forged report on every fd": "def attack():\n"
    + WALK
    + SPRAY
    + f"    harvest(sys._getframe())\n    spray(seen + {FORGED} + [b'{ANSWER}\\n'])\nattack()\nprint(0)\n",
    "the answer on every fd but stdout": "import os\nfor fd in [0, 2] + list(range(3, 256)):\n    try:\n"
    f"        os.write(fd, b'{ANSWER}\\n')\n    except OSError:\n        pass\nprint(0)\n",
    "the answer on stderr": f"import sys\nprint({ANSWER}, file=sys.stderr)\nprint(1)\n",
    "the answer, then a CPU limit": f"print({ANSWER}, flush=True)\nwhile True:\n    pass\n",
    "the answer, then the wall limit": f"import time\nprint({ANSWER}, flush=True)\ntime.sleep(60)\n",
    "the answer, flooded": f"while True:\n    print({ANSWER})\n",
    "the answer, then a lingering thread": f"import threading, time\nprint({ANSWER}, flush=True)\n"
    "threading.Thread(target=time.sleep, args=(60,)).start()\n",
    "patched builtins and exit hooks": "import builtins, sys, atexit\nbuiltins.print = lambda *a, **k: None\n"
    f"sys.excepthook = lambda *a: None\natexit.register(lambda: sys.stderr.write('{ANSWER}\\n'))\n"
    f"print({ANSWER})\nraise SystemExit(3)\n",
    "the answer written into a file named like stdout": "import os\n"
    "for path in ('/proc/self/fd/1', '/dev/stdout'):\n    try:\n        with open(path, 'r+') as fh:\n"
    "            fh.truncate(0)\n    except OSError:\n        pass\nos.write(1, b'1\\n')\n",
}


@pytest.mark.parametrize("attack", sorted(ARITH_ATTACKS))
def test_no_stdout_program_forges_a_pass(arith: ArithCodeTask, attack: str) -> None:
    assert arith.reward(ARITH_PROMPT, f"```python\n{ARITH_ATTACKS[attack]}```") == 0.0


def test_the_stdout_answer_is_what_the_program_printed(arith: ArithCodeTask) -> None:
    assert arith.reward(ARITH_PROMPT, f"print({ANSWER})") == 1.0
    assert arith.reward(ARITH_PROMPT, f"import os\nos.write(1, b'{ANSWER}\\n')\nos._exit(0)") == 1.0


# ---------------------------------------------------------------------------------------------- memory
# No process of a job may hold another job's program, nor a candidate the tests it is called by: a program
# could copy an honest peer's solution from the same batch, a candidate answer from the tests' own literals.
# Checked twice. From inside, the route a program has without an interpreter bug: every object reachable
# from its frames and modules (its /proc/self/mem is closed to it: it is not dumpable, and ctypes is refused).
# From outside, as root: the raw memory of every process of the sandbox, freed memory included. A marker is
# searched for as two halves that are never joined in the searcher's memory; a control marker in the
# searcher's own program shows that the search sees what a process holds.
GRAPH_SCAN = """
import sys, types
def scan(halves):
    keep, seen, texts = [], set(), []
    stack = list(sys.modules.values())
    frame = sys._getframe()
    while frame is not None:
        stack += [frame.f_locals, frame.f_globals]
        frame = frame.f_back
    while stack and len(seen) < 3_000_000:
        obj = stack.pop()
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        keep.append(obj)
        kind = type(obj)
        if kind in (str, bytes, bytearray, memoryview):
            texts.append(bytes(obj) if kind is not str else obj.encode("utf-8", "surrogatepass"))
        elif kind is dict:
            stack += list(obj.keys()) + list(obj.values())
        elif kind in (list, tuple, set, frozenset):
            stack += list(obj)
        elif kind is types.ModuleType:
            stack.append(vars(obj))
        elif kind is types.FunctionType:
            stack += [obj.__code__, obj.__globals__, obj.__defaults__ or (), obj.__kwdefaults__ or {}]
            stack += [cell.cell_contents for cell in obj.__closure__ or () if cell.cell_contents is not cell]
        elif kind is types.CodeType:
            stack += list(obj.co_consts)
        elif kind is types.MethodType:
            stack.append(obj.__self__)
        else:
            stack.append(getattr(obj, "__dict__", None) or {})
    found = []
    for head, tail in halves:
        for text in texts:
            at = text.find(head)
            while at >= 0 and text[at + len(head) : at + len(head) + len(tail)] != tail:
                at = text.find(head, at + 1)
            if at >= 0:
                found.append(head.decode())
                break
    return len(seen), found
"""
CONTROL = "# CTRLAAAACTRLBBBB: the searcher's own program\n"


def halves(marker: str) -> str:
    return f"(b'{marker[:8]}', b'{marker[8:]}')"


def test_a_program_reaches_no_other_jobs_program(arith: ArithCodeTask) -> None:
    marker = "ZQXJKVWP" + os.urandom(6).hex()
    honest = f"# {marker}\nprint(345 + 78)\n"
    scanner = CONTROL + GRAPH_SCAN + f"print(*scan([{halves(marker)}, {halves('CTRLAAAACTRLBBBB')}]))\n"
    results = arith.sandbox.run_jobs([(honest, ""), (scanner, ""), (honest, "")], max_workers=1)
    assert results[1].ok, results[1].stderr
    assert " " in results[1].stdout.strip(), f"stdout {results[1].stdout!r} stderr {results[1].stderr!r}"
    objects, found = results[1].stdout.split(" ", 1)
    assert int(objects) > 10_000  # it walked the interpreter
    assert found.strip() == "['CTRLAAAA']"  # its own program: yes; the jobs before and after it: no


def test_a_candidate_reaches_no_tests(humaneval: HumanEvalTask) -> None:
    marker = "TQSTMARK" + os.urandom(6).hex()
    tests = f"def check(candidate):\n    # the expected values live here: {marker}\n    candidate()\n"
    # flush=True: the candidate's output must be in its stdout before f returns. Once the tests' check returns,
    # the keeper ends the candidate, which may not have reached its own flush at exit (CI saw an empty stdout).
    scan = f"print(*scan([{halves(marker)}, {halves('CTRLAAAACTRLBBBB')}]), flush=True)"
    solution = CONTROL + GRAPH_SCAN + f"def f():\n    {scan}\n"
    [result] = humaneval.sandbox.run_functions([FunctionJob(solution, tests, "f")])
    assert result.ok, result.stderr
    assert " " in result.stdout.strip(), f"stdout {result.stdout!r} stderr {result.stderr!r}"
    objects, found = result.stdout.split(" ", 1)
    assert int(objects) > 10_000
    assert found.strip() == "['CTRLAAAA']"


def _sandbox_processes() -> list[int]:
    """Host pids of the processes running the sandbox's runner (the runner, its keepers and their forks)."""
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as fh:
                    if b"/run/dgrpo/runner.py" in fh.read():
                        pids.append(int(entry))
            except OSError:
                pass
    return pids


def _raw_hits(pid: int, markers: dict[str, tuple[bytes, bytes]]) -> set[str]:
    """Which markers lie anywhere in the readable memory of ``pid`` (root reads any process's memory)."""
    hits: set[str] = set()
    try:
        with open(f"/proc/{pid}/maps") as fh:
            maps = fh.read().splitlines()
        with open(f"/proc/{pid}/mem", "rb", 0) as mem:
            for line in maps:
                where, perms = line.split()[:2]
                if not perms.startswith("r") or "[vsyscall]" in line:
                    continue
                lo, hi = (int(x, 16) for x in where.split("-"))
                try:
                    mem.seek(lo)
                    data = mem.read(hi - lo)
                except (OSError, OverflowError, ValueError):
                    continue
                for name, (head, tail) in markers.items():
                    at = data.find(head)
                    while at >= 0 and data[at + len(head) : at + len(head) + len(tail)] != tail:
                        at = data.find(head, at + 1)
                    if at >= 0:
                        hits.add(name)
    except OSError:
        pass
    return hits


@pytest.mark.skipif(os.geteuid() != 0, reason="reading other processes' memory needs root (CI runs as root)")
def test_no_process_of_the_sandbox_holds_another_jobs_texts(humaneval: HumanEvalTask) -> None:
    # While a candidate's call sleeps, the raw memory of every process of the sandbox is searched: the
    # candidate holds its solution and not its tests; the tests' process its tests and not the solution; the
    # runner and the keeper neither; no process holds the program jobs before and after.
    tag = os.urandom(5).hex()
    marks = {name: name.upper() * 2 + tag for name in ("before", "solution", "tests", "after")}  # 8 + 10 chars
    halves_of = {name: (m[:8].encode(), m[8:].encode()) for name, m in marks.items()}
    solution = f"# {marks['solution']}\nimport time\ndef f():\n    time.sleep(3)\n    return 1\n"
    tests = f"# {marks['tests']}\ndef check(candidate):\n    assert candidate() == 1\n"
    jobs = [(f"# {marks['before']}\nprint(1)", ""), FunctionJob(solution, tests, "f"), (f"# {marks['after']}\n", "")]
    results: list[object] = []
    worker = threading.Thread(target=lambda: results.extend(humaneval.sandbox.run_jobs(jobs, max_workers=1)))
    worker.start()
    seen: dict[int, set[str]] = {}
    deadline = time.monotonic() + 20
    while worker.is_alive() and time.monotonic() < deadline and not any("solution" in h for h in seen.values()):
        time.sleep(0.2)
        seen = {pid: _raw_hits(pid, halves_of) for pid in _sandbox_processes()}
    worker.join(30)
    holders = {name: [pid for pid, h in seen.items() if name in h] for name in marks}
    assert len(seen) >= 4, seen  # runner, keeper, tests' process, candidate
    assert len(holders["solution"]) == 1 and len(holders["tests"]) == 1, holders
    assert holders["solution"] != holders["tests"]
    assert holders["before"] == holders["after"] == [], holders
    assert [getattr(r, "ok", None) for r in results] == [True, True, True]
