"""A simulation's whole state between two rounds, as one file: what ``dgrpo simulate --resume`` continues from.

Everything a round reads or changes is in it: every node's model, optimizer and schedule, its admission and
draw state, its defenses' and its adversary's memory, the network's signers and replay windows, the
evaluator's, the defense meter's and the round rows' tallies, and the process's random number generators
(Python's, NumPy's and torch's). It is taken with cloudpickle's pickler over the live objects, so that a
state added to any part later is covered without a list to keep up to date; what cannot be pickled is a
process resource, rebuilt fresh on load (:class:`_Pickler`): locks and conditions, trio events, memoization
caches (``functools.lru_cache``, whose contents are a function of their arguments), objects that are a
module's globals (a registry, a library's context variable: the module's own, by name, on load), and the
nodes' Ed25519 keys (as their raw bytes: a simulated node's key is derived from the run id and its name).
Classes holding other resources say so themselves (``__getstate__``: the in-memory transport's channels,
the batched engine's rendezvous, the federated aggregator's merge function).

Where this is not the right tool: the file is only for the same dgrpo version on the same machine (a pickle
names classes by module path); it holds every node's full model, which for real models is large
(``checkpoint_every`` spaces it out); and it is trusted input (a pickle can run code when loaded), so
``--resume`` only reads the run folder the user names, written by this program.
"""

from __future__ import annotations

import _thread
import functools
import importlib
import io
import pickle
import random
import sys
import threading
import types
import warnings
from pathlib import Path
from typing import IO, Any

import cloudpickle
import numpy as np
import torch
import trio
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from dgrpo.atomic import write_atomically

_LOCK_TYPES: tuple[type, ...] = (type(threading.Lock()), type(threading.RLock()), _thread.LockType)
_LRU_TYPE = type(functools.lru_cache(maxsize=1)(lambda: None))


def _new_lock(reentrant: bool) -> Any:
    return threading.RLock() if reentrant else threading.Lock()


def _private_key(raw: bytes) -> Ed25519PrivateKey:
    return Ed25519PrivateKey.from_private_bytes(raw)


def _public_key(raw: bytes) -> Ed25519PublicKey:
    return Ed25519PublicKey.from_public_bytes(raw)


def _module_global(module: str, name: str) -> Any:
    return getattr(importlib.import_module(module), name)


def _module_globals() -> dict[int, tuple[str, str]]:
    """Every object that is a module's global, by id: the module and the name it goes by."""
    index: dict[int, tuple[str, str]] = {}
    plain = (type, types.ModuleType, types.FunctionType, types.BuiltinFunctionType)  # pickled by name anyway
    with warnings.catch_warnings():  # some libraries' deprecated globals warn when their type is asked
        warnings.simplefilter("ignore")
        for module_name, module in list(sys.modules.items()):
            if module_name == "__main__":
                continue
            for name, value in list(getattr(module, "__dict__", {}).items()):
                if not isinstance(value, plain):
                    index.setdefault(id(value), (module_name, name))
    return index


def _new_lru(function: Any, maxsize: int | None, typed: bool) -> Any:
    return functools.lru_cache(maxsize=maxsize, typed=typed)(function)


class _Pickler(cloudpickle.Pickler):  # type: ignore[misc]
    """Process resources become fresh ones on load (see the module docstring); the rest as cloudpickle
    pickles it, local functions and closures included (transformers' output-capturing forward hooks, the
    aggregators' merge functions), which the standard pickler refuses."""

    def __init__(self, file: IO[bytes], protocol: int) -> None:
        super().__init__(file, protocol=protocol)
        self.globals = _module_globals()

    def reducer_override(self, obj: Any) -> Any:
        if isinstance(obj, _LOCK_TYPES):
            return _new_lock, (isinstance(obj, type(threading.RLock())),)
        if isinstance(obj, trio.Event):
            return trio.Event, ()
        found = self.globals.get(id(obj))
        if found is not None and type(obj).__module__ != "builtins":
            # A module's own object (a registry, a library's context variable that a closure pickled by value
            # reads: transformers' output-capturing hooks): the same object on load, not a copy.
            return _module_global, found
        if isinstance(obj, _LRU_TYPE):
            params = obj.cache_parameters()
            return _new_lru, (obj.__wrapped__, params["maxsize"], params["typed"])
        if isinstance(obj, Ed25519PrivateKey):  # a simulated node's identity (derived from the run: not secret)
            raw = obj.private_bytes(
                serialization.Encoding.Raw, serialization.PrivateFormat.Raw, serialization.NoEncryption()
            )
            return _private_key, (raw,)
        if isinstance(obj, Ed25519PublicKey):
            return _public_key, (obj.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw),)
        return super().reducer_override(obj)


def rng_state() -> dict[str, Any]:
    return {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])


def dumps(obj: Any) -> bytes:
    buf = io.BytesIO()
    _Pickler(buf, protocol=pickle.HIGHEST_PROTOCOL).dump({"state": obj, "rng": rng_state()})
    return buf.getvalue()


def loads(data: bytes) -> Any:
    loaded = pickle.loads(data)  # trusted: see the module docstring
    set_rng_state(loaded["rng"])
    return loaded["state"]


def save(path: Path, obj: Any) -> int:
    """Write ``obj`` (and the RNG state) to ``path`` atomically; returns the bytes written."""
    data = dumps(obj)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomically(path, data, mode=0o644)
    return len(data)


def load(path: Path) -> Any:
    """The object saved at ``path``; the process's RNGs are set to what they were when it was saved."""
    return loads(path.read_bytes())
