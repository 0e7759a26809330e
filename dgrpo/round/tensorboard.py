"""TensorBoard event files of a run (``logging.tensorboard``), one step per round: what TRL, Flower and every
training tool log, for ``tensorboard --logdir DIR``.

:class:`TensorBoardObserver` is a :class:`~dgrpo.round.observer.RoundObserver`. Each round it writes every
node's own numbers (:func:`node_scalars`) under ``<node>/...`` (a simulation's node ids, ``node-0/reward``; a
daemon's ``node/reward``), and, where given, the run's row of that round (a simulation's ``metrics.jsonl`` row,
:func:`row_scalars`) under ``run/...``. Counts (whole numbers) are sparse in the outcomes and rows (a rejection
reason appears in the rounds it happened in): a count tag written once is written as 0 in the later rounds
that lack it, so that its curve does not draw a line across them. Measurements (float) that a round lacks
(a loss without a step, an accuracy between evaluations) are left out.

The writer flushes after every round, so an interrupted run keeps every round it logged.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

from torch.utils.tensorboard import SummaryWriter

from dgrpo.round.observer import RoundObserver
from dgrpo.round.outcome import RoundOutcome

Number = int | float
RUN = "run"  # the tag prefix of the run-level row
ROW_SKIP = frozenset({"round", "by_author"})  # a metrics.jsonl row's keys that are no scalars of the round


def node_scalars(o: RoundOutcome) -> dict[str, Number]:
    """One node's round, as TensorBoard scalars (tags without the node's prefix)."""
    out: dict[str, Number] = {
        "reward": o.scoring.mean_reward,  # every completion it trained on (its own and its peers')
        "own_reward": o.scoring.mean_reward_of(o.peer_id),
        "completions_trained": o.completions_trained,
        "completions_published": o.produced.completions,
        "completions_received": o.admission.completions_received,
        "rejected/total": sum(o.admission.rejected.values()),  # messages the admit stage rejected, by reason
        **{f"rejected/{reason}": n for reason, n in o.admission.rejected.items()},
        "seconds/round": o.round_seconds,
        "seconds/reward": o.scoring.seconds,
    }
    if o.step is not None:
        out |= {"loss": o.step.loss, "grad_norm": o.step.grad_norm, "tokens": o.step.tokens}
    if o.defense is not None:
        checked = sum(o.defense.checked_by_author.values())
        rejected = sum(o.defense.rejected.values())
        out |= {
            "defense/checked": checked,  # peers' completions the chain checked
            "defense/rejected/total": rejected,
            **{f"defense/rejected/{reason}": n for reason, n in o.defense.rejected.items()},
            "defense/blacklisted": len(o.defense.blacklisted_now),
            "seconds/defense": sum(o.defense.seconds.values()),
        }
        if checked:
            out["defense/reject_rate"] = rejected / checked
    if o.drawn is not None:
        out |= {"drawn/offered": o.drawn.offered, "drawn/drawn": o.drawn.drawn, "drawn/young": o.drawn.young_drawn}
    if o.produced.attack is not None:
        out["poisoned"] = o.produced.poisoned_count
    if o.staleness:  # async mode: how old the peers' completions it trained on were, in rounds
        n = sum(o.staleness.values())
        if n:
            out["staleness/mean"] = sum(age * k for age, k in o.staleness.items()) / n
    if o.filled:
        out["filled"] = o.filled
    return out


def row_scalars(row: Mapping[str, Any], skip: frozenset[str] = ROW_SKIP) -> dict[str, Number]:
    """A row of per-round numbers (a simulation's ``metrics.jsonl`` row) as TensorBoard scalars: every number,
    nested keys joined by ``/`` (``defense.stop_rate`` -> ``defense/stop_rate``, ``rejected.<reason>`` ->
    ``rejected/<reason>``); ``None``, text, lists and booleans left out, and the top-level keys in ``skip``."""
    out: dict[str, Number] = {}

    def walk(prefix: str, value: Any) -> None:
        if isinstance(value, Mapping):
            for key, sub in value.items():
                walk(f"{prefix}/{key}" if prefix else str(key), sub)
        elif isinstance(value, int | float) and not isinstance(value, bool):
            out[prefix] = value

    for key, value in row.items():
        if key not in skip:
            walk(str(key), value)
    return out


class TensorBoardObserver(RoundObserver):
    """Writes each round to TensorBoard event files in ``log_dir`` (made if missing), at step = the round.

    ``prefix``: the tag prefix of every node's scalars; None: each node's peer id (a simulation: ``node-0``).
    ``accuracy``: the held-out accuracy of a round where evaluated (a daemon's ``eval.every``), written as
    ``<prefix>/accuracy``. ``rows``: a list of run-level rows (dicts with ``round``) another observer appends
    to before this one runs (the simulation's ``metrics.jsonl`` rows): its last row, if it is this round's, is
    written under ``run/`` as :meth:`log_row` would. ``purge_step``: a run resumed at this round hides what an
    earlier run of the same folder logged from this round on (TensorBoard's purge)."""

    def __init__(
        self,
        log_dir: str | Path,
        prefix: str | None = None,
        accuracy: Callable[[int], float | None] | None = None,
        rows: Sequence[Mapping[str, Any]] | None = None,
        purge_step: int | None = None,
    ) -> None:
        self.log_dir = Path(log_dir)
        self.prefix = prefix
        self.accuracy = accuracy
        self.rows = rows
        self.writer: SummaryWriter | None = SummaryWriter(str(self.log_dir), purge_step=purge_step)
        self._counts: dict[str, set[str]] = {}  # by scope (a node's prefix, run): the count tags written

    def on_round(self, round_idx: int, outcomes: Sequence[RoundOutcome]) -> None:
        for o in outcomes:
            scope = self.prefix if self.prefix is not None else o.peer_id
            scalars = node_scalars(o)
            accuracy = self.accuracy(o.round) if self.accuracy is not None else None
            if accuracy is not None:
                scalars["accuracy"] = accuracy
            self._write(scope, o.round, scalars)
        if self.rows and self.rows[-1].get("round") == round_idx:
            self._write(RUN, round_idx, row_scalars(self.rows[-1]))
        self.flush()

    def log_row(self, round_idx: int, row: Mapping[str, Any], prefix: str = RUN) -> None:
        """The run's numbers of round ``round_idx`` (:func:`row_scalars` of ``row``), under ``prefix/``."""
        self._write(prefix, round_idx, row_scalars(row))
        self.flush()

    def log_scalars(self, round_idx: int, scalars: Mapping[str, Number], prefix: str = RUN) -> None:
        """Any other numbers of round ``round_idx``, under ``prefix/`` (counts: ``int``, as in :meth:`on_round`)."""
        self._write(prefix, round_idx, scalars)
        self.flush()

    def _write(self, scope: str, step: int, scalars: Mapping[str, Number]) -> None:
        if self.writer is None:
            raise ValueError(f"the TensorBoard writer of {self.log_dir} is closed")
        counts = self._counts.setdefault(scope, set())
        for tag in sorted(counts - scalars.keys()):
            self.writer.add_scalar(f"{scope}/{tag}", 0, step)
        for tag, value in scalars.items():
            if isinstance(value, int) and not isinstance(value, bool):
                counts.add(tag)
            self.writer.add_scalar(f"{scope}/{tag}", float(value), step)

    def flush(self) -> None:
        if self.writer is not None:
            self.writer.flush()

    def close(self) -> None:
        """Flush and close the event file (again: nothing)."""
        if self.writer is not None:
            self.writer.close()
            self.writer = None

    def __enter__(self) -> TensorBoardObserver:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.close()
