"""Loading causal LMs: an embedded model (``dgrpo:tiny-arith``), a local folder, or a hub id.

Model hubs are not reachable on every machine, so the default is a model the project builds and ships
(``scripts/build_tiny_model.py``); real models load from a local folder (optionally a GGUF file in it) or,
where the network allows, from the hub.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerBase
from transformers.utils import logging as hf_logging

from dgrpo.config import ModelConfig
from dgrpo.errors import ModelNotFoundError, UnknownNameError

ASSETS = Path(__file__).resolve().parent.parent / "assets"
EMBEDDED_PREFIX = "dgrpo:"
HUB_PROBE_SECONDS = 5.0  # a hub that has not answered by then is treated as unreachable


def embedded_models() -> dict[str, Path]:
    """Names of the models shipped inside the package, e.g. ``dgrpo:tiny-arith``."""
    if not ASSETS.is_dir():
        return {}
    return {f"{EMBEDDED_PREFIX}{p.name}": p for p in sorted(ASSETS.iterdir()) if (p / "config.json").is_file()}


def _looks_like_path(name: str) -> bool:
    return name.startswith(("/", "./", "../", "~")) or name.count("/") > 1 or "\\" in name


def resolve_model(name: str) -> str:
    """The folder or hub id to load ``name`` from; unknown embedded names and missing paths are errors."""
    if name == "pypi:SmolLM2-135M-Instruct":
        from dgrpo.learner.smollm2 import smollm2_folder

        return str(smollm2_folder())
    if name == "pypi:gemma-3-270m":
        from dgrpo.learner.gemma3 import gemma3_folder

        return str(gemma3_folder())
    if name.startswith(EMBEDDED_PREFIX):
        known = embedded_models()
        if name not in known:
            raise UnknownNameError("embedded model", name, known)
        return str(known[name])
    path = Path(name).expanduser()
    if path.exists():
        if not path.is_dir():
            raise ModelNotFoundError(f"model path {name!r} is a file; give the folder that holds config.json")
        if not (path / "config.json").is_file():
            raise ModelNotFoundError(f"model folder {name!r} has no config.json")
        return str(path)
    if _looks_like_path(name):
        raise ModelNotFoundError(f"model path {name!r} does not exist")
    return name  # a hub id such as Qwen/Qwen2.5-1.5B


def hub_access(name: str, repo_id: str, timeout: float = HUB_PROBE_SECONDS) -> dict[str, Any]:
    """How to load hub id ``repo_id``: ``{}`` (from the hub, as usual) where the hub answers; from the local cache
    only (``local_files_only``) where it does not but the model is cached; else :class:`ModelNotFoundError`, at
    once. Without this an unreachable hub cost some 50 s and 48 lines of retry warnings before the error."""
    from huggingface_hub import constants, try_to_load_from_cache

    cached = isinstance(try_to_load_from_cache(repo_id, "config.json", cache_dir=constants.HF_HUB_CACHE), str)
    why = "HF_HUB_OFFLINE is set" if constants.HF_HUB_OFFLINE else hub_unreachable(constants.ENDPOINT, timeout)
    if why is None:
        return {}
    if cached:
        return {"local_files_only": True}
    raise ModelNotFoundError(
        f"model {name!r}: the hub ({constants.ENDPOINT}) cannot be reached ({why}) and the model is not in the "
        f"local cache ({constants.HF_HUB_CACHE}); give a local folder or an embedded name "
        f"({', '.join(embedded_models())})"
    )


def hub_unreachable(endpoint: str, timeout: float) -> str | None:
    """Why ``endpoint`` does not answer (one try, no retries), None where it answers (any HTTP status)."""
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(urllib.request.Request(endpoint, method="HEAD"), timeout=timeout):
            return None
    except urllib.error.HTTPError:  # an answer, if not a welcome one: the hub is there
        return None
    except (OSError, ValueError) as exc:  # URLError, a timeout, a refused connection, a malformed endpoint
        reason = getattr(exc, "reason", None) or exc
        return " ".join(str(reason).split()) or type(exc).__name__


def pick_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def pick_dtype(dtype: str, device: torch.device) -> torch.dtype:
    if dtype == "auto":
        # bf16 matmuls are two orders of magnitude slower than fp32 on these CPUs (shared notes).
        if device.type == "cuda" and torch.cuda.is_bf16_supported():
            return torch.bfloat16
        return torch.float32
    dtypes: dict[str, torch.dtype] = {
        "float32": torch.float32,
        "bfloat16": torch.bfloat16,
        "float16": torch.float16,
    }
    return dtypes[dtype]


@dataclass
class LoadedModel:
    model: Any  # a PreTrainedModel, or a peft PeftModel wrapping one
    tokenizer: PreTrainedTokenizerBase
    device: torch.device
    source: str


def load_model(cfg: ModelConfig) -> LoadedModel:
    """Load model and tokenizer for ``cfg`` onto its device; LoRA adapters are added when configured."""
    source = resolve_model(cfg.name)
    hf_logging.disable_progress_bar()  # a per-node "Loading weights" bar drowns the round log
    device = pick_device(cfg.device)
    dtype = pick_dtype(cfg.dtype, device)
    kwargs: dict[str, Any] = {}
    if cfg.gguf_file:
        kwargs["gguf_file"] = cfg.gguf_file
    if not Path(source).is_dir():
        kwargs.update(hub_access(cfg.name, source))
    try:
        tokenizer = AutoTokenizer.from_pretrained(source, **kwargs)
        model: Any = AutoModelForCausalLM.from_pretrained(source, dtype=dtype, **kwargs)
    except (OSError, ValueError) as exc:
        raise ModelNotFoundError(
            f"could not load model {cfg.name!r} from {source!r}: {' '.join(str(exc).split())}. "
            "Hub ids need network access; offline, give a local folder or an embedded name "
            f"({', '.join(embedded_models())})."
        ) from exc
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    model.to(device)
    if cfg.lora is not None:
        from peft import LoraConfig as PeftLoraConfig
        from peft import get_peft_model

        targets: Any = cfg.lora.target_modules
        if targets == ["all-linear"]:
            targets = "all-linear"
        peft_cfg = PeftLoraConfig(
            r=cfg.lora.r, lora_alpha=cfg.lora.alpha, lora_dropout=cfg.lora.dropout, target_modules=targets
        )
        model = get_peft_model(model, peft_cfg)
    return LoadedModel(model=model, tokenizer=tokenizer, device=device, source=source)
