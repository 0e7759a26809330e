"""Federated mode end to end in one process: real tiny models, real GRPO steps, the real byte encoding."""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

import pytest
import torch

from dgrpo.config import RunConfig
from dgrpo.config.federated import FederatedConfig
from dgrpo.errors import ConfigError
from dgrpo.federated.client import FedClient, GlobalStats, Submission
from dgrpo.federated.partition import carries, client_level, client_prompts, partition
from dgrpo.federated.server import Aggregator
from dgrpo.federated.sparse import top_k
from dgrpo.federated.stats import ClientStats
from dgrpo.learner.learner import Learner
from dgrpo.simulations.runner import run_simulation
from dgrpo.simulations.scenario import build_scenario, load_scenario
from dgrpo.tasks import get_task
from dgrpo.tasks.arith import scratchpad

SMALL: dict[str, Any] = {
    "clients": 3,
    "local_steps": 1,
    "prompts_per_step": 2,
    "completions_per_prompt": 4,
    "prompts_per_client": 40,
}


def scenario(top: dict[str, Any] | None = None, **federated: Any) -> Any:
    return build_scenario(
        {
            "name": "fed-test",
            "rounds": 2,
            "eval": {"every": 1, "prompts": 16},
            "sampling": {"max_new_tokens": 24},
            "federated": {**SMALL, **federated},
            **(top or {}),
        }
    )


def test_partition_is_disjoint_and_ordered_by_difficulty() -> None:
    task = get_task("arith")
    parts = partition(task, "arith-carries", 4, 50, "run")
    ids = [p.id for part in parts for p in part]
    assert [len(p) for p in parts] == [50] * 4 and len(set(ids)) == 200
    hardness = [[carries(int(p.meta["a"]), int(p.meta["b"])) for p in part] for part in parts]
    for easier, harder in itertools.pairwise(hardness):
        assert max(easier) <= min(harder)
    assert max(hardness[-1]) > min(hardness[0])  # non-IID: the blocks differ
    assert carries(999, 1) == 3 and carries(123, 456) == 0


def test_levelled_partition_gives_each_client_one_level() -> None:
    """arith-levels: operand lengths 2+2, 2+3 (or 3+2), 3+3; client i holds level min(i, 2), the clients of the
    last level share its prompts out; the same run id gives the same split, another run id another."""
    task = get_task("arith")
    parts = partition(task, "arith-levels", 5, 40, "run")
    lengths = [{len(str(p.meta["a"])) + len(str(p.meta["b"])) for p in part} for part in parts]
    assert lengths == [{4}, {5}, {6}, {6}, {6}]
    ids = [p.id for part in parts for p in part]
    assert [len(p) for p in parts] == [40] * 5 and len(set(ids)) == 200
    assert [p.id for p in partition(task, "arith-levels", 5, 40, "run")[0]] == [p.id for p in parts[0]]
    assert [p.id for p in partition(task, "arith-levels", 5, 40, "other")[0]] != [p.id for p in parts[0]]
    assert [client_level(i, 3) for i in range(5)] == [0, 1, 2, 2, 2]


def test_label_noise_swaps_the_answers_of_a_fraction_of_the_noisy_clients_prompts() -> None:
    task = get_task("arith")
    parts = client_prompts(task, "arith-levels", 3, 200, "run", noisy_clients=1, label_noise=0.75)
    clean, noisy = parts[1], parts[2]
    assert all(p.answer == str(p.meta["a"] + p.meta["b"]) for part in parts[:2] for p in part)
    marked = [p for p in noisy if p.meta.get("noisy_label")]
    assert len(marked) == 150  # 75% of 200
    wrong = [p for p in marked if p.answer != str(p.meta["a"] + p.meta["b"])]
    assert len(wrong) >= 145  # another prompt's answer: wrong unless two sums happen to be equal
    assert sorted(p.answer for p in marked) == sorted(str(p.meta["a"] + p.meta["b"]) for p in marked)  # a rotation
    assert [p.id for p in noisy] == [p.id for p in partition(task, "arith-levels", 3, 200, "run")[2]]
    a, b, noisy_answer = marked[0].meta["a"], marked[0].meta["b"], marked[0].answer
    steps = scratchpad(a, b).rpartition(">")[0]
    assert len(clean) == 200 and task.reward(marked[0], f"{steps}>{noisy_answer}") == 1.0  # what the reward reads
    assert noisy_answer == str(a + b) or task.reward(marked[0], scratchpad(a, b)) == 0.0
    with pytest.raises(ValueError, match="noisy_clients"):
        FederatedConfig(clients=2, noisy_clients=2)


