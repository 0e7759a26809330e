"""The batched engine: a simulation's nodes hand their generation and updates to one pool, which runs them
together where that gives the same results as one by one (issue 27).

Every node still runs the daemon's round in its own worker thread; its learner's ``generate`` and
``train_step`` wait in the pool until every node still in the round has a call waiting (or has finished its
round), then the pool runs the waiting calls:

- **generation** of learners holding identical weights in one pass (:func:`dgrpo.learner.together.
  generate_together`: one decoding loop over all their rows, each request sampled from its own seed), since
  decoding a node's few rows is per-step overhead, not arithmetic;
- the defenses' **teacher-forced passes** that are the same computation (identical weights, the same
  completions) once, every learner asking getting the same read-only tensors;
- **updates** that are the same computation (identical weights and optimizer state, the same batch, learning
  rate and settings; every honest node of a homogeneous all-gather round) once, the others copying the
  result: weights, gradients and optimizer state, bit for bit what their own step would have computed.

Everything else runs alone, one call after another. Which learners hold identical state is tracked without
hashing every round: a learner's *state key* is a digest of its weights and optimizer state, carried forward
as ``hash(key, batch)`` by each update the pool runs (an update is a deterministic function of state and
batch), and recomputed from the tensors whenever one of them was changed outside the pool (torch counts
in-place changes in ``Tensor._version``; a simulation changes weights only through torch ops, never through
``.data``, which torch does not count).
"""

from __future__ import annotations

import hashlib
import threading
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from dgrpo.learner.batch import ForcedLogits, ForcedSamples, GenerateRequest, Sampled, StepStats, TrainSample
from dgrpo.learner.learner import TORCH_LOCK, Learner
from dgrpo.learner.together import fits_one_pass, generate_together, together_key


@dataclass
class _Call:
    learner: Learner
    kind: str  # "generate", "logits" or "train"
    request: GenerateRequest | None = None
    train: tuple[Sequence[TrainSample], float, int] | None = None
    forced: ForcedSamples | None = None
    done: bool = False
    result: Any = None
    error: BaseException | None = None


@dataclass
class PoolStats:
    """What the pool ran: calls handed to it, and how many of them ran alone, in a shared pass or as a copy."""

    generate_calls: int = 0
    generate_passes: int = 0  # one per group decoded together or call run alone
    logits_calls: int = 0
    logits_passes: int = 0  # the defenses' teacher-forced passes computed; the rest shared one
    train_calls: int = 0
    train_steps: int = 0  # updates computed; the rest were copies
    flushes: int = 0

    def as_dict(self) -> dict[str, Any]:
        return {
            "generate_calls": self.generate_calls,
            "generate_passes": self.generate_passes,
            "logits_calls": self.logits_calls,
            "logits_passes": self.logits_passes,
            "train_calls": self.train_calls,
            "train_steps": self.train_steps,
            "flushes": self.flushes,
        }


