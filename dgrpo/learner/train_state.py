"""A learner's trainable state as bytes: what a node hands a peer that joins late (weights sync,
``docs/protocol.md``, "Weights sync"), and takes from its peers.

Two nodes that hold the same trainable parameters and the same optimizer state compute the same update from
the same completions; the weights alone are not enough (Adam's moments steer every later step). So the state
is the trainable parameters (the LoRA adapter, or the whole model when it is fine-tuned in full) and the
optimizer's per-parameter tensors. The optimizer's settings (learning rate, betas) are the run's, which the
receiver holds already, so they do not travel.

Encoding (deterministic, so equal states are equal bytes and hash alike):
``length (uint32 BE) || msgpack [v, [[name, dtype, [shape...]], ...]] || raw tensor bytes``, tensors in name
order (``param.<parameter name>``, ``optim.<index>.<key>``), little-endian, C order. Reading never unpickles:
the receiver checks every name, dtype and shape against its own model and optimizer before a byte is used.
"""

from __future__ import annotations

import sys
from typing import Any

import msgpack
import numpy as np
import torch

from dgrpo.errors import DgrpoError
from dgrpo.learner.learner import TORCH_LOCK, Learner
from dgrpo.protocol.wire import strict_unpack

VERSION = 1
LENGTH_BYTES = 4
MAX_ENTRIES = 1 << 16
MAX_LAYOUT_BYTES = 16 << 20
DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "float64": torch.float64,
    "int64": torch.int64,
}
NAMES = {dtype: name for name, dtype in DTYPES.items()}
# The per-parameter tensors each optimizer keeps (torch's Adam/AdamW without amsgrad, SGD with momentum).
OPTIMIZER_KEYS = {
    "adam": frozenset({"step", "exp_avg", "exp_avg_sq"}),
    "adamw": frozenset({"step", "exp_avg", "exp_avg_sq"}),
    "sgd": frozenset({"momentum_buffer"}),
}


class StateLayoutError(DgrpoError):
    """A received state does not fit this learner (another model, size or optimizer); the weights sync reason
    ``state_bad_layout``."""


def _trainable(learner: Learner) -> list[tuple[str, torch.nn.Parameter]]:
    return [(name, p) for name, p in learner.model.named_parameters() if p.requires_grad]


def _entries(learner: Learner) -> dict[str, torch.Tensor]:
    params = _trainable(learner)
    out = {f"param.{name}": p.detach() for name, p in params}
    state = learner.optimizer.state_dict()["state"]
    for index, values in state.items():
        for key, value in values.items():
            if isinstance(value, torch.Tensor):
                out[f"optim.{index}.{key}"] = value.detach()
    return out


def _bytes(tensor: torch.Tensor) -> bytes:
    flat = tensor.detach().cpu().contiguous().reshape(-1)
    raw = flat.view(torch.int16) if flat.dtype == torch.bfloat16 else flat  # numpy has no bfloat16
    data = raw.numpy()
    if sys.byteorder != "little":
        data = data.byteswap()
    return bytes(data.tobytes())


def export_state(learner: Learner) -> bytes:
    """The learner's trainable state as bytes (call between rounds: nothing may train meanwhile)."""
    with TORCH_LOCK:
        entries = sorted(_entries(learner).items())
        layout = [[name, NAMES[t.dtype], list(t.shape)] for name, t in entries]
        head: bytes = msgpack.packb([VERSION, layout], use_bin_type=True)
        return len(head).to_bytes(LENGTH_BYTES, "big") + head + b"".join(_bytes(t) for _, t in entries)


def _expected(learner: Learner, name: str) -> tuple[torch.dtype, tuple[int, ...]] | None:
    """The dtype and shape ``name`` must have in this learner, None where it has no such entry."""
    kind, _, rest = name.partition(".")
    params = dict(_trainable(learner))
    if kind == "param":
        p = params.get(rest)
        return None if p is None else (p.dtype, tuple(p.shape))
    index_text, _, key = rest.partition(".")
    if kind != "optim" or not index_text.isdigit() or key not in OPTIMIZER_KEYS.get(learner.cfg.optimizer, ()):
        return None
    index = int(index_text)
    ordered = [p for group in learner.optimizer.param_groups for p in group["params"]]
    if index >= len(ordered):
        return None
    if key == "step":  # Adam counts steps in a float32 scalar tensor
        return torch.float32, ()
    return ordered[index].dtype, tuple(ordered[index].shape)