def test_gsm8k_partition_by_solution_steps(tmp_path: Path) -> None:
    rows = [
        {"question": f"Question {i}?", "answer": "\n".join(f"step {j}" for j in range(steps)) + f"\n#### {i}"}
        for i, steps in enumerate([4, 1, 3, 2, 1, 4, 2, 3])
    ]
    for split in ("train", "test"):
        (tmp_path / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    task = get_task("gsm8k", data=str(tmp_path))
    parts = partition(task, "gsm8k-steps", 2, 4, "run")
    steps = [[p.meta["solution"].count("\n") + 1 for p in part] for part in parts]
    assert sorted(steps[0]) == [1, 1, 2, 2] and sorted(steps[1]) == [3, 3, 4, 4]
    with pytest.raises(ConfigError, match="needs arith prompts"):
        partition(task, "arith-carries", 2, 4, "run")


def test_federated_run_writes_its_summary(tmp_path: Path) -> None:
    summary = run_simulation(
        scenario(weighting="signal", calibration={"enabled": True}, sparsity={"budget": 0.01}), tmp_path
    )
    fed = summary.federated
    assert fed is not None
    assert [p[0] for p in fed.accuracy] == [0, 1, 2]
    n = fed.parameters
    # 1% of the entries (signal scaling keeps each client within [0.5, 2] x the budget)
    assert 0.005 * n <= fed.entries_per_client_per_round <= 0.02 * n
    assert fed.compression_entries >= 50 and fed.compression_bytes >= 25
    assert [r.round for r in fed.per_round] == [1, 2]
    assert all(len(r.bytes_per_client) == 3 for r in fed.per_round)
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert set(rows[0]["weights"]) == {"client-0", "client-1", "client-2"}
    assert sum(rows[0]["weights"].values()) == pytest.approx(1.0)
    assert rows[1]["global_mean_reward"] is not None and (tmp_path / "curves.png").stat().st_size > 0
    assert [r["lr"] for r in rows] == [5e-5, 5e-5]  # the learner's default: constant


def test_the_clients_step_follows_the_schedule(tmp_path: Path) -> None:
    cosine = {"optimizer": "sgd", "lr": 0.02, "lr_schedule": "cosine", "lr_final": 0.1}
    run_simulation(scenario({"rounds": 3, "learner": cosine}), tmp_path)
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["lr"] for r in rows] == pytest.approx([0.02, 0.011, 0.002])  # (1 + cos(pi / 2)) / 2 = 0.5


def test_runs_are_reproducible(tmp_path: Path) -> None:
    sc = scenario(sparsity={"budget": 0.05})
    first = run_simulation(sc, tmp_path / "a").federated
    again = run_simulation(sc, tmp_path / "b").federated
    assert first is not None and again is not None
    assert first.global_weights_digest == again.global_weights_digest


def test_baselines(tmp_path: Path) -> None:
    central = run_simulation(scenario(method="centralized"), tmp_path / "c").federated
    assert central is not None
    assert central.bytes_per_client_per_round is None and central.global_weights_digest is None
    local = run_simulation(scenario(method="local"), tmp_path / "l")
    assert local.federated.method == "local" and len(local.accuracy) == 3


def test_centralized_trains_on_the_union_of_the_clients_batches() -> None:
    run = RunConfig()
    cfg = FederatedConfig(**SMALL)
    task = get_task("arith")
    parts = partition(task, cfg.partition, cfg.clients, cfg.prompts_per_client, "sim")
    seen: list[list[str]] = []

    class Recorder(Learner):
        def generate(self, prompts: Any, n: int, sampling: Any, **kw: Any) -> list[list[str]]:
            seen.append(list(prompts))
            return super().generate(prompts, n, sampling, **kw)

    sources = [(f"client-{i}", p) for i, p in enumerate(parts)]
    FedClient("centralized", "sim", task, Recorder(run.model, run.learner), sources, cfg, run.sampling).local_round(
        1, None
    )
    alone = [Recorder(run.model, run.learner) for _ in parts]
    for (name, prompts), learner in zip(sources, alone, strict=True):
        FedClient(name, "sim", task, learner, [(name, prompts)], cfg, run.sampling).local_round(1, None)
    assert seen[0] == [t for batch in seen[1:] for t in batch]  # 2 prompts from each of the 3 clients


