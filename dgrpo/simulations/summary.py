"""The run summary: one typed, versioned record of a run, written as ``summary.json`` by every simulation
(decentralised, federated, on Flower) and read by ``dgrpo report``, ``dgrpo sweep`` and the benchmarks.

Nothing else parses ``summary.json``: :func:`load_summary` is the one reader. ``format`` is the version of
this schema; a summary written before it had one (format 0: the same keys, without ``format``,
``rounds_done`` or ``complete``) reads as format 0; one from a newer dgrpo is refused with the reason.
Unknown keys of an older or newer minor addition are ignored on read, so an old reader never crashes on a
field it does not know, but a key that changes meaning must bump ``format``.

What a summary does not cover: the per-round rows (``metrics.jsonl``, :mod:`dgrpo.simulations.run_files`)
and the models' weights (``state/`` of a resumable run).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from dgrpo.atomic import write_atomically
from dgrpo.errors import ConfigError

SUMMARY_FORMAT = 1
SUMMARY_FILE = "summary.json"

Point = tuple[float, float]  # (round, value); evaluation points


class _Record(BaseModel):
    model_config = ConfigDict(frozen=True, extra="ignore")


class DefenseSummary(_Record):
    """What the honest nodes' defense chain (and the admit stage's binding) did over the run
    (:class:`dgrpo.simulations.defense_metrics.DefenseMeter`)."""

    names: list[str] = Field(default_factory=list, description="the chain, in order")
    stop_rate: float | None = Field(None, description="poison rejected / poison received by honest nodes")
    false_positive_rate: float | None = Field(None, description="honest completions rejected / received")
    false_positive_rate_by_model: dict[str, float] = Field(default_factory=dict)
    overhead_ratio: float | None = Field(None, description="defense seconds / generation seconds")
    counts: dict[str, int] = Field(
        default_factory=dict, description="poison_/honest_/attacker_other_ received, rejected"
    )
    rejected_by_reason: dict[str, int] = Field(default_factory=dict)
    rejected_by_kind: dict[str, dict[str, int]] = Field(default_factory=dict)
    blacklisted: dict[str, dict[str, int]] = Field(default_factory=dict, description="by node: peer -> round")
    defense_seconds: float = 0.0
    generation_seconds: float = 0.0

    def ratio(self, kind: str) -> tuple[int, int]:
        """(rejected, received) of ``kind`` (poison, honest, attacker_other)."""
        return self.counts.get(f"{kind}_rejected", 0), self.counts.get(f"{kind}_received", 0)


class FederatedRound(_Record):
    round: int
    accuracy: float | None = None
    bytes_per_client: dict[str, float] = Field(default_factory=dict)
    entries_per_client: dict[str, float] = Field(default_factory=dict)
    attacker_weight_share: float | None = None
    attacker_influence: float | None = None


class FederatedSummary(_Record):
    """A federated run's own figures (:func:`dgrpo.simulations.federated.federated_summary`)."""

    method: str
    clients: int
    partition: str
    weighting: str
    aggregator: str
    calibration: bool
    budget: float
    value_dtype: str
    bound_stats: bool
    attack: str | None = None
    parameters: int
    accuracy: list[Point]
    final_accuracy: float
    bytes_per_client_per_round: float | None = None
    entries_per_client_per_round: float | None = None
    dense_bytes: int
    compression_entries: float | None = None
    compression_bytes: float | None = None
    attacker_weight_share: float | None = None
    attacker_influence: float | None = None
    per_round: list[FederatedRound] = Field(default_factory=list)
    global_weights_digest: str | None = None


