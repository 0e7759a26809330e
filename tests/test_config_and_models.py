"""Bad configuration gets a clear error that names the valid choices."""

from __future__ import annotations

from pathlib import Path

import pytest

from dgrpo.config import ModelConfig
from dgrpo.errors import ConfigError, ModelNotFoundError, UnknownNameError
from dgrpo.learner.models import embedded_models, load_model, resolve_model
from dgrpo.simulations.scenario import load_scenario


def test_unknown_scenario_key_lists_valid_keys() -> None:
    with pytest.raises(ConfigError, match=r"unknown scenario key 'learner.lrr'.*loss_type, lr\b"):
        load_scenario(None, ["learner.lrr=1e-4"])
    with pytest.raises(ConfigError, match=r"unknown scenario key 'roundz'.*rounds"):
        load_scenario(None, ["roundz=3"])


def test_scenario_overrides_and_toml(tmp_path: Path) -> None:
    f = tmp_path / "s.toml"
    f.write_text('name = "x"\nrounds = 7\n[learner]\nlr = 0.001\n[nodes]\ncount = 2\n')
    sc = load_scenario(f, ["learner.loss_type=grpo", "round.group_size=4"])
    assert (sc.name, sc.rounds, sc.learner.lr, sc.learner.loss_type, sc.nodes.count) == ("x", 7, 0.001, "grpo", 2)
    assert sc.node_rollout().completions_per_prompt == 2  # G / m in the horizontal split


def test_bad_values_and_missing_files(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"learner\.loss_type"):
        load_scenario(None, ["learner.loss_type=ppo"])
    with pytest.raises(ConfigError, match="not found"):
        load_scenario(tmp_path / "nope.toml")
    with pytest.raises(ConfigError, match="key=value"):
        load_scenario(None, ["rounds"])
    with pytest.raises(ConfigError, match="not divisible"):
        load_scenario(None, ["nodes.count=3"]).node_rollout()


def test_vertical_split_per_node_work() -> None:
    sc = load_scenario(None, ["rollout.split='vertical'", "round.prompts_per_round=8", "round.group_size=6"])
    r = sc.node_rollout()
    assert (r.prompts_per_round, r.completions_per_prompt) == (2, 6)  # B/m own prompts, G completions


def test_unknown_embedded_model_lists_names() -> None:
    with pytest.raises(UnknownNameError, match="dgrpo:tiny-arith"):
        resolve_model("dgrpo:no-such-model")
    assert "dgrpo:tiny-arith" in embedded_models()


def test_missing_model_path_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ModelNotFoundError, match="does not exist"):
        load_model(ModelConfig(name=str(tmp_path / "missing")))
    with pytest.raises(ModelNotFoundError, match="does not exist"):
        resolve_model("./models/missing")
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ModelNotFoundError, match=r"no config\.json"):
        load_model(ModelConfig(name=str(empty)))
    (empty / "config.json").write_text("{}")
    with pytest.raises(ModelNotFoundError, match="could not load"):
        load_model(ModelConfig(name=str(empty)))


def test_unknown_task_lists_names() -> None:
    from dgrpo.tasks import get_task

    with pytest.raises(UnknownNameError, match=r"arith.*arith-code"):
        get_task("arithmetic")