def _tensor(data: bytes, dtype: torch.dtype, shape: tuple[int, ...]) -> torch.Tensor:
    raw_dtype = np.int16 if dtype == torch.bfloat16 else torch.empty(0, dtype=dtype).numpy().dtype
    array = np.frombuffer(data, dtype=np.dtype(raw_dtype).newbyteorder("<")).astype(raw_dtype)
    tensor = torch.from_numpy(array)
    return (tensor.view(torch.bfloat16) if dtype == torch.bfloat16 else tensor).reshape(shape)


def decode_state(learner: Learner, blob: bytes) -> dict[str, torch.Tensor]:
    """The tensors of ``blob``, each checked against this learner's layout; :class:`StateLayoutError` else."""
    try:
        length = int.from_bytes(blob[:LENGTH_BYTES], "big")
        if length > MAX_LAYOUT_BYTES or LENGTH_BYTES + length > len(blob):
            raise ValueError(f"a layout of {length} bytes")
        head = strict_unpack(blob[LENGTH_BYTES : LENGTH_BYTES + length], MAX_LAYOUT_BYTES, MAX_ENTRIES, 0)
        version, layout = head
        if version != VERSION:
            raise ValueError(f"version {version}")
    except Exception as exc:  # msgpack raises several types; all mean a malformed layout
        raise StateLayoutError(f"unreadable state layout: {type(exc).__name__}: {str(exc)[:200]}") from None
    tensors: dict[str, torch.Tensor] = {}
    offset = LENGTH_BYTES + length
    names = [entry[0] if isinstance(entry, tuple) and entry else None for entry in layout]
    if names != sorted(set(n for n in names if isinstance(n, str))):
        raise StateLayoutError("state entries must be named, distinct and in name order")
    for entry in layout:
        if not (isinstance(entry, tuple) and len(entry) == 3):
            raise StateLayoutError("a state entry is not [name, dtype, shape]")
        name, dtype_name, shape = entry
        expected = _expected(learner, name)
        if expected is None or DTYPES.get(dtype_name) != expected[0] or tuple(shape) != expected[1]:
            raise StateLayoutError(f"state entry {name!r} ({dtype_name} {list(shape)}) does not fit this model")
        dtype, dims = expected
        size = int(np.prod(dims, dtype=np.int64)) * torch.empty(0, dtype=dtype).element_size()
        if offset + size > len(blob):
            raise StateLayoutError(f"the state ends inside {name!r}")
        tensors[name] = _tensor(blob[offset : offset + size], dtype, dims)
        offset += size
    if offset != len(blob):
        raise StateLayoutError(f"{len(blob) - offset} bytes after the last state entry")
    params = {f"param.{name}" for name, _ in _trainable(learner)}
    if not params <= tensors.keys():
        missing = sorted(params - tensors.keys())
        raise StateLayoutError(f"the state lacks {len(missing)} trainable parameter(s), e.g. {missing[0]!r}")
    return tensors


def import_state(learner: Learner, blob: bytes) -> None:
    """Take ``blob``'s parameters and optimizer state (checked first: nothing changes on an error)."""
    tensors = decode_state(learner, blob)
    optimizer_state: dict[int, dict[str, Any]] = {}
    for name, tensor in tensors.items():
        kind, _, rest = name.partition(".")
        if kind == "optim":
            index_text, _, key = rest.partition(".")
            optimizer_state.setdefault(int(index_text), {})[key] = tensor
    with TORCH_LOCK, torch.no_grad():
        for name, p in _trainable(learner):
            p.copy_(tensors[f"param.{name}"].to(p.device))
        current = learner.optimizer.state_dict()
        learner.optimizer.load_state_dict({"state": optimizer_state, "param_groups": current["param_groups"]})
