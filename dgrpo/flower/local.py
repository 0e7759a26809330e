"""A whole Flower deployment on this machine: a ``SuperLink`` and one ``SuperNode`` per client, real processes
on 127.0.0.1 (Flower's deployment engine, insecure: loopback only), the app submitted with ``flwr run``, its
results read back, every process stopped.

    .venv/bin/dgrpo flower run fed-grpo --out runs/flower [-s key=value ...] [--engine simulation]

(``dgrpo flower run``, ``dgrpo/cli/flower.py``, prints each round as it ends; ``python -m dgrpo.flower.local``
still works, and prints one JSON line at the end.) ``--engine simulation`` is Flower's Ray simulation engine
(``dgrpo[flower-sim]``). The server app appends each round's row to ``metrics.jsonl`` as the round ends, so
the rounds of a run under way are read from there (:class:`MetricsTail`).

Flower 1.42 serves its Fleet, Control and ServerAppIo APIs on one HTTP port per SuperLink; each SuperNode has
its own port for its local runtime. The connection to submit to lives in ``$FLWR_HOME/config.toml``:
``FLWR_HOME`` is a folder of the run's own, so nothing lands in ``~/.flwr``. Flower starts
``flower-superexec``, ``flwr-serverapp`` and ``flwr-clientapp`` by name, so the environment's ``bin`` goes
first on ``PATH``; the SuperLink does not install the app's dependencies (they are this environment's).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from collections.abc import Callable
from contextlib import suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dgrpo.errors import ConfigError, DgrpoError
from dgrpo.flower.config import scenario_of
from dgrpo.simulations.summary import RunSummary, load_summary

APP_DIR = Path(__file__).resolve().parents[2] / "flower"  # the app folder `flwr run` packs (a source checkout)
BIN = Path(sys.executable).parent
CONNECTION = "local-deployment"


class DeploymentError(DgrpoError, RuntimeError):
    """The deployment did not start, or the run did not complete (a DgrpoError: one line on the command line,
    where Flower's logs say the rest)."""


ENGINES = ("deployment", "simulation")


def require_flower(engine: str) -> None:
    """A clear error where the extra an engine needs is missing, before any process is started (otherwise
    the first sign is a ``flwr`` binary not found, or a SuperLink that dies while starting)."""
    if engine not in ENGINES:
        raise ConfigError(f"unknown Flower engine {engine!r}; valid: {', '.join(ENGINES)}")
    if importlib.util.find_spec("flwr") is None or not (BIN / "flwr").exists():
        raise ConfigError(f"Flower is not installed in {BIN.parent}: pip install -e '.[flower]'")
    if engine == "simulation" and importlib.util.find_spec("ray") is None:
        raise ConfigError("Flower's simulation engine needs Ray: pip install -e '.[flower-sim]'")


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def chosen_port(port: int | None) -> int:
    """``port`` where it is free on 127.0.0.1 (else a one-line error, before anything starts), or a free one."""
    if port is None:
        return free_port()
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as a server binds: TIME_WAIT is no obstacle
        try:
            s.bind(("127.0.0.1", port))
        except OSError as exc:
            raise ConfigError(f"port {port} on 127.0.0.1 is not available ({exc.strerror}); pick another") from None
    return port


class MetricsTail:
    """The rows of ``metrics.jsonl`` not yet seen, as the server app appends them (one per round as it ends):
    ``poll()`` hands each complete new line to ``on_round``. A line still being written is left for the next
    poll."""

    def __init__(self, path: Path, on_round: Callable[[dict[str, Any]], None]) -> None:
        self.path = path
        self.on_round = on_round
        self.offset = 0

    def poll(self) -> None:
        try:
            with self.path.open("rb") as f:
                f.seek(self.offset)
                chunk = f.read()
        except FileNotFoundError:
            return
        complete = chunk[: chunk.rfind(b"\n") + 1]
        self.offset += len(complete)
        for line in complete.splitlines():
            if line.strip():
                self.on_round(json.loads(line))


def _healthy(url: str, timeout: float, procs: list[subprocess.Popen[bytes]]) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for p in procs:
            if p.poll() is not None:
                raise DeploymentError(f"{p.args!r} exited with {p.returncode} while starting")
        try:
            with urllib.request.urlopen(url, timeout=0.5) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.1)
    raise DeploymentError(f"{url} not healthy after {timeout:.0f}s")


