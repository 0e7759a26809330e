"""The Flower app (docs/flower.md): its records, its strategy on hand-made replies, and a real deployment
(a SuperLink and two SuperNodes, processes on 127.0.0.1) against dgrpo's own simulation of the same scenario."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from flwr.app import Array, ArrayRecord, ConfigRecord, Error, Message, MessageType, RecordDict
from flwr.supercore.task_identity import TaskIdentity
from typer.testing import CliRunner

import dgrpo.cli
import dgrpo.flower.local
from dgrpo.config.federated import FederatedConfig
from dgrpo.federated.client import Submission
from dgrpo.federated.server import Aggregator
from dgrpo.federated.sparse import SparseUpdate
from dgrpo.federated.stats import ClientStats
from dgrpo.flower.config import scenario_of
from dgrpo.flower.local import run_on_flower
from dgrpo.flower.records import stats_record, update_of, update_record, weights_of, weights_record
from dgrpo.flower.strategy import FedGRPO
from dgrpo.simulations.federated import run_federated
from dgrpo.simulations.run_folder import prepare
from dgrpo.simulations.scenario import load_scenario
from dgrpo.simulations.summary import RunSummary, load_summary

SIZE = 6


@pytest.fixture
def task_identity() -> Iterator[None]:
    """Flower stamps every message with the process's task identity (set by its runtime; here, by hand)."""
    saved = (TaskIdentity._task_id, TaskIdentity._run_id, TaskIdentity._node_id)
    TaskIdentity.task_id, TaskIdentity.run_id, TaskIdentity.node_id = 1, 1, 0
    yield
    TaskIdentity._task_id, TaskIdentity._run_id, TaskIdentity._node_id = saved


def sparse(indices: list[int], values: list[float]) -> SparseUpdate:
    return SparseUpdate(SIZE, torch.tensor(indices, dtype=torch.int64), torch.tensor(values, dtype=torch.float32))


def test_records_round_trip() -> None:
    update = sparse([0, 3, 5], [0.5, -1.0, 2.0])
    back = update_of(update_record(update), SIZE)
    assert back.indices.tolist() == [0, 3, 5] and back.values.tolist() == [0.5, -1.0, 2.0]
    flat = torch.arange(SIZE, dtype=torch.float32)
    assert torch.equal(weights_of(weights_record(flat)), flat)


@pytest.mark.parametrize(
    ("indices", "values", "why"),
    [
        (np.array([0, 9], np.int64), np.array([1.0, 1.0], np.float32), "outside"),
        (np.array([3, 1], np.int64), np.array([1.0, 1.0], np.float32), "ascending"),
        (np.array([0, 1], np.int64), np.array([1.0, np.nan], np.float32), "finite"),
        (np.array([0, 1], np.int64), np.array([1.0], np.float32), "pair up"),
        (np.array([0.0, 1.0], np.float64), np.array([1.0, 1.0], np.float32), "dtype"),
        (np.array([0, 1], np.int64), np.array([1, 1], np.int64), "dtype"),
    ],
)
def test_a_malformed_update_is_refused(indices: np.ndarray, values: np.ndarray, why: str) -> None:
    with pytest.raises(ValueError, match=why):
        update_of(ArrayRecord({"indices": Array(indices), "values": Array(values)}), SIZE)


def _reply(node: int, client: str, stats: ClientStats, update: ArrayRecord, size: int = SIZE) -> Message:
    ins = Message(content=RecordDict({"config": ConfigRecord({"server-round": 1})}), dst_node_id=node,
                  message_type=MessageType.TRAIN)  # fmt: skip
    content = RecordDict(
        {"arrays": update, "metrics": stats_record(stats, size), "client": ConfigRecord({"name": client})}
    )
    return Message(content=content, reply_to=ins)


