"""The GRPO learner: sampling, log-probabilities and the policy update of one node's model.

Completions travel between nodes as strings (paper, sec. 3), so the learner re-tokenises every completion it
trains on, its own included: nodes holding the same weights then compute exactly the same update from the
same strings (the homogeneous setting). A completion shorter than ``max_new_tokens`` tokens stopped at
end-of-sequence, so EOS is appended to it for training; a longer one was truncated and gets none.
"""

from __future__ import annotations

import hashlib
import inspect
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any, Protocol

import torch
from transformers import GenerationConfig, LogitsProcessorList

from dgrpo.config import LearnerConfig, ModelConfig
from dgrpo.errors import DgrpoError
from dgrpo.learner.batch import (
    ForcedLogits,
    ForcedSamples,
    GenerateRequest,
    Sampled,
    StepStats,
    TrainSample,
)
from dgrpo.learner.grpo import per_token_loss, reduce_loss, token_logprobs
from dgrpo.learner.models import LoadedModel, load_model
from dgrpo.learner.sampler import SeededGumbelProcessor
from dgrpo.learner.schedule import round_lr
from dgrpo.learner.tokens import FolderTokenizer, canonical, text_ids
from dgrpo.protocol.messages import SamplingParams

# Generation seeds torch's global RNG; several learners in one process (a simulation) must not interleave
# seeding and sampling, or runs stop being reproducible. Training takes the lock too: torch work from
# several threads would only contend for the same cores.
TORCH_LOCK = threading.RLock()


