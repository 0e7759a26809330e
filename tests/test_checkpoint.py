"""Checkpoints: atomic write, rotation, corruption detection and fallback, a learner's state round trip."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from dgrpo.config import LearnerConfig, ModelConfig
from dgrpo.daemon.checkpoint import CheckpointManager, CheckpointState
from dgrpo.daemon.launch import open_daemon
from dgrpo.learner.batch import TrainSample
from dgrpo.learner.learner import Learner


def state(round_idx: int) -> CheckpointState:
    return CheckpointState(
        round=round_idx,
        model={"w": torch.full((2,), float(round_idx))},
        optimizer={"state": {}, "param_groups": [{"lr": 0.1, "params": [0]}]},
        nonce=1000 + round_idx,
        replay={"authors": {"peer": [round_idx, [round_idx - 1]]}},
        meta={"peer_id": "me"},
    )


def test_save_rotate_and_load_latest(tmp_path: Path) -> None:
    mgr = CheckpointManager(tmp_path, keep=2)
    for r in (1, 2, 3):
        mgr.save(state(r))
    assert [p.name for p in mgr.checkpoints()] == ["round-00000003.ckpt", "round-00000002.ckpt"]
    latest = mgr.load_latest()
    assert latest is not None
    assert (latest.round, latest.nonce, latest.meta) == (3, 1003, {"peer_id": "me"})
    assert torch.equal(latest.model["w"], torch.tensor([3.0, 3.0]))
    assert latest.replay == {"authors": {"peer": [3, [2]]}}
    assert not list(tmp_path.glob(".*tmp*"))  # no temporary files left behind


def test_corrupted_newest_falls_back_to_previous(tmp_path: Path) -> None:
    mgr = CheckpointManager(tmp_path, keep=3)
    mgr.save(state(4))
    newest = mgr.save(state(5))
    raw = bytearray(newest.read_bytes())
    raw[-10] ^= 0xFF  # one flipped bit in the payload
    newest.write_bytes(bytes(raw))
    loaded = mgr.load_latest()
    assert loaded is not None and loaded.round == 4
    newest.write_bytes(b"garbage")  # and a truncated / foreign file
    loaded = mgr.load_latest()
    assert loaded is not None and loaded.round == 4


def test_nothing_to_resume(tmp_path: Path) -> None:
    assert CheckpointManager(tmp_path).load_latest() is None


def test_learner_state_round_trip(tmp_path: Path, random_model_dir: Path) -> None:
    cfg = LearnerConfig(lr=1e-2)
    a = Learner(ModelConfig(name=str(random_model_dir)), cfg)
    batch = [TrainSample((5,), (6, 2), 1.0), TrainSample((5,), (7, 2), -1.0)]
    a.train_step(batch, 1.0, 4)
    mgr = CheckpointManager(tmp_path)
    mgr.save(CheckpointState(7, a.model.state_dict(), a.optimizer.state_dict(), 42, {}))
    b = Learner(ModelConfig(name=str(random_model_dir)), cfg)
    loaded = mgr.load_latest()
    assert loaded is not None
    b.model.load_state_dict(loaded.model)
    b.optimizer.load_state_dict(loaded.optimizer)
    assert a.weights_digest() == b.weights_digest()
    a.train_step(batch, 1.0, 4)  # the same next step from the same model and optimizer state
    b.train_step(batch, 1.0, 4)
    assert a.weights_digest() == b.weights_digest()


def test_reputation_and_blacklist_survive_a_resume(tmp_path: Path) -> None:
    # A restart is no amnesty: whom the node blacklisted, and the rejection rates in progress, come back.
    from dgrpo.daemon.settings import load_node_settings

    sets = [f"state_dir={str(tmp_path)!r}", "defense.chain=['length']", "status.enabled=false"]
    first = open_daemon(load_node_settings(None, sets))
    assert first.reputation is not None
    first.reputation.record(3, "peerA", 10, 9)
    assert first.reputation.update(3) == ["peerA"]
    first.reputation.record(3, "peerB", 10, 2)  # under the threshold, but its history counts later
    first.restored_blacklist = ["peerC"]  # blacklisted at the network layer for invalid messages
    first.rounds_done, first.round = 3, 4
    first.save_checkpoint()

    again = open_daemon(load_node_settings(None, sets), resume=True)
    assert again.round == 4
    assert again.reputation is not None
    assert again.reputation.blacklisted == {"peerA": 3}
    assert again.reputation.rate("peerB") == (0.2, 10)
    assert again.restored_blacklist == ["peerC"]
    assert again.node.blacklisted("peerA") and not again.node.blacklisted("peerB")


def test_a_write_killed_before_its_rename_leaves_a_temp_file_that_start_up_removes(tmp_path: Path) -> None:
    # A real SIGKILL between the fsync and the rename: the temp file stays behind (issue 13: nothing removed it).
    import subprocess
    import sys

    from dgrpo.atomic import remove_orphans

    kept = tmp_path / "round-00000001.ckpt"
    kept.write_bytes(b"an older checkpoint")
    script = (
        "import os, signal, sys\n"
        "from pathlib import Path\n"
        "import dgrpo.atomic as atomic\n"
        "atomic.os.replace = lambda *a: os.kill(os.getpid(), signal.SIGKILL)\n"
        "atomic.write_atomically(Path(sys.argv[1]), b'x' * 1000)\n"
    )
    proc = subprocess.run([sys.executable, "-c", script, str(tmp_path / "round-00000002.ckpt")], check=False)
    assert proc.returncode == -9
    orphans = [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]
    assert len(orphans) == 1 and orphans[0].name.startswith(".round-00000002.ckpt.")
    assert remove_orphans(tmp_path) == orphans
    assert sorted(p.name for p in tmp_path.iterdir()) == [kept.name]  # nothing else touched
    assert remove_orphans(tmp_path) == []


def test_resume_refuses_to_lose_identity_or_training_silently(tmp_path: Path) -> None:
    # Issue 13: with every checkpoint corrupt, --resume started fresh at round 1; with the key deleted it made a
    # new identity and continued the old state under it; another model died with a raw traceback.
    import pytest

    from dgrpo.daemon.settings import load_node_settings
    from dgrpo.errors import ConfigError

    sets = [f"state_dir={str(tmp_path)!r}", "status.enabled=false"]
    first = open_daemon(load_node_settings(None, sets))
    first.rounds_done, first.round = 2, 3
    first.save_checkpoint()
    (saved,) = first.checkpoints.checkpoints()
    # A SIGKILL mid-write left a temp file: the next start removes it.
    orphan = saved.parent / f".{saved.name}.abcd1234.tmp"
    orphan.write_bytes(b"half a checkpoint")

    # Another model under the configuration: refused, naming both.
    other = [*sets, "model.name='dgrpo:tiny-arith-llama'"]
    with pytest.raises(ConfigError, match=r"holds model 'dgrpo:tiny-arith'.*'dgrpo:tiny-arith-llama'"):
        open_daemon(load_node_settings(None, other), resume=True)
    assert not orphan.exists()

    # Every checkpoint corrupt: refused, naming the files.
    good = saved.read_bytes()
    saved.write_bytes(b"corrupt")
    with pytest.raises(ConfigError, match=rf"none of the checkpoints .* verifies \({saved.name}\)"):
        open_daemon(load_node_settings(None, sets), resume=True)
    saved.write_bytes(good)

    # The identity key deleted while state remains: refused before a new key is made.
    key = load_node_settings(None, sets).key_path
    kept_key = key.read_bytes()
    key.unlink()
    with pytest.raises(ConfigError, match=r"identity key .* is missing.*round-00000002\.ckpt"):
        open_daemon(load_node_settings(None, sets), resume=True)
    assert not key.exists()
    key.write_bytes(kept_key)
    assert open_daemon(load_node_settings(None, sets), resume=True).rounds_done == 2  # all restored: it resumes


def _node_with_state(state: Path) -> tuple[list[str], str, Any]:
    """A node that ran: identity, a checkpoint with a blacklisted peer and reputation, replay and nonce files."""
    from dgrpo.daemon.settings import load_node_settings
    from dgrpo.protocol.identity import Identity

    sets = [f"state_dir={str(state)!r}", "status.enabled=false", "defense.chain=['length']"]
    node = open_daemon(load_node_settings(None, sets))
    node.rounds_done, node.round = 2, 3
    bad = Identity.from_seed(bytes([9]) * 32).peer_id
    node.restored_blacklist = [bad]
    assert node.reputation is not None
    node.reputation.blacklisted[bad] = 1
    node.reputation.evidence[bad] = 3
    node.replay.record(bad, 7)
    node.replay.save(node.replay_path)
    node.save_checkpoint()
    return sets, node.peer_id, node


@pytest.mark.parametrize("case", ["key_deleted", "corrupt_checkpoints", "other_model", "asked"])
def test_allow_fresh_starts_a_new_node_and_moves_the_old_state_aside(tmp_path: Path, case: str) -> None:
    # Issue 23: with the key deleted, --allow-fresh made a new identity but resumed the old checkpoint (round
    # 98), replay state and 9 blacklisted peers; over corrupt checkpoints it started fresh but left the corrupt
    # files, so the next --resume refused again.
    from dgrpo.daemon.settings import load_node_settings

    state = tmp_path / "node"
    sets, old_peer, old = _node_with_state(state)
    (ckpt,) = old.checkpoints.checkpoints()
    resume = True
    if case == "key_deleted":
        old.settings.key_path.unlink()
    elif case == "corrupt_checkpoints":
        ckpt.write_bytes(b"corrupt")
    elif case == "other_model":
        sets = [*sets, "model.name='dgrpo:tiny-arith-llama'"]
    else:  # --allow-fresh without --resume: a fresh node was asked for
        resume = False
    before = sorted(p.name for p in state.iterdir())
    fresh = open_daemon(load_node_settings(None, sets), resume=resume, allow_fresh=True)
    assert fresh.peer_id != old_peer, "a new identity"
    assert (fresh.round, fresh.rounds_done) == (0, 0)
    assert fresh.restored_blacklist == [] and fresh.checkpoints.checkpoints() == []
    assert len(fresh.replay) == 0 and len(old.replay) == 1
    assert fresh.reputation is not None and fresh.reputation.snapshot() == {}
    (aside,) = [p for p in tmp_path.iterdir() if p.name.startswith("node.aside-")]
    assert sorted(p.name for p in aside.iterdir()) == before, "the old state, whole, beside the new one"
    assert (aside / "checkpoints" / ckpt.name).is_file() and (aside / "identity.key").exists() != (
        case == "key_deleted"
    )
    assert (state / "manifest.json").is_file(), "the run's manifest is kept: it names the run, not the node"
    # and the next --resume continues the new node, not the old one
    fresh.rounds_done, fresh.round = 1, 2
    fresh.save_checkpoint()
    again = open_daemon(load_node_settings(None, sets), resume=True)
    assert again.peer_id == fresh.peer_id and again.rounds_done == 1
