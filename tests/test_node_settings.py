"""Daemon settings: TOML < environment < command line; unknown keys list the valid ones."""

from __future__ import annotations

from pathlib import Path

import pytest

from dgrpo.daemon.settings import load_node_settings
from dgrpo.errors import ConfigError


def test_precedence_toml_env_cli(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = tmp_path / "node.toml"
    cfg.write_text(
        'run_id = "fromtoml"\n[learner]\nlr = 0.1\nseed = 3\n[network]\nbootstrap = ["/ip4/1.2.3.4/tcp/1"]\n'
    )
    s = load_node_settings(cfg)
    assert (s.run_id, s.learner.lr, s.learner.seed, s.network.bootstrap) == ("fromtoml", 0.1, 3, ["/ip4/1.2.3.4/tcp/1"])
    monkeypatch.setenv("DGRPO_LEARNER__LR", "0.2")
    monkeypatch.setenv("DGRPO_RUN_ID", "fromenv")
    s = load_node_settings(cfg)
    assert (s.run_id, s.learner.lr, s.learner.seed) == ("fromenv", 0.2, 3)  # env beats TOML, per key
    s = load_node_settings(cfg, ["learner.lr=0.3", "rounds.max_rounds=4"])
    assert (s.run_id, s.learner.lr, s.rounds.max_rounds) == ("fromenv", 0.3, 4)  # CLI beats env


def test_defaults_derive_paths_from_state_dir(tmp_path: Path) -> None:
    s = load_node_settings(None, [f"state_dir='{tmp_path}'"])
    assert s.key_path == tmp_path / "identity.key"
    assert s.checkpoint_folder == tmp_path / "checkpoints"


def test_unknown_keys_and_bad_values(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"unknown node setting key 'rounds.deadline'.*deadline_seconds"):
        load_node_settings(None, ["rounds.deadline=3"])
    with pytest.raises(ConfigError, match="run_id"):
        load_node_settings(None, ["run_id='bad id/with slash'"])
    with pytest.raises(ConfigError, match="not found"):
        load_node_settings(tmp_path / "missing.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text("run_id = = 3")
    with pytest.raises(ConfigError, match="invalid TOML"):
        load_node_settings(bad)