def cache_argument(model: Any) -> str:
    """The name of the KV-cache argument and output field (transformers 5 renamed past_key_values to cache),
    read from the underlying transformers model (a peft model passes it through as a keyword)."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return "cache" if "cache" in inspect.signature(base.forward).parameters else "past_key_values"


class Batcher(Protocol):
    """Where a simulation runs several learners' generation and updates together (the batched engine,
    :mod:`dgrpo.simulations.pool`); a learner with one hands it its calls, with the same results."""

    def generate(self, learner: Learner, request: GenerateRequest) -> list[list[Sampled]]: ...

    def train_step(
        self, learner: Learner, samples: Sequence[TrainSample], temperature: float, max_new_tokens: int
    ) -> StepStats: ...

    def forced_logits(self, learner: Learner, samples: ForcedSamples) -> ForcedLogits: ...


def _clean_generation_config(model: Any, tokenizer: Any) -> GenerationConfig:
    """A generation config with only the stopping ids kept: sampling is exactly what the caller asks for.

    Model folders ship sampling defaults (repetition penalty, top-k, ...) that transformers would merge into
    our explicit parameters; a peer checking our claimed sampling parameters must not be misled by them.
    """
    old = getattr(model, "generation_config", None)
    eos = getattr(old, "eos_token_id", None) if old is not None else None
    return GenerationConfig(
        eos_token_id=eos if eos is not None else tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
    )


class Learner:
    """One node's model, tokenizer and optimizer."""

    def __init__(self, model_cfg: ModelConfig, learner_cfg: LearnerConfig, rounds: int | None = None) -> None:
        """``rounds``: how many rounds the run lasts, which a cosine ``lr_schedule`` spans unless
        ``learner.lr_rounds`` says otherwise."""
        self.model_cfg = model_cfg
        self.cfg = learner_cfg
        self.lr_horizon = learner_cfg.lr_rounds or rounds
        if learner_cfg.lr_schedule != "constant" and self.lr_horizon is None:
            raise ValueError(
                f"learner.lr_schedule = {learner_cfg.lr_schedule!r} needs the rounds it spans: set "
                "learner.lr_rounds, or run a fixed number of rounds (rounds.max_rounds)"
            )
        with TORCH_LOCK:
            torch.manual_seed(learner_cfg.seed)  # LoRA initialisation
            self.loaded: LoadedModel = load_model(model_cfg)
        self.model = self.loaded.model
        self.tokenizer = self.loaded.tokenizer
        self.device = self.loaded.device
        self.model.generation_config = _clean_generation_config(self.model, self.tokenizer)
        eos = self.model.generation_config.eos_token_id
        self.eos_ids: tuple[int, ...] = tuple(eos) if isinstance(eos, list) else (int(eos),)
        self.pad_id = int(self.tokenizer.pad_token_id)
        self._tok = FolderTokenizer((str(self.loaded.source), model_cfg.gguf_file), self.tokenizer)
        # (tensors' versions, digest): kept only where every change of the weights is an in-place torch op that
        # torch counts (a simulation's pool sets this); a write through ``.data`` is not counted.
        self.keep_digest = False
        self._digest: tuple[tuple[tuple[int, int], ...], str] | None = None
        params = [p for p in self.model.parameters() if p.requires_grad]
        optimizers: dict[str, Callable[..., torch.optim.Optimizer]] = {
            "adam": torch.optim.Adam,
            "adamw": torch.optim.AdamW,
            "sgd": torch.optim.SGD,
        }
        extra = {"momentum": learner_cfg.momentum} if learner_cfg.optimizer == "sgd" else {}
        self.optimizer = optimizers[learner_cfg.optimizer](
            params, lr=learner_cfg.lr, weight_decay=learner_cfg.weight_decay, **extra
        )
        self.model_id = model_cfg.name
        self.batcher: Batcher | None = None  # a simulation's batched engine, which calls the *_here methods

    def begin_round(self, round_idx: int) -> float:
        """Set the optimizer's learning rate for round ``round_idx`` (``learner.lr_schedule``); returns it."""
        cfg = self.cfg
        lr = round_lr(cfg.lr, cfg.lr_schedule, cfg.lr_final, round_idx, self.lr_horizon)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        return lr

    # ----------------------------------------------------------------- tokenisation
    def encode_prompt(self, text: str) -> tuple[int, ...]:
        if self.model_cfg.chat_template and getattr(self.tokenizer, "chat_template", None):
            ids: Any = self.tokenizer.apply_chat_template(
                [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=True
            )
            if hasattr(ids, "keys"):
                ids = ids["input_ids"]
            return tuple(int(i) for i in ids)
        return tuple(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def encode_completion(self, text: str, max_new_tokens: int) -> tuple[int, ...]:
        """Token ids to train on for a completion string (see module docstring for the EOS rule)."""
        ids = list(text_ids(self._tok, text))[:max_new_tokens]
        if len(ids) < max_new_tokens:
            ids.append(self.eos_ids[0])
        return tuple(ids)

    def canonical_text(self, text: str) -> str:
        """``decode(encode(text))``, decoded as generated completions are. A completion that differs from
        it holds characters the tokenizer drops or rewrites: the learner and the model checks would see
        other text than the reward reads (``non_canonical``, ``docs/protocol.md``)."""
        return canonical(self._tok, text)

    def sampled(self, ids: Sequence[int]) -> Sampled:
        """A generated row's (text, token ids up to its first end-of-sequence)."""
        kept = []
        for i in ids:
            if i in self.eos_ids:
                break
            kept.append(int(i))
        return str(self.tokenizer.decode(kept, skip_special_tokens=True)), tuple(kept)

    @contextmanager
    def inference(self) -> Iterator[None]:
        """The model to itself (``TORCH_LOCK``), without gradients and in eval mode, restored on the way out:
        for generation and for the defenses' forward passes between training steps."""
        with TORCH_LOCK, torch.no_grad():
            was_training = self.model.training
            self.model.eval()
            try:
                yield
            finally:
                self.model.train(was_training)

    # ----------------------------------------------------------------- sampling
    def generate(
        self,
        prompts: Sequence[str],
        n: int,
        sampling: SamplingParams,
        greedy: bool = False,
        batch_rows: int = 64,
        seeds: Sequence[Sequence[int]] | None = None,
    ) -> list[list[str]]:
        """``n`` completions for each prompt, sampled with exactly ``sampling`` (seeded).

        With ``seeds`` (``n`` per prompt) every completion is drawn by the seeded sampler
        (:mod:`dgrpo.learner.sampler`) from its own seed, so that a peer holding the same weights can check it;
        otherwise by transformers' multinomial sampling from ``sampling.seed``.
        """
        return [[text for text, _ in per] for per in self.sample(prompts, n, sampling, greedy, batch_rows, seeds)]

    def sample(
        self,
        prompts: Sequence[str],
        n: int,
        sampling: SamplingParams,
        greedy: bool = False,
        batch_rows: int = 64,
        seeds: Sequence[Sequence[int]] | None = None,
    ) -> list[list[Sampled]]:
        """:meth:`generate`, each completion with the token ids it was sampled as (up to its end-of-sequence)."""
        if seeds is not None and (len(seeds) != len(prompts) or any(len(s) != n for s in seeds)):
            raise ValueError("seeds: expected n seeds for each prompt")
        request = GenerateRequest(
            tuple(prompts), n, sampling, greedy, batch_rows, None if seeds is None else tuple(map(tuple, seeds))
        )
        if self.batcher is not None:
            return self.batcher.generate(self, request)
        return self.generate_here(request)

    def generation_config(self, request: GenerateRequest) -> GenerationConfig:
        """transformers' configuration for ``request`` (sampling exactly as asked, nothing from the model folder)."""
        greedy, sampling = request.greedy, request.sampling
        return GenerationConfig(
            do_sample=not greedy,
            temperature=None if greedy else sampling.temperature,
            top_k=None if greedy or sampling.top_k == 0 else sampling.top_k,
            top_p=None if greedy or sampling.top_p >= 1.0 else sampling.top_p,
            max_new_tokens=sampling.max_new_tokens,
            eos_token_id=list(self.eos_ids),
            pad_token_id=self.pad_id,
        )

    @torch.no_grad()
    def generate_here(self, request: GenerateRequest) -> list[list[Sampled]]:
        """:meth:`generate` on this learner alone."""
        sampling, greedy, seeds = request.sampling, request.greedy, request.seeds
        encoded = [self.encode_prompt(p) for p in request.prompts]
        rows = [
            (i, ids, seeds[i][j] if seeds is not None else 0) for i, ids in enumerate(encoded) for j in range(request.n)
        ]
        out: list[list[Sampled]] = [[] for _ in request.prompts]
        gen_cfg = self.generation_config(request)
        with self.inference():
            torch.manual_seed(sampling.seed)
            for start in range(0, len(rows), request.batch_rows):
                chunk = rows[start : start + request.batch_rows]
                input_ids, attention = self._left_pad([ids for _, ids, _ in chunk])
                extra: dict[str, Any] = {}
                cfg = gen_cfg
                if seeds is not None and not greedy:
                    # The seeded sampler is greedy decoding over logits that leave one token finite.
                    cfg = GenerationConfig(
                        **{**gen_cfg.to_dict(), "do_sample": False, "temperature": None, "top_k": None, "top_p": None}
                    )
                    processor = SeededGumbelProcessor(
                        [seed for _, _, seed in chunk],
                        input_ids.shape[1],
                        sampling.temperature,
                        sampling.top_k,
                        sampling.top_p,
                    )
                    extra["logits_processor"] = LogitsProcessorList([processor])
                generated = self.model.generate(
                    input_ids=input_ids, attention_mask=attention, generation_config=cfg, **extra
                )
                new_tokens = generated[:, input_ids.shape[1] :].tolist()
                for (prompt_index, _, _), ids in zip(chunk, new_tokens, strict=True):
                    out[prompt_index].append(self.sampled(ids))
        return out

    def _right_pad(self, seqs: Sequence[Sequence[int]]) -> tuple[torch.Tensor, torch.Tensor]:
        width = max(len(s) for s in seqs)
        ids = torch.full((len(seqs), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(seqs), width), dtype=torch.long)
        for row, s in enumerate(seqs):
            ids[row, : len(s)] = torch.tensor(list(s), dtype=torch.long)
            mask[row, : len(s)] = 1
        return ids.to(self.device), mask.to(self.device)

    def _left_pad(self, seqs: Sequence[Sequence[int]]) -> tuple[torch.Tensor, torch.Tensor]:
        width = max(len(s) for s in seqs)
        ids = torch.full((len(seqs), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(seqs), width), dtype=torch.long)
        for row, s in enumerate(seqs):
            if s:
                ids[row, width - len(s) :] = torch.tensor(s, dtype=torch.long)
                mask[row, width - len(s) :] = 1
        return ids.to(self.device), mask.to(self.device)

    # ----------------------------------------------------------------- log-probabilities
    def completion_logits(
        self, samples: Sequence[tuple[Sequence[int], Sequence[int]]]
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Raw logits predicting each completion token, in one padded forward pass.

        Returns (logits [B, T, V], completion ids [B, T], mask [B, T]) over completion positions; prompts are
        left-padded and completions right-padded, with position ids taken from the attention mask as in
        generation. Only the completion positions' logits are computed (``logits_to_keep``).
        """
        prompt_ids, prompt_mask = self._left_pad([p for p, _ in samples])
        comp, comp_mask = self._right_pad([c for _, c in samples])
        width = comp.shape[1]
        input_ids = torch.cat([prompt_ids, comp], dim=1)
        attention = torch.cat([prompt_mask, comp_mask], dim=1)
        position_ids = (attention.cumsum(-1) - 1).clamp(min=0)
        model: Any = self.model
        # logits at position t predict token t + 1: the completion is predicted from one step earlier, so the
        # last width + 1 positions are kept and the very last one dropped.
        logits = model(
            input_ids=input_ids, attention_mask=attention, position_ids=position_ids, logits_to_keep=width + 1
        ).logits
        return logits[:, -(width + 1) : -1, :], comp, comp_mask

    def forced_logits(self, samples: Sequence[tuple[Sequence[int], Sequence[int]]]) -> ForcedLogits:
        """:meth:`completion_logits_shared` with the model to itself (:meth:`inference`): the defenses' pass.
        Its tensors are read, never written: a simulation's pool hands one result to every learner with these
        weights that asks for the same pass."""
        key: ForcedSamples = tuple((tuple(p), tuple(c)) for p, c in samples)
        if self.batcher is not None:
            return self.batcher.forced_logits(self, key)
        return self.forced_logits_here(key)

    def forced_logits_here(self, samples: ForcedSamples) -> ForcedLogits:
        """:meth:`forced_logits` on this learner alone."""
        with self.inference():
            return self.completion_logits_shared(samples)

    @torch.no_grad()
    def completion_logits_shared(
        self, samples: Sequence[tuple[Sequence[int], Sequence[int]]]
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """As :meth:`completion_logits` (no gradient), with each distinct prompt run once: a group's completions
        share their prompt, whose KV cache is repeated for each of them, so the prompt is not recomputed per
        completion (the defenses check every received completion; a node receives several per prompt)."""
        prompts = list(dict.fromkeys(tuple(p) for p, _ in samples))
        index = {p: i for i, p in enumerate(prompts)}
        rows = torch.tensor([index[tuple(p)] for p, _ in samples], dtype=torch.long, device=self.device)
        prompt_ids, prompt_mask = self._left_pad(prompts)
        model: Any = self.model
        cache_arg = cache_argument(model)
        out = model(
            input_ids=prompt_ids,
            attention_mask=prompt_mask,
            position_ids=(prompt_mask.cumsum(-1) - 1).clamp(min=0),
            use_cache=True,
            logits_to_keep=1,
        )
        first = out.logits[:, -1, :].index_select(0, rows)  # predicts each completion's first token
        comp, comp_mask = self._right_pad([c for _, c in samples])
        width = comp.shape[1]
        if width == 1:
            return first[:, None, :], comp, comp_mask
        cache = getattr(out, cache_arg)
        cache.reorder_cache(rows)  # index_select along the batch: repeats each prompt's cache per completion
        attention = torch.cat([prompt_mask.index_select(0, rows), comp_mask[:, :-1]], dim=1)
        position_ids = (attention.cumsum(-1) - 1).clamp(min=0)[:, prompt_ids.shape[1] :]
        rest = model(
            input_ids=comp[:, :-1],
            attention_mask=attention,
            position_ids=position_ids,
            use_cache=True,
            **{cache_arg: cache},
        ).logits  # position t predicts completion token t + 1
        return torch.cat([first[:, None, :], rest], dim=1), comp, comp_mask

    def completion_logprobs(
        self, samples: Sequence[tuple[Sequence[int], Sequence[int]]], temperature: float = 1.0
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Per-token log-probs of each completion given its prompt (log-softmax of ``logits / temperature``).

        Returns (logp [B, T], mask [B, T], logits [B, T, V]) over completion positions.
        """
        comp_logits, comp, comp_mask = self.completion_logits(samples)
        return token_logprobs(comp_logits, comp, temperature), comp_mask, comp_logits

    # ----------------------------------------------------------------- the update
    def accumulate_gradients(
        self,
        samples: Sequence[TrainSample],
        temperature: float,
        max_new_tokens: int,
        behaviour: list[torch.Tensor] | None = None,
    ) -> float:
        """Zero the gradients, then backpropagate the batch's GRPO loss micro-batch by micro-batch.

        Samples with zero advantage contribute nothing to the loss (on- or off-policy, beta = 0) and are not run
        through the model; they still count in the normalisers, so the gradient equals that of the whole batch.
        ``behaviour``: None is on-policy (ratio ``exp(logp - logp.detach())``); an empty list is on-policy too, and
        is filled with this pass's detached log-probs, one tensor per micro-batch (the old policy's, PPO's
        pi_old); a filled list is the ratio's denominator for the same samples' later updates. The micro-batches
        depend only on the samples, so the i-th is the same sequences at every update. Returns the batch loss.
        """
        cfg = self.cfg
        num_sequences = len(samples)
        num_tokens = sum(len(s.completion_ids) for s in samples)
        active = [s for s in samples if s.advantage != 0.0 or cfg.beta != 0.0 or cfg.epsilon is not None]
        # Micro-batches of similar lengths waste less compute on padding (a stable sort keeps the result
        # deterministic: the gradient is a sum over sequences, whatever their grouping).
        active.sort(key=lambda s: len(s.prompt_ids) + len(s.completion_ids))
        fill = behaviour is not None and not behaviour
        total = 0.0
        self.optimizer.zero_grad(set_to_none=True)
        for i, start in enumerate(range(0, len(active), cfg.micro_batch_size)):
            batch = active[start : start + cfg.micro_batch_size]
            logp, mask, _ = self.completion_logprobs([(s.prompt_ids, s.completion_ids) for s in batch], temperature)
            adv = torch.tensor([s.advantage for s in batch], dtype=logp.dtype, device=logp.device)
            ref = self._reference_logprobs(batch, temperature) if cfg.beta != 0.0 else None
            old = None  # on the first update the weights are those that generated: old = logp.detach()
            if behaviour is not None and fill:
                behaviour.append(logp.detach())
            elif behaviour is not None:
                old = behaviour[i]
                if old.shape != logp.shape:
                    raise DgrpoError(f"behaviour log-probs {tuple(old.shape)} for a {tuple(logp.shape)} micro-batch")
            token_loss = per_token_loss(
                logp,
                adv,
                old_logp=old,
                ref_logp=ref,
                beta=cfg.beta,
                epsilon_low=cfg.epsilon,
                epsilon_high=cfg.epsilon_high,
            )
            loss = reduce_loss(token_loss, mask, cfg.loss_type, num_sequences, num_tokens, max_new_tokens)
            loss.backward()
            total += float(loss.detach())
        return total

    def train_step(self, samples: Sequence[TrainSample], temperature: float, max_new_tokens: int) -> StepStats:
        """``learner.updates_per_round`` GRPO updates on a batch (the paper: one, so on-policy)."""
        if self.batcher is not None:
            return self.batcher.train_step(self, samples, temperature, max_new_tokens)
        return self.train_step_here(samples, temperature, max_new_tokens)

    def train_step_here(self, samples: Sequence[TrainSample], temperature: float, max_new_tokens: int) -> StepStats:
        """:meth:`train_step` on this learner alone; loss and gradient norm are the mean over its updates.

        Several updates follow TRL's ``num_iterations`` (GRPO's mu in DeepSeekMath's Algorithm 1): the old log-probs
        are taken once, before the first update, from the weights that generated (TRL's ``old_per_token_logps``;
        here the first update's own forward pass, which is that computation), and every later update's ratio is
        taken against them, so that the ratio leaves 1 and ``epsilon`` clips. Peers' completions are scored under
        our weights as TRL scores its own (no importance weight for another policy; ``docs/scale.md``).
        """
        t0 = time.perf_counter()
        updates = self.cfg.updates_per_round
        behaviour: list[torch.Tensor] | None = [] if updates > 1 else None
        losses: list[float] = []
        norms: list[float] = []
        with TORCH_LOCK:
            self.model.train()
            for _ in range(updates):
                losses.append(self.accumulate_gradients(samples, temperature, max_new_tokens, behaviour))
                norms.append(self._optimizer_step())
        tokens = sum(len(s.completion_ids) for s in samples)
        return StepStats(sum(losses) / updates, sum(norms) / updates, len(samples), tokens, time.perf_counter() - t0)

    def _optimizer_step(self) -> float:
        """Clip the accumulated gradients (``max_grad_norm``) and step; returns their norm before clipping."""
        params = [p for p in self.model.parameters() if p.requires_grad and p.grad is not None]
        if not params:
            return 0.0
        if self.cfg.max_grad_norm is not None:
            grad_norm = float(torch.nn.utils.clip_grad_norm_(params, self.cfg.max_grad_norm))
        else:
            grad_norm = float(
                torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in params if p.grad is not None]))
            )
        self.optimizer.step()
        return grad_norm

    @torch.no_grad()
    def _reference_logprobs(self, batch: Sequence[TrainSample], temperature: float) -> torch.Tensor:
        """Log-probs under the reference policy: the base model with LoRA adapters disabled.

        A KL penalty against a full-fine-tuned model would need a second copy of the weights; dgrpo supports
        beta != 0 with LoRA only, where the reference is free.
        """
        disable = getattr(self.model, "disable_adapter", None)
        if disable is None:
            raise ValueError("beta != 0 needs LoRA (model.lora) so that the reference model is the base model")
        with disable():
            logp, _, _ = self.completion_logprobs([(s.prompt_ids, s.completion_ids) for s in batch], temperature)
        return logp

    def __getstate__(self) -> dict[str, Any]:
        """A simulation's snapshot (:mod:`dgrpo.simulations.snapshot`): the kept digest is keyed by torch's
        in-place version counters, which a loaded tensor restarts at 0, so it is not kept."""
        state = dict(self.__dict__)
        state["_digest"] = None
        return state

    # ----------------------------------------------------------------- identity
    def weights_digest(self) -> str:
        """:func:`state_digest` of this model: equal digests mean identical weights.

        With ``keep_digest`` (a simulation's pool), kept until a tensor changes (torch counts in-place changes in
        ``Tensor._version``): a round asks for it several times, and a simulation for every node."""
        with TORCH_LOCK:
            state = self.model.state_dict()
            versions = _versions(state)
            if self.keep_digest and self._digest is not None and self._digest[0] == versions:
                return self._digest[1]
            self._digest = (versions, state_digest(state))
            return self._digest[1]

    def share_digest(self, source: Learner) -> None:
        """Take ``source``'s digest, whose weights this learner has just copied (a simulation's pool)."""
        with TORCH_LOCK:
            self._digest = (_versions(self.model.state_dict()), source.weights_digest())


def state_digest(state: Mapping[str, torch.Tensor]) -> str:
    """SHA-256 over every tensor's name and bytes, in name order (``docs/protocol.md``, weights digest)."""
    h = hashlib.sha256()
    for name, tensor in sorted(state.items()):
        h.update(name.encode())
        h.update(tensor.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def _versions(state: Mapping[str, torch.Tensor]) -> tuple[tuple[int, int], ...]:
    return tuple((t.data_ptr(), t._version) for _, t in sorted(state.items()))
