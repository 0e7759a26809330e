"""The Flower run's configuration: which dgrpo scenario, with which overrides.

Flower passes a run's configuration as flat scalars (``flwr run ... --run-config 'scenario="fed-grpo-skewed"
overrides="rounds=5;run_id=\\"fed-s1\\""'``); the same scenario file and overrides as ``dgrpo simulate``
take, so a Flower run and a simulation of the same scenario are the same experiment.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from dgrpo.errors import ConfigError
from dgrpo.simulations.scenario import Scenario, load_scenario


def overrides_of(text: str) -> list[str]:
    """``key=value`` overrides separated by ``;`` (a run-config value is one string)."""
    return [item.strip() for item in text.split(";") if item.strip()]


def scenario_of(run_config: Mapping[str, object]) -> Scenario:
    """The federated scenario a run configuration names (``scenario``, ``overrides``)."""
    name = str(run_config.get("scenario", "fed-grpo"))
    scenario = load_scenario(Path(name), overrides_of(str(run_config.get("overrides", ""))))
    if scenario.federated is None or scenario.federated.method != "federated":
        raise ConfigError(f"scenario {name!r} is not a federated one (federated.method = 'federated')")
    return scenario