def test_a_client_sends_its_update_with_nothing_lost() -> None:
    run = RunConfig()
    cfg = FederatedConfig(**{**SMALL, "sparsity": {"budget": 0.01}})
    task = get_task("arith")
    prompts = partition(task, cfg.partition, cfg.clients, cfg.prompts_per_client, "sim")[0]
    client = FedClient(
        "client-0", "sim", task, Learner(run.model, run.learner), [("client-0", prompts)], cfg, run.sampling
    )
    result = client.local_round(1, None)
    assert result.delta.abs().max() > 0 and result.stats.samples == 8
    sent = client.submission(1, result, None)
    assert sent.update.entries == round(0.01 * client.size)
    assert torch.allclose(sent.update.dense() + client.feedback.residual, result.delta, atol=0)


def _sub(name: str, mean: float, std: float, update: list[float]) -> Submission:
    return Submission(name, 1, ClientStats(mean, std, 64, 8), top_k(torch.tensor(update), len(update)))


def test_aggregation_is_identical_whatever_the_arrival_order() -> None:
    gen = torch.Generator().manual_seed(1)
    subs = [_sub(f"n{i}", 0.5, 0.1 * (i + 1), torch.randn(1000, generator=gen).tolist()) for i in range(3)]
    cfg = FederatedConfig(weighting="signal")
    one = Aggregator(cfg).aggregate(1, subs)
    other = Aggregator(cfg).aggregate(1, list(reversed(subs)))
    assert torch.equal(one.delta, other.delta) and one.weights == other.weights


def test_std_inflation_gains_weight_and_the_defense_takes_it_back() -> None:
    honest = [_sub(f"c{i}", 0.8, s, [1.0, 1.0]) for i, s in enumerate([0.2, 0.25, 0.3, 0.2])]
    liar = _sub("c9", 0.5, 0.5, [-1.0, -1.0])
    open_cfg = FederatedConfig(weighting="signal")
    undefended = Aggregator(open_cfg).aggregate(1, [*honest, liar])
    assert undefended.weights["c9"] == pytest.approx(0.51 / (0.21 + 0.26 + 0.31 + 0.21 + 0.51))
    defended = Aggregator(FederatedConfig(weighting="signal", defense={"bound_stats": True})).aggregate(
        1, [*honest, liar]
    )
    # the median reported std is 0.25: the liar is clipped to 1.5 x 0.25 = 0.375
    assert defended.clipped == {"c9": "std_above_median_ratio"}
    assert defended.weights["c9"] == pytest.approx(0.385 / (0.21 + 0.26 + 0.31 + 0.21 + 0.385))
    assert defended.weights["c9"] < undefended.weights["c9"]
    krum = FederatedConfig(weighting="signal", aggregator="multi-krum", defense={"bound_stats": True})
    kept = Aggregator(krum).aggregate(1, [*honest, liar])
    assert kept.delta.tolist() == pytest.approx([1.0, 1.0]) and kept.influence is not None
    assert kept.influence["c9"] == 0.0  # excluded: whatever weight it claimed, it has no share of the result


def test_calibration_uses_the_broadcast_mean() -> None:
    run = RunConfig()
    task = get_task("arith")
    prompts = partition(task, "arith-carries", 3, 40, "sim")[2]
    deltas = []
    for strength in (0.0, 1.0):
        cfg = FederatedConfig(**{**SMALL, "calibration": {"enabled": True, "strength": strength}})
        client = FedClient("c", "sim", task, Learner(run.model, run.learner), [("c", prompts)], cfg, run.sampling)
        deltas.append(client.local_round(1, GlobalStats(mean=1.0, std=0.2)).delta)
    # same prompts and samples: calibration (mean 1.0 above every prompt's) only changes the step size
    assert not torch.equal(deltas[0], deltas[1])


def test_configuration_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not \\[adversary\\]"):
        build_scenario({"federated": {}, "adversary": {"name": "text"}, "nodes": {"malicious": 1}})
    with pytest.raises(ConfigError, match="must leave an honest client"):
        build_scenario({"federated": {"clients": 2, "attack": {"name": "scale", "clients": 2}}})
    with pytest.raises(ConfigError, match="valid aggregator names"):
        run_simulation(scenario(aggregator="krum-ish"), tmp_path)


@pytest.mark.parametrize("name", ["fed-avg", "fed-grpo", "fed-centralized", "fed-std-attack"])
def test_shipped_scenarios_load(name: str) -> None:
    sc = load_scenario(Path(name))
    assert sc.federated is not None and sc.federated.clients == 5
