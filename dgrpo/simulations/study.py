"""A study as code: a TOML file naming the runs of an experiment and the tables to make of them
(``dgrpo sweep STUDY.toml``; the shipped ones in ``studies/`` make the tables of ``docs/results.md``).

A study has **axes**, each a set of named values; a value may name a scenario and sets overrides
(``-s``-style keys). Its **cells** are the product of the axes (every value of every axis, in the order
written), or the union of the ``[[grid]]`` blocks, each a product of chosen values; plus single
``[cells.X]``. A cell's name joins its values with ``/`` (``text/logit``, also its folder: runs go to
``text/logit/seed0/``). Each cell runs ``seeds`` times (seed 0 is the scenario as shipped; seed k > 0 sets
``learner.seed = k`` and suffixes the run id, as ``dgrpo sweep --seeds`` does). Overrides apply in this
order, later winning: the study's ``[set]``, each axis value's ``set`` in axis order, the cell's own, then
the command line's ``-s``. A study's ``[[table]]`` blocks name their columns: axes (the value's label) and
measures (:mod:`dgrpo.simulations.measures`)::

    [study]
    name = "defenses"
    scenario = "text-horizontal"
    seeds = 2
    [set]
    rounds = 20
    [axes.defense.none]
    set = { "defense.chain" = [] }
    [axes.defense.logit]
    set = { "defense.chain" = ["logit"] }
    [[table]]
    name = "defenses"
    columns = ["defense", "stop", "fpr", "accuracy", "asr"]
"""

from __future__ import annotations

import itertools
import json
import re
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from dgrpo.errors import ConfigError
from dgrpo.overrides import explain_validation_error

# a DoS run's figure is its length, in its own column: "asr_rate" is None for it
SWEEP_MEASURES = ("seeds", "final_accuracy", "asr_rate", "length", "stop", "fpr", "attacker_share")
STUDY_DIR = Path(__file__).resolve().parents[2] / "studies"  # the shipped studies (a source checkout)
_NAME = re.compile(r"^[A-Za-z0-9_+-][A-Za-z0-9_.+-]*$")  # a folder name: no "/", not "." or ".."


