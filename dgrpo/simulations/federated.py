"""Run a federated scenario (``[federated]``): K clients on non-IID partitions, in one process, with the
baselines in the same runner.

* ``federated``: every round each client loads the global weights, takes its local GRPO steps, sends its
  statistics and its (sparse, error-feedback) update through the real byte encoding
  (:mod:`dgrpo.federated.encoding`: what is counted is what a daemon would send), the aggregator merges
  them and the global weights move by the result;
* ``centralized``: one learner trains on the union of the clients' step batches (the same prompts, as many
  steps);
* ``local``: the clients train alone; the accuracy is the mean of theirs.

Held-out accuracy is measured on the task's evaluation prompts, every ``eval.every`` rounds and at the
end. Outputs ``metrics.jsonl`` (a row appended per round), ``summary.json`` (with a ``federated`` object),
``curves.png``, and between rounds the snapshot ``dgrpo simulate --resume`` continues from.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import torch

from dgrpo.config.federated import FederatedConfig
from dgrpo.federated import encoding
from dgrpo.federated.attacks import build_attack
from dgrpo.federated.client import FedClient, GlobalStats, LocalResult, Submission
from dgrpo.federated.params import digest, flat_parameters
from dgrpo.federated.partition import client_prompts
from dgrpo.federated.server import Aggregator
from dgrpo.learner.learner import Learner
from dgrpo.round.tensorboard import TensorBoardObserver
from dgrpo.simulations import snapshot
from dgrpo.simulations.plots import plot_federated
from dgrpo.simulations.run_folder import RunFolder
from dgrpo.simulations.scenario import Scenario
from dgrpo.simulations.stopping import StopRequest
from dgrpo.simulations.summary import SUMMARY_FORMAT, FederatedSummary, RunSummary
from dgrpo.tasks import get_task
from dgrpo.tasks.base import Prompt, Task

RoundCallback = Callable[[dict[str, Any]], None]


def accuracy(learner: Learner, task: Task, prompts: Sequence[Prompt], scenario: Scenario) -> float:
    """Mean reward of one completion per held-out prompt (greedy, or sampled with the evaluation seed)."""
    sampling = scenario.sampling.model_copy(update={"seed": scenario.eval.seed})
    texts = learner.generate([p.text for p in prompts], 1, sampling, greedy=scenario.eval.greedy)
    rewards = task.rewards_batch(list(zip(prompts, texts, strict=True)))
    return sum(r[0] for r in rewards) / len(rewards)


def _parts(scenario: Scenario, fed: FederatedConfig, task: Task) -> list[list[Prompt]]:
    return client_prompts(
        task, fed.partition, fed.clients, fed.prompts_per_client, scenario.run_id, fed.noisy_clients, fed.label_noise
    )


def client_for(scenario: Scenario, task: Task, index: int, parts: list[list[Prompt]] | None = None) -> FedClient:
    """Client ``index`` of the federated ``scenario`` (``client-<index>``, its partition, its attack if it is
    one of the last ``attack.clients``), with a fresh learner: what the simulation runs and what a Flower
    ``ClientApp`` runs for the same node."""
    fed = scenario.federated
    if fed is None:
        raise ValueError("not a federated scenario")
    parts = parts if parts is not None else _parts(scenario, fed, task)
    name = f"client-{index}"
    attack = None
    if fed.attack is not None and index >= fed.clients - fed.attack.clients:
        attack = build_attack(fed.attack.name, fed.attack.options)
    learner = Learner(scenario.model, scenario.learner, scenario.lr_rounds())
    return FedClient(name, scenario.run_id, task, learner, [(name, parts[index])], fed, scenario.sampling, attack)


def _clients(scenario: Scenario, fed: FederatedConfig, task: Task) -> list[FedClient]:
    parts = _parts(scenario, fed, task)
    if fed.method == "centralized":
        learner = Learner(scenario.model, scenario.learner, scenario.lr_rounds())
        sources = [(f"client-{i}", part) for i, part in enumerate(parts)]
        return [FedClient("centralized", scenario.run_id, task, learner, sources, fed, scenario.sampling)]
    return [client_for(scenario, task, i, parts) for i in range(fed.clients)]


class FederatedRun:
    """The state of a federated simulation between rounds: clients, aggregator, global weights."""

    def __init__(self, scenario: Scenario) -> None:
        if scenario.federated is None:
            raise ValueError("not a federated scenario")
        self.scenario = scenario
        self.fed = scenario.federated
        self.task = get_task(scenario.task.name, **scenario.task.options)
        self.clients = _clients(scenario, self.fed, self.task)
        self.aggregator = Aggregator(self.fed)
        self.global_weights = flat_parameters(self.clients[0].learner.model)
        self.global_stats: GlobalStats | None = None
        self.eval_prompts = self.task.eval_prompts(scenario.eval.prompts)
        self.attackers = {c.name for c in self.clients if c.attack is not None}

    @property
    def size(self) -> int:
        return int(self.global_weights.numel())

    def evaluate(self) -> float:
        if self.fed.method == "local":
            accs = [accuracy(c.learner, self.task, self.eval_prompts, self.scenario) for c in self.clients]
            return sum(accs) / len(accs)
        learner = self.clients[0].learner
        if self.fed.method == "federated":
            self.clients[0].load_global(self.global_weights)
        return accuracy(learner, self.task, self.eval_prompts, self.scenario)

    def round(self, round_idx: int) -> dict[str, Any]:
        t0 = time.perf_counter()
        results: dict[str, LocalResult] = {}
        sent: dict[str, int] = {}
        entries: dict[str, int] = {}
        submissions: list[Submission] = []
        for client in self.clients:
            if self.fed.method == "federated":
                client.load_global(self.global_weights)
            result = client.local_round(round_idx, self.global_stats)
            results[client.name] = result
            if self.fed.method != "federated":
                continue
            submission = client.submission(round_idx, result, self.global_stats)
            wire = encoding.encode(submission.update)  # what a daemon sends; decoded as a receiver would
            sent[client.name] = len(wire)
            entries[client.name] = submission.update.entries
            received = encoding.decode(wire, self.size)
            submissions.append(Submission(client.name, round_idx, submission.stats, received))
        row: dict[str, Any] = {
            "round": round_idx,
            "client_reward": {n: r.stats.mean for n, r in results.items()},
            "client_signal": {n: r.stats.std for n, r in results.items()},
            "loss": _mean([loss for r in results.values() for loss in r.losses]),
            "lr": next(iter(results.values())).lr,
        }
        if submissions:
            aggregated = self.aggregator.aggregate(round_idx, submissions)
            self.global_weights = self.global_weights + aggregated.delta
            self.global_stats = aggregated.stats
            row.update(
                weights=dict(aggregated.weights),
                clipped=dict(aggregated.clipped),
                bytes_sent=sent,
                entries_sent=entries,
                global_mean_reward=aggregated.stats.mean,
                global_signal=aggregated.stats.std,
                update_norm=float(aggregated.delta.norm()),
            )
            if self.attackers:
                row["attacker_weight_share"] = sum(aggregated.weights[n] for n in self.attackers)
                influence = aggregated.influence
                row["attacker_influence"] = None if influence is None else sum(influence[n] for n in self.attackers)
        row["mean_reward"] = _mean([r.stats.mean for n, r in results.items() if n not in self.attackers])
        row["seconds"] = time.perf_counter() - t0
        return row


def _mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None


def federated_summary(
    fed: FederatedConfig,
    size: int,
    rows: list[dict[str, Any]],
    accuracy_points: list[list[float]],
    global_weights: torch.Tensor | None,
    attackers: bool = False,
) -> dict[str, Any]:
    """The summary's ``federated`` object: accuracy per evaluation, traffic per client and round, compression
    (``size``: the model's entries; ``global_weights``: None for the baselines, which have none)."""
    sent = [b for r in rows for b in r.get("bytes_sent", {}).values()]
    entries = [e for r in rows for e in r.get("entries_sent", {}).values()]
    dense_bytes = 4 * size
    mean_bytes = _mean([float(b) for b in sent])
    mean_entries = _mean([float(e) for e in entries])
    shares = [r["attacker_weight_share"] for r in rows if "attacker_weight_share" in r]
    influence = [r["attacker_influence"] for r in rows if r.get("attacker_influence") is not None]
    return {
        "method": fed.method,
        "clients": fed.clients,
        "partition": fed.partition,
        "weighting": fed.weighting,
        "aggregator": fed.aggregator,
        "calibration": fed.calibration.enabled,
        "budget": fed.sparsity.budget,
        "value_dtype": fed.sparsity.values,
        "bound_stats": fed.defense.bound_stats,
        "attack": fed.attack.name if fed.attack is not None else None,
        "parameters": size,
        "accuracy": accuracy_points,
        "final_accuracy": accuracy_points[-1][1],
        "bytes_per_client_per_round": mean_bytes,
        "entries_per_client_per_round": mean_entries,
        "dense_bytes": dense_bytes,
        "compression_entries": size / mean_entries if mean_entries else None,
        "compression_bytes": dense_bytes / mean_bytes if mean_bytes else None,
        "attacker_weight_share": _mean(shares) if attackers else None,
        # the share the aggregator left it (multi-krum: 0 when excluded; median, trimmed mean: not defined)
        "attacker_influence": _mean(influence) if attackers else None,
        "per_round": [
            {
                "round": r["round"],
                "accuracy": r.get("accuracy"),
                "bytes_per_client": r.get("bytes_sent", {}),
                "entries_per_client": r.get("entries_sent", {}),
                "attacker_weight_share": r.get("attacker_weight_share"),
                "attacker_influence": r.get("attacker_influence"),
            }
            for r in rows
        ],
        "global_weights_digest": digest(global_weights) if global_weights is not None else None,
    }


def federated_run_summary(
    scenario: Scenario,
    points: list[list[float]],
    fed_summary: dict[str, Any],
    rounds_done: int,
    **extra: Any,
) -> RunSummary:
    """A federated run's summary, here or on Flower (``extra``: ``wall_seconds``, ``engine``, ``flower``)."""
    return RunSummary(
        format=SUMMARY_FORMAT,
        scenario=scenario.name,
        task=scenario.task.name,
        model=scenario.model.name,
        mode="federated",
        rounds=scenario.rounds,
        rounds_done=rounds_done,
        complete=rounds_done >= scenario.rounds,
        initial_accuracy=points[0][1],
        final_accuracy=points[-1][1],
        accuracy=[(float(r), float(a)) for r, a in points],
        federated=FederatedSummary.model_validate(fed_summary),
        scenario_config=scenario.model_dump(mode="json"),
        **extra,
    )


def run_federated(
    scenario: Scenario,
    folder: RunFolder,
    on_round: RoundCallback | None = None,
    *,
    stop: StopRequest | None = None,
    saved: dict[str, Any] | None = None,
) -> RunSummary:
    """Run the federated ``scenario`` into ``folder`` (a row appended to ``metrics.jsonl`` as each round ends,
    the whole run saved every ``checkpoint_every`` rounds); ``saved``: the snapshot of an interrupted run, to
    continue from. Returns the summary."""
    t0 = time.perf_counter()
    if scenario.torch_threads:
        torch.set_num_threads(scenario.torch_threads)
    if saved is not None:
        run: FederatedRun = saved["run"]
        points: list[list[float]] = saved["points"]
        rows: list[dict[str, Any]] = saved["rows"]
        wall_before: float = saved["wall_seconds"]
        folder.rewrite_rows(rows)
    else:
        run = FederatedRun(scenario)
        points, rows, wall_before = [[0, run.evaluate()]], [], 0.0
    done = rows[-1]["round"] if rows else 0
    board = None
    if scenario.logging.tensorboard is not None:
        board = TensorBoardObserver(scenario.logging.tensorboard, purge_step=done + 1 if saved is not None else None)
        if saved is None:
            board.log_scalars(0, {"accuracy": points[0][1]})
    for round_idx in range(done + 1, scenario.rounds + 1):
        row = run.round(round_idx)
        if round_idx % scenario.eval.every == 0 or round_idx == scenario.rounds:
            row["accuracy"] = run.evaluate()
            points.append([round_idx, row["accuracy"]])
        rows.append(row)
        folder.append_row(row)  # as each round ends: progress is visible, and kept
        if board is not None:
            board.log_row(round_idx, row)
            board.flush()
        done = round_idx
        if on_round is not None:
            on_round(row)
        stopping = stop is not None and stop.requested
        every = scenario.checkpoint_every
        if every and round_idx < scenario.rounds and (stopping or round_idx % every == 0):
            wall = wall_before + time.perf_counter() - t0
            state = {"scenario": scenario, "run": run, "points": points, "rows": rows, "wall_seconds": wall}
            snapshot.save(folder.snapshot, state)
        if stopping:
            break
    if board is not None:
        board.close()
    weights = run.global_weights if run.fed.method == "federated" else None
    fed_summary = federated_summary(run.fed, run.size, rows, points, weights, bool(run.attackers))
    summary = federated_run_summary(
        scenario, points, fed_summary, done, wall_seconds=wall_before + time.perf_counter() - t0
    )
    summary.write(folder.path)
    if summary.complete:
        folder.drop_state()
    plot_federated({scenario.name: points}, folder.path / "curves.png", title=f"{scenario.name}: {scenario.task.name}")
    return summary