class LearnerPool:
    """The rendezvous of the nodes' learners (see the module docstring). The runner brackets each node's round
    with :meth:`enter` / :meth:`leave`; calls made outside a round (evaluation between rounds) run at once."""

    def __init__(self, learners: Iterable[Learner]) -> None:
        self.learners = list(learners)
        self.stats = PoolStats()
        self._cv = threading.Condition()
        self._in_round: set[int] = set()
        self._pending: list[_Call] = []
        self._busy = False
        self._keys: dict[int, tuple[bytes, tuple[int, ...]]] = {}  # id(learner) -> (state key, versions then)
        for learner in self.learners:
            learner.batcher = self
            learner.keep_digest = True  # the pool's own bookkeeping rests on torch's version counters too

    def __getstate__(self) -> dict[str, Any]:
        """Snapshots are taken between rounds (:mod:`dgrpo.simulations.snapshot`): nobody is in a round and
        nothing waits. The state keys are indexed by ``id(learner)``, which a loaded learner does not keep, so
        they are dropped and recomputed from the tensors when first asked."""
        state = dict(self.__dict__)
        state.update(_in_round=set(), _pending=[], _busy=False, _keys={})
        del state["_cv"]
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._cv = threading.Condition()

    # ------------------------------------------------------------------ the rendezvous
    def enter(self, learner: Learner) -> None:
        with self._cv:
            self._in_round.add(id(learner))

    def leave(self, learner: Learner) -> None:
        with self._cv:
            self._in_round.discard(id(learner))
            self._cv.notify_all()

    def generate(self, learner: Learner, request: GenerateRequest) -> list[list[Sampled]]:
        result: list[list[Sampled]] = self._submit(_Call(learner, "generate", request=request))
        return result

    def train_step(
        self, learner: Learner, samples: Sequence[TrainSample], temperature: float, max_new_tokens: int
    ) -> StepStats:
        result: StepStats = self._submit(_Call(learner, "train", train=(samples, temperature, max_new_tokens)))
        return result

    def forced_logits(self, learner: Learner, samples: ForcedSamples) -> ForcedLogits:
        result: ForcedLogits = self._submit(_Call(learner, "logits", forced=samples))
        return result

    def _submit(self, call: _Call) -> Any:
        with self._cv:
            if id(call.learner) not in self._in_round:
                batch = [call]  # between rounds: nobody to wait for
                self._busy_wait()
            else:
                self._pending.append(call)
                self._cv.notify_all()
                while True:
                    if call.done:
                        return self._result(call)
                    waiting = {id(c.learner) for c in self._pending}
                    if not self._busy and self._in_round <= waiting:
                        batch, self._pending = self._pending, []
                        break
                    self._cv.wait()
            self._busy = True
        try:
            self._run(batch)
        finally:
            with self._cv:
                self._busy = False
                self._cv.notify_all()
        return self._result(call)

    def _busy_wait(self) -> None:
        while self._busy:
            self._cv.wait()

    @staticmethod
    def _result(call: _Call) -> Any:
        if call.error is not None:
            raise call.error
        return call.result

    # ------------------------------------------------------------------ running a batch of calls
    def _run(self, batch: list[_Call]) -> None:
        self.stats.flushes += 1
        for kind, run in (("generate", self._generate), ("logits", self._logits), ("train", self._train)):
            self._guard(run, [c for c in batch if c.kind == kind])

    @staticmethod
    def _guard(fn: Callable[[list[_Call]], None], calls: list[_Call]) -> None:
        if not calls:
            return
        try:
            fn(calls)
        except BaseException as exc:  # every waiting caller gets the error, none waits forever
            for c in calls:
                if not c.done:
                    c.error, c.done = exc, True
            if not isinstance(exc, Exception):
                raise

    def _generate(self, calls: list[_Call]) -> None:
        self.stats.generate_calls += len(calls)
        groups: dict[tuple[object, ...], list[_Call]] = defaultdict(list)
        alone: list[_Call] = []
        for c in calls:
            assert c.request is not None
            if fits_one_pass(c.request):
                groups[(self.state_key(c.learner), c.learner.model_cfg.name, together_key(c.request))].append(c)
            else:
                alone.append(c)
        for group in groups.values():
            if len(group) == 1:
                alone.extend(group)
                continue
            self.stats.generate_passes += 1
            outs = generate_together(group[0].learner, [c.request for c in group if c.request is not None])
            for c, out in zip(group, outs, strict=True):
                c.result, c.done = out, True
        for c in alone:
            assert c.request is not None
            self.stats.generate_passes += 1
            c.result, c.done = c.learner.generate_here(c.request), True

    def _logits(self, calls: list[_Call]) -> None:
        """The defenses' teacher-forced passes: one per distinct (weights, samples); every learner asking for
        the same pass with the same weights gets the same (read-only) tensors."""
        self.stats.logits_calls += len(calls)
        groups: dict[tuple[bytes, ForcedSamples], list[_Call]] = defaultdict(list)
        for c in calls:
            assert c.forced is not None
            groups[(self.state_key(c.learner), c.forced)].append(c)
        for (_, samples), group in groups.items():
            self.stats.logits_passes += 1
            result = group[0].learner.forced_logits_here(samples)
            for c in group:
                c.result, c.done = result, True

    def _train(self, calls: list[_Call]) -> None:
        self.stats.train_calls += len(calls)
        groups: dict[tuple[bytes, bytes], list[_Call]] = defaultdict(list)
        for c in calls:
            groups[(self.state_key(c.learner), _batch_digest(c))].append(c)
        for (state, batch), group in groups.items():
            leader = group[0]
            assert leader.train is not None
            self.stats.train_steps += 1
            try:
                stats = leader.learner.train_step_here(*leader.train)
            finally:
                # Whatever happened, the leader's state followed from (state, batch) or is unknown.
                self._keys.pop(id(leader.learner), None)
            after = hashlib.sha256(state + batch).digest()
            self._remember(leader.learner, after)
            leader.result, leader.done = stats, True
            for c in group[1:]:
                _copy_state(leader.learner, c.learner)
                c.learner.share_digest(leader.learner)
                self._remember(c.learner, after)
                c.result, c.done = stats, True

    # ------------------------------------------------------------------ state keys
    def state_key(self, learner: Learner) -> bytes:
        """A digest of ``learner``'s weights and optimizer state (equal keys: identical state)."""
        known = self._keys.get(id(learner))
        if known is not None and known[1] == _versions(learner):
            return known[0]
        key = _state_digest(learner)
        self._remember(learner, key)
        return key

    def _remember(self, learner: Learner, key: bytes) -> None:
        self._keys[id(learner)] = (key, _versions(learner))