class _Strict(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class AxisValue(_Strict):
    scenario: Annotated[str | None, Field(description="a shipped scenario or a TOML file (later axes win)")] = None
    set: Annotated[dict[str, Any], Field(description="overrides: key (dotted) -> value")] = {}
    label: Annotated[str | None, Field(description="how tables name this value (default: its name)")] = None


class Holds(_Strict):
    """The target a ``holds`` column checks (issue 28's: stop >= 0.9 and every honest family's FPR <= 0.05)."""

    stop_min: float | None = None
    fpr_max: float | None = None
    family_fpr_max: float | None = None


class TableSpec(_Strict):
    name: Annotated[str, Field(description="file name of the table: tables/<name>.md and .csv")]
    title: str = ""
    columns: Annotated[list[str], Field(min_length=1, description="axes and measures, in order")]
    where: Annotated[dict[str, list[str]], Field(description="axis -> the values kept (default: all)")] = {}
    cells: Annotated[list[str], Field(description="the cells kept, in this order (default: every cell)")] = []
    baseline: Annotated[str | None, Field(description="a cell the length_vs_baseline column divides by")] = None
    holds: Holds | None = None
    plot: Annotated[list[str], Field(description="numeric measures drawn as bars, one panel each")] = []


class StudyHeader(_Strict):
    name: str
    title: str = ""
    doc: Annotated[str, Field(description="where the study's tables are published (docs/results.md, section)")] = ""
    scenario: Annotated[str | None, Field(description="every cell's scenario unless an axis value names one")] = None
    seeds: Annotated[int, Field(ge=1, le=100)] = 1


class StudySpec(_Strict):
    study: StudyHeader
    set: dict[str, Any] = {}
    axes: dict[str, dict[str, AxisValue]] = {}
    grid: list[dict[str, list[str]]] = []
    cells: dict[str, AxisValue] = {}
    table: list[TableSpec] = []

    @model_validator(mode="after")
    def _names_and_references(self) -> StudySpec:
        for axis, values in self.axes.items():
            if not values:
                raise ValueError(f"axis {axis!r} has no values")
            for name in values:
                if not _NAME.match(name):
                    raise ValueError(f"axis {axis!r}: value name {name!r} may hold letters, digits and _ . + - only")
        for i, block in enumerate(self.grid):
            for axis, chosen in block.items():
                known = self.axes.get(axis)
                if known is None:
                    raise ValueError(f"grid {i + 1} names axis {axis!r}; axes: {', '.join(self.axes)}")
                unknown = [v for v in chosen if v not in known]
                if unknown:
                    raise ValueError(f"grid {i + 1}: {axis} has no value {unknown[0]!r}; values: {', '.join(known)}")
        if not self.axes and not self.cells:
            raise ValueError("a study needs [axes.<axis>.<value>] or [cells.<name>]")
        return self


@dataclass(frozen=True)
class Cell:
    """One run of a study: a cell at one seed."""

    name: str
    scenario: str | None
    overrides: tuple[str, ...]
    coords: tuple[tuple[str, str], ...]  # (axis, value) pairs; empty for a [cells.X] cell
    seed: int

    @property
    def folder(self) -> str:
        return f"{self.name}/seed{self.seed}"

    def value(self, axis: str) -> str | None:
        return dict(self.coords).get(axis)


def override(key: str, value: Any) -> str:
    """``key=value`` as ``-s`` takes it (JSON is valid for every TOML value a study holds)."""
    return f"{key}={json.dumps(value)}"


@dataclass(frozen=True)
class Study:
    spec: StudySpec
    source: str  # the TOML text (kept with the outputs)

    @property
    def name(self) -> str:
        return self.spec.study.name

    def cells(self, extra: tuple[str, ...] = ()) -> list[Cell]:
        """Every run, cell by cell, seed by seed; ``extra``: overrides for every cell (the command line's)."""
        spec = self.spec
        combos: list[tuple[tuple[str, str], ...]] = []
        blocks = spec.grid or ([{axis: list(values) for axis, values in spec.axes.items()}] if spec.axes else [])
        for block in blocks:
            axes = [a for a in spec.axes if a in block]  # the axes' own order, whatever the block's
            for values in itertools.product(*(block[a] for a in axes)):
                combo = tuple(zip(axes, values, strict=True))
                if combo not in combos:
                    combos.append(combo)
        named: list[tuple[str, str | None, list[str], tuple[tuple[str, str], ...]]] = []
        base = [override(k, v) for k, v in spec.set.items()]
        for combo in combos:
            scenario, sets = spec.study.scenario, list(base)
            for axis, value in combo:
                v = spec.axes[axis][value]
                scenario = v.scenario or scenario
                sets += [override(k, x) for k, x in v.set.items()]
            named.append(("/".join(value for _, value in combo), scenario, sets, combo))
        for name, v in spec.cells.items():
            sets = [*base, *(override(k, x) for k, x in v.set.items())]
            named.append((name, v.scenario or spec.study.scenario, sets, ()))
        seen: set[str] = set()
        out = []
        for name, scenario, sets, combo in named:
            if name in seen:
                raise ConfigError(f"study {self.name}: two cells are named {name!r}")
            seen.add(name)
            for seed in range(spec.study.seeds):
                out.append(Cell(name, scenario, (*sets, *extra), combo, seed))
        return out

    def label(self, axis: str, value: str) -> str:
        v = self.spec.axes.get(axis, {}).get(value)
        return v.label if v is not None and v.label else value


def parse_study(text: str, where: str) -> Study:
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"study {where}: invalid TOML: {exc}") from None
    try:
        return Study(StudySpec.model_validate(data), text)
    except ValidationError as exc:
        raise explain_validation_error(exc, StudySpec, f"study {where}") from None


def load_study(path: Path) -> Study:
    """The study in ``path`` (a TOML file, or the name of a shipped study in ``studies/``)."""
    if not path.exists() and (STUDY_DIR / f"{path}.toml").is_file():
        path = STUDY_DIR / f"{path}.toml"
    if not path.is_file():
        shipped = sorted(p.stem for p in STUDY_DIR.glob("*.toml"))
        hint = f"; shipped studies: {', '.join(shipped)}" if shipped else ""
        raise ConfigError(f"study file {str(path)!r} not found{hint}")
    return parse_study(path.read_text(), str(path))


def adhoc_study(scenarios: list[str], chains: list[tuple[str, ...]], seeds: int) -> Study:
    """``dgrpo sweep SCENARIO... -d CHAIN... --seeds K`` as a study: axes scenario x defense, and the classic
    sweep table."""

    def label(chain: tuple[str, ...]) -> str:
        return "+".join(chain) or "none"

    spec = StudySpec(
        study=StudyHeader(name="sweep", seeds=seeds),
        axes={
            "scenario": {Path(s).stem: AxisValue(scenario=None if s == "default" else s) for s in scenarios},
            "defense": {label(c): AxisValue(set={"defense.chain": list(c)}) for c in chains},
        },
        table=[
            TableSpec(
                name="sweep", columns=["scenario", "defense", *SWEEP_MEASURES], plot=["final_accuracy", "asr_rate"]
            )
        ],
    )
    return Study(spec, "")
