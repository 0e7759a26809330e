"""Daemon settings: TOML < environment < command line; unknown keys list the valid ones."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dgrpo.daemon.settings import load_node_settings
from dgrpo.errors import ConfigError
from dgrpo.protocol.identity import Identity

BOOT = f"/ip4/1.2.3.4/tcp/1/p2p/{Identity.from_seed(bytes(32)).peer_id}"


def test_precedence_toml_env_cli(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = tmp_path / "node.toml"
    cfg.write_text(f'run_id = "fromtoml"\n[learner]\nlr = 0.1\nseed = 3\n[network]\nbootstrap = ["{BOOT}"]\n')
    s = load_node_settings(cfg)
    assert (s.run_id, s.learner.lr, s.learner.seed, s.network.bootstrap) == ("fromtoml", 0.1, 3, [BOOT])
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


def test_a_node_waits_for_one_peer_by_default(tmp_path: Path) -> None:
    # A node started alone trained alone (min_peers 0): 182 rounds before a second node came up by hand.
    s = load_node_settings(None, [f"state_dir='{tmp_path}'"])
    assert s.rounds.min_peers == 1 and s.rounds.start_timeout_seconds == 600


@pytest.mark.parametrize(
    ("key", "value", "expected"),
    [
        ("network.listen", "foo", r"network\.listen: .*unknown protocol: foo; give a multiaddr such as /ip4/"),
        ("network.listen", "/ip4/1.2.3.4/tcp/99999", r"network\.listen: .*integer not in range"),
        (
            "network.bootstrap",
            '["/ip4/1.2.3.4/tcp/1"]',
            r"network\.bootstrap: .* names no peer; .*ends in /p2p/<peer id>",
        ),
        ("network.bootstrap", '["nope"]', r"network\.bootstrap: .*unknown protocol: nope"),
    ],
)
def test_addresses_are_checked_naming_the_key_and_the_fix(key: str, value: str, expected: str) -> None:
    with pytest.raises(ConfigError, match=expected) as error:
        load_node_settings(None, [f"{key}={value!r}" if key.endswith("listen") else f"{key}={value}"])
    assert "\n" not in str(error.value) and "Value error" not in str(error.value)


def test_addresses_that_name_a_peer_pass() -> None:
    peer, relay = BOOT.rpartition("/")[2], Identity.from_seed(bytes([1]) * 32).peer_id
    addrs = [BOOT, f"/dns4/example.org/tcp/1/p2p/{peer}", f"/ip4/5.6.7.8/tcp/4001/p2p/{relay}/p2p-circuit/p2p/{peer}"]
    assert load_node_settings(None, [f"network.bootstrap={json.dumps(addrs)}"]).network.bootstrap == addrs
    assert load_node_settings(None, ["network.listen='/ip6/::/tcp/0'"]).network.listen == "/ip6/::/tcp/0"


def test_the_completion_exchange_is_called_completions_and_reads_its_old_name(tmp_path: Path) -> None:
    saved = tmp_path / "settings.json"
    saved.write_text('{"mode": "httt"}')  # what a node saved before the rename
    assert load_node_settings(None, saved=saved).mode == "completions"
    assert load_node_settings(None, ["mode='federated'"]).mode == "federated"
    with pytest.raises(ConfigError, match="completions"):
        load_node_settings(None, ["mode='gossip'"])