def _tagged(tag: str) -> list[int]:
    """Live processes whose environment carries ``tag`` (the deployment's, inherited by all it started)."""
    needle = f"DGRPO_FLOWER_TAG={tag}".encode()
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                if needle in f.read().split(b"\0"):
                    out.append(int(entry))
        except OSError:
            continue
    return out


@dataclass
class Deployment:
    """A running local deployment; use as a context manager (:func:`deploy`)."""

    work: Path
    env: dict[str, str]
    tag: str
    superlink: str
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)
    timings: dict[str, float] = field(default_factory=dict)

    def flwr(self, *args: str, timeout: float = 120) -> dict[str, Any]:
        """``flwr <args> --format json``; its JSON answer (``flwr`` exits 0 on failure too: ``success`` says)."""
        done = subprocess.run(
            [str(BIN / "flwr"), *args, "--format", "json"],
            env=self.env, capture_output=True, text=True, timeout=timeout, cwd=self.work,
        )  # fmt: skip
        start = done.stdout.find("{")
        if start < 0:
            raise DeploymentError(f"flwr {' '.join(args)}: rc {done.returncode}\n{done.stdout}\n{done.stderr}")
        answer: dict[str, Any] = json.loads(done.stdout[start:])
        if not answer.get("success", False):
            raise DeploymentError(f"flwr {' '.join(args)}: {answer.get('error-message', answer)}")
        return answer

    def run(
        self,
        run_config: dict[str, Any],
        timeout: float = 1800,
        app: Path = APP_DIR,
        poll: Callable[[], None] | None = None,
    ) -> dict[str, Any]:
        """Submit the app with ``run_config`` (values as TOML literals), wait until it finishes; its status.
        ``poll()`` is called while waiting (about once a second) and once more at the end."""
        literal = " ".join(f"{k}={json.dumps(v)}" for k, v in run_config.items())
        t0 = time.monotonic()
        run_id = str(self.flwr("run", str(app), CONNECTION, "--run-config", literal)["run-id"])
        deadline = t0 + timeout
        while True:
            status: dict[str, Any] = self.flwr("ls", CONNECTION, "--run-id", run_id)["runs"][0]
            if poll is not None:
                poll()
            if str(status["status"]).startswith("finished"):
                break
            if time.monotonic() > deadline:
                raise DeploymentError(f"run {run_id} not finished after {timeout:.0f}s: {status}")
            time.sleep(1.0)
        self.timings["run_seconds"] = time.monotonic() - t0
        if poll is not None:
            poll()  # what the server app wrote between the last poll and the end
        logs = subprocess.run(
            [str(BIN / "flwr"), "log", run_id, CONNECTION, "--show"],
            env=self.env, capture_output=True, text=True, timeout=60, cwd=self.work,
        )  # fmt: skip
        (self.work / "logs" / f"serverapp-{run_id}.log").write_text(logs.stdout + logs.stderr)
        if not str(status["status"]).endswith("completed"):
            raise DeploymentError(f"run {run_id} ended {status['status']}; logs in {self.work / 'logs'}")
        return status

    def stop(self) -> None:
        """SIGTERM to every process group started (SuperNodes first), then whatever they left, by tag."""
        for p in reversed(self.procs):
            if p.poll() is None:
                with suppress(ProcessLookupError):
                    os.killpg(p.pid, signal.SIGTERM)
        for p in self.procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                with suppress(ProcessLookupError):
                    os.killpg(p.pid, signal.SIGKILL)
                p.wait()
        deadline = time.monotonic() + 5  # the SuperExec leaves on its own once its parent is gone
        while _tagged(self.tag) and time.monotonic() < deadline:
            time.sleep(0.2)
        left = _tagged(self.tag)
        self.timings["left_running"] = len(left)  # killed now; 0 when every process stopped on SIGTERM
        # Sweep until none is left: a process being killed can still start one (Ray's raylet starts workers,
        # the local SuperLink its SuperExec), and a SIGKILLed one stays listed until the kernel tears it down.
        deadline = time.monotonic() + 20
        while left and time.monotonic() < deadline:
            for pid in left:
                with suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.2)
            left = _tagged(self.tag)
        if left:
            raise DeploymentError(f"processes {left} of deployment {self.tag} survived SIGKILL for 20 s")


