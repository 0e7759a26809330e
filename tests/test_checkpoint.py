"""Checkpoints: atomic write, rotation, corruption detection and fallback, a learner's state round trip."""

from __future__ import annotations

from pathlib import Path

import torch

from dgrpo.config import LearnerConfig, ModelConfig
from dgrpo.daemon.checkpoint import CheckpointManager, CheckpointState
from dgrpo.learner.learner import Learner, TrainSample


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
    from dgrpo.daemon.daemon import Daemon
    from dgrpo.daemon.settings import load_node_settings

    sets = [f"state_dir={str(tmp_path)!r}", "defense.chain=['length']", "status.enabled=false"]
    first = Daemon(load_node_settings(None, sets))
    assert first.reputation is not None
    first.reputation.record(3, "peerA", 10, 9)
    assert first.reputation.update(3) == ["peerA"]
    first.reputation.record(3, "peerB", 10, 2)  # under the threshold, but its history counts later
    first.restored_blacklist = ["peerC"]  # blacklisted at the network layer for invalid messages
    first.rounds_done, first.round = 3, 4
    first.save_checkpoint()

    again = Daemon(load_node_settings(None, sets), resume=True)
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

    from dgrpo.daemon.daemon import Daemon
    from dgrpo.daemon.settings import load_node_settings
    from dgrpo.errors import ConfigError

    sets = [f"state_dir={str(tmp_path)!r}", "status.enabled=false"]
    first = Daemon(load_node_settings(None, sets))
    first.rounds_done, first.round = 2, 3
    first.save_checkpoint()
    (saved,) = first.checkpoints.checkpoints()
    peer_id = first.peer_id
    # A SIGKILL mid-write left a temp file: the next start removes it.
    orphan = saved.parent / f".{saved.name}.abcd1234.tmp"
    orphan.write_bytes(b"half a checkpoint")

    # Another model under the configuration: refused, naming both.
    other = [*sets, "model.name='dgrpo:tiny-arith-llama'"]
    with pytest.raises(ConfigError, match=r"holds model 'dgrpo:tiny-arith'.*'dgrpo:tiny-arith-llama'"):
        Daemon(load_node_settings(None, other), resume=True)
    assert not orphan.exists()
    fresh = Daemon(load_node_settings(None, other), resume=True, allow_fresh=True)
    assert (fresh.round, fresh.rounds_done) == (0, 0) and fresh.peer_id == peer_id  # fresh, same identity

    # Every checkpoint corrupt: refused, naming the files; --allow-fresh starts at round 1.
    saved.write_bytes(b"corrupt")
    with pytest.raises(ConfigError, match=rf"none of the checkpoints .* verifies \({saved.name}\)"):
        Daemon(load_node_settings(None, sets), resume=True)
    assert Daemon(load_node_settings(None, sets), resume=True, allow_fresh=True).rounds_done == 0

    # The identity key deleted while state remains: refused before a new key is made.
    key = load_node_settings(None, sets).key_path
    key.unlink()
    with pytest.raises(ConfigError, match=r"identity key .* is missing.*round-00000002\.ckpt"):
        Daemon(load_node_settings(None, sets), resume=True)
    assert not key.exists()
    assert Daemon(load_node_settings(None, sets), resume=True, allow_fresh=True).peer_id != peer_id