def test_strategy_merges_as_dgrpo_and_refuses_bad_replies(task_identity: None) -> None:
    cfg = FederatedConfig(clients=3, weighting="signal")
    strategy = FedGRPO(cfg, torch.zeros(SIZE))
    good = {
        "client-0": (ClientStats(0.5, 0.1, 64, 8), sparse([0, 1], [1.0, 2.0])),
        "client-1": (ClientStats(0.4, 0.3, 64, 8), sparse([1, 5], [-1.0, 4.0])),
    }
    replies = [_reply(10 + i, name, stats, update_record(u)) for i, (name, (stats, u)) in enumerate(good.items())]
    nan = ArrayRecord({"indices": Array(np.array([2], np.int32)), "values": Array(np.array([np.nan], np.float32))})
    replies.append(_reply(12, "client-2", ClientStats(0.5, 0.2, 64, 8), nan))
    replies.append(_reply(13, "client-0", ClientStats(0.9, 0.9, 64, 8), update_record(sparse([4], [9.0]))))
    replies.append(_reply(14, "client-2", ClientStats(0.5, 0.2, 64, 8), update_record(sparse([4], [9.0])), 7))
    ins = Message(content=RecordDict(), dst_node_id=15, message_type=MessageType.TRAIN)
    replies.append(Message(Error(code=0, reason="out of memory"), reply_to=ins))
    arrays, metrics = strategy.aggregate_train(1, replies)
    expected = Aggregator(cfg).aggregate(1, [Submission(n, 1, s, u) for n, (s, u) in good.items()])
    assert arrays is not None and metrics is not None
    assert torch.equal(weights_of(arrays), expected.delta)
    # signal weighting: (0.1 + 0.01) / (0.42) and (0.3 + 0.01) / 0.42
    assert strategy.rows[0]["weights"] == pytest.approx({"client-0": 0.11 / 0.42, "client-1": 0.31 / 0.42})
    assert dict(strategy.rejected) == {
        ("12", "bad_update"): 1, ("13", "duplicate_client"): 1, ("14", "bad_update"): 1, ("15", "client_error"): 1,
    }  # fmt: skip
    assert strategy.global_stats is not None and strategy.global_stats.mean == pytest.approx(expected.stats.mean)


def test_run_config_names_a_federated_scenario() -> None:
    assert scenario_of({"scenario": "fed-grpo-skewed", "overrides": "rounds=3; federated.clients=4"}).rounds == 3
    with pytest.raises(Exception, match="not a federated"):
        scenario_of({"scenario": "fed-centralized"})


def test_metrics_tail_hands_on_each_complete_row_once(tmp_path: Path) -> None:
    """How ``dgrpo flower run`` sees rounds under way: new complete lines only, a half-written one later."""
    path = tmp_path / "metrics.jsonl"
    seen: list[int] = []
    tail = dgrpo.flower.local.MetricsTail(path, lambda row: seen.append(row["round"]))
    tail.poll()  # not written yet
    path.write_text('{"round": 1}\n{"round"')
    tail.poll()
    assert seen == [1]
    with path.open("a") as f:
        f.write(': 2}\n{"round": 3}\n')
    tail.poll()
    tail.poll()
    assert seen == [1, 2, 3]


SMALL = [
    "federated.clients=2", "rounds=2", "federated.prompts_per_client=64", "eval.prompts=64", "eval.every=1",
    "federated.local_steps=1", "federated.prompts_per_step=4", "federated.completions_per_prompt=4",
]  # fmt: skip


@pytest.fixture(scope="module")
def simulated(tmp_path_factory: pytest.TempPathFactory) -> RunSummary:
    """dgrpo's own simulation of the small scenario: what both Flower engines must reproduce."""
    return run_federated(load_scenario(Path("fed-grpo"), SMALL), prepare(tmp_path_factory.mktemp("sim")))


@pytest.mark.timeout(300)
def test_a_flower_deployment_runs_the_same_experiment_as_the_simulation(tmp_path: Path, simulated: RunSummary) -> None:
    """A SuperLink and two SuperNodes (real processes on 127.0.0.1), the app submitted with ``flwr run``: the
    same accuracy at every evaluation and the same global weights, bit for bit, as dgrpo's simulation of the
    scenario (sparse 1/32 updates with error feedback and momentum SGD, both carried across rounds in the
    client's ``context.state``: without them round 2 differs, checked by hand)."""
    flower = run_on_flower("fed-grpo", SMALL, tmp_path / "flower", work=tmp_path / "deployment", timeout=240)
    ours = simulated
    assert flower.accuracy == ours.accuracy
    assert flower.federated.global_weights_digest == ours.federated.global_weights_digest
    assert flower.federated.entries_per_client_per_round == ours.federated.entries_per_client_per_round
    rows = [json.loads(line) for line in (tmp_path / "flower" / "metrics.jsonl").read_text().splitlines()]
    assert [r["round"] for r in rows] == [1, 2] and all(set(r["weights"]) == {"client-0", "client-1"} for r in rows)
    assert flower.flower["rejected"] == []
    assert flower.flower["left_running"] == 0  # every process of the deployment stopped by SIGTERM
    assert not _deployment_processes()