class deploy:
    """``with deploy(clients, work) as d: d.run({...})``: a SuperLink and ``clients`` SuperNodes (partition-id
    0 .. clients - 1), healthy before the body runs, all stopped after it."""

    def __init__(self, clients: int, work: Path, startup_timeout: float = 60, port: int | None = None) -> None:
        self.clients = clients
        self.work = work
        self.startup_timeout = startup_timeout
        self.port = port  # the SuperLink's; None: a free one
        self.deployment: Deployment | None = None

    def __enter__(self) -> Deployment:
        work = self.work
        (work / "logs").mkdir(parents=True, exist_ok=True)
        home = work / "flwr-home"
        home.mkdir(exist_ok=True)
        tag = uuid.uuid4().hex
        env = dict(os.environ)
        env.update(
            FLWR_HOME=str(home),
            FLWR_TELEMETRY_ENABLED="0",
            FLWR_DISABLE_UPDATE_CHECK="1",
            DGRPO_FLOWER_TAG=tag,
            PATH=f"{BIN}{os.pathsep}{env.get('PATH', '')}",
            PYTHONUNBUFFERED="1",
        )
        link = f"127.0.0.1:{chosen_port(self.port)}"
        (home / "config.toml").write_text(
            f'[superlink]\ndefault = "{CONNECTION}"\n\n[superlink.{CONNECTION}]\naddress = "{link}"\ninsecure = true\n'
        )
        d = self.deployment = Deployment(work, env, tag, link)
        t0 = time.monotonic()
        try:
            host, port = link.split(":")
            self._spawn(d, "superlink", "flower-superlink", "--insecure", "--host", host, "--port", port,
                        "--disable-runtime-dependency-installation")  # fmt: skip
            _healthy(f"http://{link}/health", self.startup_timeout, d.procs)
            ports = []
            for i in range(self.clients):
                ports.append(free_port())
                self._spawn(
                    d, f"supernode-{i}", "flower-supernode", "--insecure", "--superlink", link,
                    "--host", "127.0.0.1", "--port", str(ports[-1]),
                    "--node-config", f"partition-id={i} num-partitions={self.clients}",
                )  # fmt: skip
            for node_port in ports:
                _healthy(f"http://127.0.0.1:{node_port}/health", self.startup_timeout, d.procs)
        except BaseException:
            d.stop()
            raise
        d.timings["startup_seconds"] = time.monotonic() - t0
        return d

    def _spawn(self, d: Deployment, name: str, program: str, *args: str) -> None:
        log = (d.work / "logs" / f"{name}.log").open("wb")
        d.procs.append(
            subprocess.Popen(
                [str(BIN / program), *args],
                env=d.env,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=d.work,
                start_new_session=True,
            )
        )
        log.close()  # the child holds its own descriptor

    def __exit__(self, *exc: object) -> None:
        if self.deployment is not None:
            self.deployment.stop()