def _tensors(learner: Learner) -> list[torch.Tensor]:
    """Every tensor an update changes: parameters and optimizer state, in a fixed order."""
    out: list[torch.Tensor] = list(learner.model.parameters())
    for p in learner.model.parameters():
        for _, v in sorted(learner.optimizer.state.get(p, {}).items()):
            if isinstance(v, torch.Tensor):
                out.append(v)
    return out


def _versions(learner: Learner) -> tuple[int, ...]:
    return tuple(t._version for t in _tensors(learner))


def _state_digest(learner: Learner) -> bytes:
    h = hashlib.sha256(learner.model_cfg.model_dump_json().encode())
    with TORCH_LOCK:
        h.update(learner.weights_digest().encode())
        for p in learner.model.parameters():
            for name, v in sorted(learner.optimizer.state.get(p, {}).items()):
                h.update(str(name).encode())
                if isinstance(v, torch.Tensor):
                    h.update(v.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
                else:
                    h.update(repr(v).encode())
        for group in learner.optimizer.param_groups:
            h.update(repr(sorted((k, v) for k, v in group.items() if k != "params")).encode())
    return h.digest()


def _batch_digest(call: _Call) -> bytes:
    """What, besides the state, an update is a function of: the batch, the temperature, the length bound, the
    learning rate and the learner's settings (``updates_per_round`` among them: a learner's several updates on one
    batch are still one deterministic function of state and batch, copied whole)."""
    assert call.train is not None
    samples, temperature, max_new = call.train
    learner = call.learner
    h = hashlib.sha256(learner.cfg.model_dump_json().encode())
    h.update(repr((temperature, max_new, [g["lr"] for g in learner.optimizer.param_groups])).encode())
    for s in samples:
        h.update(repr((s.prompt_ids, s.completion_ids, s.advantage)).encode())
    return h.digest()


def _copy_state(source: Learner, target: Learner) -> None:
    """``target`` takes ``source``'s weights, gradients and optimizer state (same architecture)."""
    with TORCH_LOCK, torch.no_grad():
        for ps, pt in zip(source.model.parameters(), target.model.parameters(), strict=True):
            pt.copy_(ps)
            pt.grad = None if ps.grad is None else ps.grad.detach().clone()
            state = source.optimizer.state.get(ps)
            if state is None:
                target.optimizer.state.pop(pt, None)
                continue
            target.optimizer.state[pt] = {
                k: v.detach().clone() if isinstance(v, torch.Tensor) else v for k, v in state.items()
            }
        for gs, gt in zip(source.optimizer.param_groups, target.optimizer.param_groups, strict=True):
            for k, v in gs.items():
                if k != "params":
                    gt[k] = v
