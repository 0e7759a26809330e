"""A whole Flower deployment on this machine: a ``SuperLink`` and one ``SuperNode`` per client, real processes
on 127.0.0.1 (Flower's deployment engine, insecure: loopback only), the app submitted with ``flwr run``, its
results read back, every process stopped.

    .venv/bin/python -m dgrpo.flower.local --scenario fed-grpo --out runs/flower [--set key=value ...]
        [--engine simulation]   # Flower's Ray simulation engine instead (dgrpo[flower-sim])

Flower 1.42 serves its Fleet, Control and ServerAppIo APIs on one HTTP port per SuperLink; each SuperNode has
its own port for its local runtime. The connection to submit to lives in ``$FLWR_HOME/config.toml``:
``FLWR_HOME`` is a folder of the run's own, so nothing lands in ``~/.flwr``. Flower starts
``flower-superexec``, ``flwr-serverapp`` and ``flwr-clientapp`` by name, so the environment's ``bin`` goes
first on ``PATH``; the SuperLink does not install the app's dependencies (they are this environment's).
"""

from __future__ import annotations

import argparse
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
from contextlib import suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dgrpo.flower.config import scenario_of

APP_DIR = Path(__file__).resolve().parents[2] / "flower"  # the app folder `flwr run` packs (a source checkout)
BIN = Path(sys.executable).parent
CONNECTION = "local-deployment"


class DeploymentError(RuntimeError):
    pass


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


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

    def run(self, run_config: dict[str, Any], timeout: float = 1800, app: Path = APP_DIR) -> dict[str, Any]:
        """Submit the app with ``run_config`` (values as TOML literals), wait until it finishes; its status."""
        literal = " ".join(f"{k}={json.dumps(v)}" for k, v in run_config.items())
        t0 = time.monotonic()
        run_id = str(self.flwr("run", str(app), CONNECTION, "--run-config", literal)["run-id"])
        deadline = t0 + timeout
        while True:
            status: dict[str, Any] = self.flwr("ls", CONNECTION, "--run-id", run_id)["runs"][0]
            if str(status["status"]).startswith("finished"):
                break
            if time.monotonic() > deadline:
                raise DeploymentError(f"run {run_id} not finished after {timeout:.0f}s: {status}")
            time.sleep(1.0)
        self.timings["run_seconds"] = time.monotonic() - t0
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

    def __init__(self, clients: int, work: Path, startup_timeout: float = 60) -> None:
        self.clients = clients
        self.work = work
        self.startup_timeout = startup_timeout
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
        link = f"127.0.0.1:{free_port()}"
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

    def __init__(self, clients: int, work: Path) -> None:
        self.clients = clients
        self.work = work
        self.deployment: Deployment | None = None

    def __enter__(self) -> Deployment:
        (self.work / "logs").mkdir(parents=True, exist_ok=True)
        home = self.work / "flwr-home"
        home.mkdir(exist_ok=True)
        tag = uuid.uuid4().hex
        port = free_port()
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
) -> dict[str, Any]:
    """Run a federated scenario on Flower (``engine``: ``deployment``, a SuperLink and a SuperNode per client
    as processes here, or ``simulation``, Flower's Ray engine); the server app's ``summary.json`` (with the
    start-up and run seconds under ``flower``)."""
    out = out.resolve()
    parsed = scenario_of({"scenario": scenario, "overrides": ";".join(overrides)})
    assert parsed.federated is not None
    if work is None:
        work = Path(tempfile.mkdtemp(prefix="dgrpo-flower-"))
    config: dict[str, Any] = {
        "scenario": scenario,
        "overrides": ";".join(overrides),
        "out": str(out),
        "timeout": timeout,
    }
    if (out / "metrics.jsonl").exists():
        (out / "metrics.jsonl").unlink()
    engines = {"deployment": deploy, "simulation": simulate}
    with engines[engine](parsed.federated.clients, work) as d:
        d.run(config, timeout=timeout)
    summary: dict[str, Any] = json.loads((out / "summary.json").read_text())
    summary["flower"].update(d.timings)
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    shutil.copytree(work / "logs", out / "flower-logs", dirs_exist_ok=True)
    return summary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scenario", default="fed-grpo")
    parser.add_argument("--set", dest="sets", action="append", default=[], help="a scenario override")
    parser.add_argument("--out", type=Path, default=Path("runs/flower"))
    parser.add_argument("--timeout", type=float, default=1800)
    parser.add_argument("--engine", choices=("deployment", "simulation"), default="deployment")
    args = parser.parse_args(argv)
    summary = run_on_flower(args.scenario, args.sets, args.out, timeout=args.timeout, engine=args.engine)
    print(json.dumps({k: summary[k] for k in ("scenario", "final_accuracy", "accuracy", "wall_seconds")}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