@pytest.mark.timeout(300)
def test_flowers_simulation_engine_runs_the_same_experiment(tmp_path: Path, simulated: RunSummary) -> None:
    """Flower's simulation engine (Ray, dgrpo[flower-sim]; a local SuperLink that ``flwr run`` starts): the
    same global weights again."""
    flower = run_on_flower("fed-grpo", SMALL, tmp_path / "flower", work=tmp_path / "sim", engine="simulation")
    assert flower.accuracy == simulated.accuracy
    assert flower.federated.global_weights_digest == simulated.federated.global_weights_digest
    assert not _deployment_processes()  # the local SuperLink and Ray's workers included


@pytest.mark.timeout(300)
def test_dgrpo_flower_run_prints_each_round_as_it_ends(
    tmp_path: Path, simulated: RunSummary, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``dgrpo flower run``: one line per round while the run is under way (round 1's before the server app
    has written summary.json, which it does last), then where the results are; the same experiment again."""
    out = tmp_path / "cli"
    formatted: list[tuple[int, bool]] = []  # (round, was summary.json there yet)
    real = dgrpo.cli._format_federated_row

    def spy(row: dict[str, Any]) -> str:
        formatted.append((row["round"], (out / "summary.json").exists()))
        return real(row)

    monkeypatch.setattr(dgrpo.cli, "_format_federated_row", spy)
    args = ["flower", "run", "fed-grpo", "--out", str(out), *[x for s in SMALL for x in ("-s", s)]]
    result = CliRunner().invoke(dgrpo.cli.app, args)
    assert result.exit_code == 0, result.output
    # The last round's row lands just before summary.json, so only round 1's timing is certain.
    assert [r for r, _ in formatted] == [1, 2] and formatted[0] == (1, False), formatted
    lines = result.output.splitlines()
    rounds = [line for line in lines if line.startswith("round ")]
    assert [line.split()[1] for line in rounds] == ["1", "2"], result.output
    assert all("mean reward" in line and "accuracy" in line and "KiB/client" in line for line in rounds)
    assert "summary.json" in lines[-1] and str(out) in lines[-1], lines[-1]
    summary = load_summary(out)
    assert summary.federated.global_weights_digest == simulated.federated.global_weights_digest
    assert (out / "flower-logs" / "superlink.log").exists()
    assert not _deployment_processes()


def test_dgrpo_flower_run_user_errors_are_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A mistake is one line and exit status 2, before anything starts: no traceback, no process left."""
    out = ["--out", str(tmp_path / "out")]
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = str(taken.getsockname()[1])
        cases = {
            "scenario file 'nope' not found": ["nope"],
            "unknown scenario key 'bogus'": ["fed-grpo", "-s", "bogus=1"],
            "not a federated one": ["fed-centralized"],
            "unknown Flower engine 'warp'": ["fed-grpo", "--engine", "warp"],
            f"port {port} on 127.0.0.1 is not available": ["fed-grpo", "--port", port],
        }
        for why, args in cases.items():
            result = CliRunner().invoke(dgrpo.cli.app, ["flower", "run", *args, *out])
            assert result.exit_code == 2, (args, result.output)
            assert result.output.strip().splitlines() == [result.output.strip()], result.output
            assert result.output.startswith("error: ") and why in result.output, result.output
    monkeypatch.setattr(dgrpo.flower.local, "BIN", tmp_path)  # an environment without Flower's programs
    result = CliRunner().invoke(dgrpo.cli.app, ["flower", "run", "fed-grpo", *out])
    assert result.exit_code == 2 and "Flower is not installed" in result.output, result.output
    assert "Traceback" not in result.output and not (tmp_path / "out").exists()
    assert not _deployment_processes()


def _deployment_processes() -> list[int]:
    """Processes still carrying a deployment's tag in their environment (any deployment's)."""
    out = []
    for entry in Path("/proc").iterdir():
        try:
            environ = (entry / "environ").read_bytes()
        except OSError:
            continue
        if entry.name.isdigit() and any(v.startswith(b"DGRPO_FLOWER_TAG=") for v in environ.split(b"\0")):
            out.append(int(entry.name))
    return out
