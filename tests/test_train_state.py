"""A learner's trainable state as bytes (weights sync): round trip, equal next steps, layouts refused."""

from __future__ import annotations

from pathlib import Path

import pytest

from dgrpo.config import LearnerConfig, ModelConfig
from dgrpo.learner.batch import TrainSample
from dgrpo.learner.learner import Learner
from dgrpo.learner.train_state import StateLayoutError, decode_state, export_state, import_state

BATCH = [TrainSample((5,), (6, 2), 1.0), TrainSample((5,), (7, 2), -1.0)]


def learner(model_dir: Path, **cfg: object) -> Learner:
    return Learner(ModelConfig(name=str(model_dir)), LearnerConfig(lr=1e-2, **cfg))  # type: ignore[arg-type]


@pytest.mark.parametrize("optimizer", ["adam", "sgd"])
def test_state_round_trip_gives_the_same_next_step(random_model_dir: Path, optimizer: str) -> None:
    a, b = learner(random_model_dir, optimizer=optimizer), learner(random_model_dir, optimizer=optimizer)
    for _ in range(2):
        a.train_step(BATCH, 1.0, 4)
    blob = export_state(a)
    assert export_state(a) == blob  # deterministic: equal states are equal bytes
    assert a.weights_digest() != b.weights_digest()
    import_state(b, blob)
    assert a.weights_digest() == b.weights_digest() and export_state(b) == blob
    a.train_step(BATCH, 1.0, 4)  # Adam's moments travelled: the next step is the same step
    b.train_step(BATCH, 1.0, 4)
    assert a.weights_digest() == b.weights_digest()


def test_weights_without_the_optimizer_state_would_diverge(random_model_dir: Path) -> None:
    """Why the optimizer state travels: the same weights with fresh Adam moments take another step."""
    a, b = learner(random_model_dir), learner(random_model_dir)
    for _ in range(2):
        a.train_step(BATCH, 1.0, 4)
    b.model.load_state_dict(a.model.state_dict())
    assert a.weights_digest() == b.weights_digest()
    a.train_step(BATCH, 1.0, 4)
    b.train_step(BATCH, 1.0, 4)
    assert a.weights_digest() != b.weights_digest()


def test_a_state_that_does_not_fit_is_refused_and_changes_nothing(random_model_dir: Path) -> None:
    a, b = learner(random_model_dir), learner(random_model_dir)
    a.train_step(BATCH, 1.0, 4)
    blob = export_state(a)
    before = b.weights_digest()
    head = int.from_bytes(blob[:4], "big")
    for bad in (b"", b"\x00\x00\x00\x05abc", blob[:-4], blob + b"\x00", blob[: 4 + head] + blob[5 + head :]):
        with pytest.raises(StateLayoutError):
            import_state(b, bad)
    sgd = learner(random_model_dir, optimizer="sgd", momentum=0.9)
    sgd.train_step(BATCH, 1.0, 4)
    with pytest.raises(StateLayoutError, match="does not fit"):
        import_state(b, export_state(sgd))  # an SGD momentum buffer is no Adam state
    assert b.weights_digest() == before


def test_a_fresh_optimizer_state_decodes(random_model_dir: Path) -> None:
    a = learner(random_model_dir)
    names = decode_state(a, export_state(a))
    assert names and all(n.startswith("param.") for n in names)


def test_a_lora_state_is_the_adapter_and_its_optimizer_state(random_model_dir: Path) -> None:
    from dgrpo.config import LoraConfig

    def lora() -> Learner:
        cfg = ModelConfig(name=str(random_model_dir), lora=LoraConfig(r=4, alpha=8))
        return Learner(cfg, LearnerConfig(lr=1e-2))

    a, b = lora(), lora()
    for _ in range(2):
        a.train_step(BATCH, 1.0, 4)
    blob = export_state(a)
    params = [n for n in decode_state(b, blob) if n.startswith("param.")]
    assert params and all("lora" in n for n in params)  # the adapter only: the base weights never travel
    assert len(blob) < len(export_state(learner(random_model_dir)))  # smaller than the whole model
    import_state(b, blob)
    a.train_step(BATCH, 1.0, 4)
    b.train_step(BATCH, 1.0, 4)
    assert a.weights_digest() == b.weights_digest()