class simulate:
    """``with simulate(clients, work) as d: d.run({...})``: Flower's simulation engine (Ray, the
    ``dgrpo[flower-sim]`` extra) with ``clients`` virtual SuperNodes, behind a local SuperLink that ``flwr run``
    starts itself (address ``:local:``, on a free port); stopped with everything it started afterwards."""

    def __init__(self, clients: int, work: Path, port: int | None = None) -> None:
        self.clients = clients
        self.work = work
        self.port = port  # the local SuperLink's; None: a free one
        self.deployment: Deployment | None = None

    def __enter__(self) -> Deployment:
        (self.work / "logs").mkdir(parents=True, exist_ok=True)
        home = self.work / "flwr-home"
        home.mkdir(exist_ok=True)
        tag = uuid.uuid4().hex
        port = chosen_port(self.port)
        env = dict(os.environ)
        env.update(
            FLWR_HOME=str(home),
            FLWR_TELEMETRY_ENABLED="0",
            FLWR_DISABLE_UPDATE_CHECK="1",
            FLWR_LOCAL_SUPERLINK_HTTP_API_PORT=str(port),
            FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION="1",  # the app's dependencies are this environment's
            DGRPO_FLOWER_TAG=tag,
            PATH=f"{BIN}{os.pathsep}{env.get('PATH', '')}",
            PYTHONUNBUFFERED="1",
        )
        (home / "config.toml").write_text(
            f'[superlink]\ndefault = "{CONNECTION}"\n\n[superlink.{CONNECTION}]\naddress = ":local:"\n'
        )
        d = self.deployment = Deployment(self.work, env, tag, f"127.0.0.1:{port}")
        try:  # the federation's size (1.42 keeps it with the SuperLink; this starts the local one)
            d.flwr(
                "federation", "simulation-config", "@none/default", CONNECTION, "--num-supernodes", str(self.clients)
            )
        except BaseException:
            d.stop()
            raise
        return d

    def __exit__(self, *exc: object) -> None:
        if self.deployment is not None:
            self.deployment.stop()


def run_on_flower(
    scenario: str,
    overrides: list[str],
    out: Path,
    work: Path | None = None,
    timeout: float = 1800,
    engine: str = "deployment",
    port: int | None = None,
    on_round: Callable[[dict[str, Any]], None] | None = None,
    on_started: Callable[[Deployment], None] | None = None,
) -> RunSummary:
    """Run a federated scenario on Flower (``engine``: ``deployment``, a SuperLink and a SuperNode per client
    as processes here, or ``simulation``, Flower's Ray engine); the server app's ``summary.json`` (with the
    start-up and run seconds under ``flower``). ``port``: the SuperLink's on 127.0.0.1 (default: a free one).
    ``on_started(deployment)`` is called once Flower is up, ``on_round(row)`` with each round's row of
    ``metrics.jsonl`` as the round ends. Flower's logs end up in ``out/flower-logs``, whether the run
    completed or not."""
    out = out.resolve()
    if Path(scenario).exists():  # Flower's processes run in ``work``: a relative path to a file would not resolve
        scenario = str(Path(scenario).resolve())
    parsed = scenario_of({"scenario": scenario, "overrides": ";".join(overrides)})
    assert parsed.federated is not None
    require_flower(engine)
    if work is None:
        work = Path(tempfile.mkdtemp(prefix="dgrpo-flower-"))
    config: dict[str, Any] = {
        "scenario": scenario,
        "overrides": ";".join(overrides),
        "out": str(out),
        "timeout": timeout,
    }
    for earlier in ("metrics.jsonl", "summary.json"):  # an earlier run's: never read back as this one's
        (out / earlier).unlink(missing_ok=True)
    out.mkdir(parents=True, exist_ok=True)
    tail = MetricsTail(out / "metrics.jsonl", on_round) if on_round is not None else None
    clients = parsed.federated.clients
    flower = deploy(clients, work, port=port) if engine == "deployment" else simulate(clients, work, port=port)
    try:
        with flower as d:
            if on_started is not None:
                on_started(d)
            d.run(config, timeout=timeout, poll=tail.poll if tail is not None else None)
    finally:  # a failed run's logs are where a completed one's are: the error message points there
        if (work / "logs").is_dir():
            shutil.copytree(work / "logs", out / "flower-logs", dirs_exist_ok=True)
    written = load_summary(out)
    summary = written.model_copy(update={"flower": {**(written.flower or {}), **d.timings}})
    summary.write(out)
    return summary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scenario", default="fed-grpo")
    parser.add_argument("--set", dest="sets", action="append", default=[], help="a scenario override")
    parser.add_argument("--out", type=Path, default=Path("runs/flower"))
    parser.add_argument("--timeout", type=float, default=1800)
    parser.add_argument("--engine", choices=ENGINES, default="deployment")
    args = parser.parse_args(argv)
    summary = run_on_flower(args.scenario, args.sets, args.out, timeout=args.timeout, engine=args.engine)
    print(
        json.dumps(summary.model_dump(mode="json", include={"scenario", "final_accuracy", "accuracy", "wall_seconds"}))
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