class RunSummary(_Record):
    """``summary.json``. Accuracy is held-out accuracy of the honest nodes (mean over them), evaluated at
    ``accuracy``'s rounds; ``asr`` is the attack's success rate at the same rounds, or, where ``asr_metric``
    is ``mean_length`` (DoS), the honest nodes' mean completion length in characters."""

    format: int = Field(0, description="the schema version (SUMMARY_FORMAT when written by this dgrpo)")
    scenario: str
    task: str
    model: str | list[str]
    mode: str = Field(description="homogeneous, heterogeneous or federated")
    nodes: int | None = None
    split: str | None = None
    rounds: int = Field(description="rounds the scenario asked for")
    rounds_done: int | None = Field(None, description="rounds that ran (< rounds: the run was interrupted)")
    complete: bool = True
    initial_accuracy: float
    final_accuracy: float
    accuracy: list[Point]
    honest_final_accuracy: float | None = None
    final_honest_reward: float | None = None
    attack: str | None = None
    malicious: int = 0
    attacker_share: float | None = None
    fair_share: float | None = None
    asr_metric: str | None = None
    asr: list[Point] = Field(default_factory=list)
    final_asr: float | None = None
    mean_length: list[Point] = Field(default_factory=list)
    final_mean_length: float | None = None
    attack_stats: dict[str, int] = Field(default_factory=dict)
    defense: DefenseSummary | None = None
    wire: dict[str, Any] = Field(default_factory=dict)
    wall_seconds: float = 0.0
    engine: dict[str, Any] | str | None = None
    training_reward_seconds: float | None = None
    federated: FederatedSummary | None = None
    flower: dict[str, Any] | None = None
    scenario_config: dict[str, Any] = Field(default_factory=dict)

    # ---------------------------------------------------------------- derived figures, one definition each
    @property
    def length_metric(self) -> bool:
        """The attack is measured by completion length (DoS), not by a success rate."""
        return self.asr_metric == "mean_length"

    @property
    def final_rate(self) -> float | None:
        """The final attack success rate (None for a DoS run, measured by length, or without an attack)."""
        return None if self.length_metric else self.final_asr

    @property
    def max_asr(self) -> float | None:
        return max((v for _, v in self.asr), default=None)

    @property
    def honest_accuracy(self) -> float:
        return self.final_accuracy if self.honest_final_accuracy is None else self.honest_final_accuracy

    @property
    def stop_rate(self) -> float | None:
        return self.defense.stop_rate if self.defense is not None else None

    @property
    def false_positive_rate(self) -> float | None:
        return self.defense.false_positive_rate if self.defense is not None else None

    @property
    def chain(self) -> str:
        return ",".join(self.defense.names) if self.defense is not None and self.defense.names else "none"

    def write(self, folder: Path) -> Path:
        """``folder/summary.json``, written atomically (an interrupted write leaves the previous one)."""
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / SUMMARY_FILE
        write_atomically(path, (self.model_dump_json(indent=2) + "\n").encode(), mode=0o644)
        return path

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = json.loads(self.model_dump_json())
        return data


def summary_path(run: Path) -> Path:
    return run if run.name == SUMMARY_FILE or run.suffix == ".json" else run / SUMMARY_FILE


def has_summary(run: Path) -> bool:
    return summary_path(run).is_file()


def parse_summary(text: str, where: str = SUMMARY_FILE) -> RunSummary:
    """A summary from its JSON text; anything malformed is a :class:`ConfigError` naming ``where``."""
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise ConfigError(f"{where}: not valid JSON ({exc})") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{where}: not a run summary (a JSON object)")
    version = data.get("format", 0)
    if isinstance(version, int) and version > SUMMARY_FORMAT:
        raise ConfigError(
            f"{where}: summary format {version} is newer than this dgrpo reads ({SUMMARY_FORMAT}); upgrade dgrpo"
        )
    try:
        return RunSummary.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        loc = ".".join(str(p) for p in first["loc"])
        raise ConfigError(f"{where}: not a run summary ({loc}: {first['msg']})") from None


def load_summary(run: Path) -> RunSummary:
    """The summary of the run folder ``run`` (or of the ``summary.json`` it names)."""
    path = summary_path(run)
    if not path.is_file():
        raise ConfigError(f"no summary.json in {run} (is it a `dgrpo simulate` output folder?)")
    return parse_summary(path.read_text(errors="replace"), str(path))
