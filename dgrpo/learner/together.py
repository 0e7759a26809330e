"""Several learners' generation in one pass, where they hold the same weights (a simulation's batched engine).

Nodes of a homogeneous network that hold identical weights (every honest node of an all-gather round does:
same base, same completions, same update) each sample a few completions a round; one ``generate`` call over
all their rows does the same work at the cost of one node's, as decoding a small batch is per-step overhead
on a CPU. Each request keeps its own randomness: its rows form a block that :class:`BlockSampler` samples
exactly as :meth:`Learner.generate_here` would, with a generator seeded as that call seeds torch's
(multinomial), from each completion's own seed (the seeded sampler) or greedily.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from transformers import GenerationConfig, LogitsProcessorList
from transformers.generation.logits_process import TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

from dgrpo.learner.batch import GenerateRequest, Sampled
from dgrpo.learner.learner import Learner
from dgrpo.learner.sampler import SeededGumbelProcessor


def together_key(request: GenerateRequest) -> tuple[object, ...]:
    """Requests with equal keys decode in one pass: the same stopping length (what is sampled differs per
    block)."""
    return (request.sampling.max_new_tokens,)


def fits_one_pass(request: GenerateRequest) -> bool:
    """Alone, a request of more rows than ``batch_rows`` runs in chunks that share one random stream, whose
    state at the second chunk depends on when the first stopped: such a request runs alone."""
    return 0 < request.rows <= request.batch_rows


@dataclass
class _Block:
    start: int
    stop: int
    request: GenerateRequest
    generator: torch.Generator | None
    seeded: SeededGumbelProcessor | None


class BlockSampler:
    """A logits processor that makes one greedy ``generate`` call sample every block of rows as its own call
    would: at each step it leaves only each row's chosen token finite (as :class:`SeededGumbelProcessor`)."""

    def __init__(self, blocks: Sequence[_Block]) -> None:
        self.blocks = list(blocks)

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        out = torch.full_like(scores, float("-inf"))
        for b in self.blocks:
            rows = scores[b.start : b.stop]
            if b.seeded is not None:
                out[b.start : b.stop] = b.seeded(input_ids[b.start : b.stop], rows)
                continue
            if b.request.greedy:
                chosen = rows.argmax(dim=-1)
            else:
                # transformers' sampling (GenerationMixin._sample): its warpers in its order, softmax, then
                # torch.multinomial; here from this block's own generator instead of torch's global one.
                sampling = b.request.sampling
                warped = rows
                if sampling.temperature != 1.0:
                    warped = TemperatureLogitsWarper(sampling.temperature)(input_ids[b.start : b.stop], warped)
                if sampling.top_k:
                    warped = TopKLogitsWarper(top_k=sampling.top_k)(input_ids[b.start : b.stop], warped)
                if sampling.top_p < 1.0:
                    warped = TopPLogitsWarper(top_p=sampling.top_p)(input_ids[b.start : b.stop], warped)
                probs = torch.nn.functional.softmax(warped, dim=-1)
                chosen = torch.multinomial(probs, num_samples=1, generator=b.generator).squeeze(1)
            out[b.start + torch.arange(len(chosen), device=out.device), chosen] = 0.0
        return out


@torch.no_grad()
def generate_together(learner: Learner, requests: Sequence[GenerateRequest]) -> list[list[list[Sampled]]]:
    """What ``learner.generate_here(r)`` returns for each of ``requests``, from one ``generate`` call on
    ``learner``'s model (every request is made for a learner with these weights and this tokenizer). Each
    request must :func:`fit one pass <fits_one_pass>` and share :func:`together_key`."""
    if not requests:
        return []
    if len({together_key(r) for r in requests}) != 1 or not all(fits_one_pass(r) for r in requests):
        raise ValueError("generate_together: requests must share a stopping length and fit one pass each")
    rows: list[tuple[int, int, tuple[int, ...]]] = []  # (request, prompt index, prompt ids)
    blocks: list[_Block] = []
    for k, r in enumerate(requests):
        start = len(rows)
        rows.extend((k, i, learner.encode_prompt(p)) for i, p in enumerate(r.prompts) for _ in range(r.n))
        blocks.append(_Block(start, len(rows), r, None, None))
    input_ids, attention = learner._left_pad([ids for _, _, ids in rows])
    width = input_ids.shape[1]
    for b in blocks:
        r = b.request
        if r.greedy:
            continue
        if r.seeds is not None:
            seeds = [s for per_prompt in r.seeds for s in per_prompt]
            sampling = r.sampling
            b.seeded = SeededGumbelProcessor(seeds, width, sampling.temperature, sampling.top_k, sampling.top_p)
        else:
            b.generator = torch.Generator(device=learner.device).manual_seed(r.sampling.seed)
    cfg = GenerationConfig(
        do_sample=False,
        max_new_tokens=requests[0].sampling.max_new_tokens,
        eos_token_id=list(learner.eos_ids),
        pad_token_id=learner.pad_id,
    )
    with learner.inference():
        generated = learner.model.generate(
            input_ids=input_ids,
            attention_mask=attention,
            generation_config=cfg,
            logits_processor=LogitsProcessorList([BlockSampler(blocks)]),
        )
    new_tokens = generated[:, width:].tolist()
    out: list[list[list[Sampled]]] = [[[] for _ in r.prompts] for r in requests]
    for (k, i, _), ids in zip(rows, new_tokens, strict=True):
        out[k][i].append(learner.sampled(ids))
    return out
