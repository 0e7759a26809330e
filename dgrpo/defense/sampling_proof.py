"""``sampling-proof`` (ours, homogeneous): check that every token is the one the seeded sampler had to pick.

Honest nodes sample with the seeded sampler (:mod:`dgrpo.learner.sampler`, ``docs/protocol.md``): completion
``index`` of ``author`` for ``prompt_id`` in round ``round`` is drawn with the seed derived from
(run, round, author, prompt id, index), which its author cannot choose. A verifier holding the same weights
runs the model once over the completion (teacher forcing) and, at every position, recomputes the sampler's
choice from the logits and the public noise. "Hail to the Thief" (sec. 6.1) notes that reproducible kernels
and shared seeds would make its logit check exact; this is that check. Unlike the logit check it also stops
MATH (a "5" in the top-k is still not the token the noise selects) and DoS (the attacker's longest sample was
drawn with some other seed, so its tokens diverge from the canonical draw).

Sampled tokens: an honest author sends each completion's token ids beside its string (``Rollout.tokens``).
Where they spell the string, exactly they are checked, in the one teacher-forced pass: the proof then costs that
pass and the per-position check, nothing else (issue 27). Where none are sent, or they spell something else,
the string is checked as below.

Re-tokenisation: completions travel as strings, and the tokens an author sampled need not be the ones its
string encodes to (BPE: two newline tokens re-encode as one double-newline token); an honest completion then
fails the fast check from some position on. Where the sampler's own choice at the first failing position
still spells the text (:func:`plausible_retokenisation`), the author's tokenisation is rebuilt: the sampler's
token there, then the rest of the text encoded afresh, checked again in one batched forward pass for all such
completions, repeated at each further such position (:func:`retokenise`, a few passes). Where that cannot
decide (a token ending inside a UTF-8 character, a rebuilt text past max_new_tokens, many positions), the rest
is replayed at the string level (:func:`replay`, one generation of the tail). An edited token (MATH's "5", a
payload's first letter) spells something else and is rejected at once.

Tolerance: the verifier's logits differ from the generator's by float noise (batch shapes, KV cache, another
machine). A position passes when the claimed token's perturbed score is within ``atol`` of the best one (and,
with top-k, its score within ``atol`` of the k-th); a completion is rejected when the share of failing
positions exceeds ``max_mismatch_fraction`` (0 by default: a poisoner gets no free tokens).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated, Any

import numpy as np
import torch
from pydantic import Field

from dgrpo.config import Section
from dgrpo.defense.base import ACCEPT, Candidate, DefenseContext, Verdict
from dgrpo.defense.forward import ForcedBatch, ModelDefense
from dgrpo.defense.registry import DEFENSES
from dgrpo.learner.learner import Learner, cache_argument
from dgrpo.learner.sampler import completion_seed, gumbel_noise, kept_mask
from dgrpo.protocol.messages import SamplingParams


class SamplingProofOptions(Section):
    atol: Annotated[float, Field(ge=0.0, description="tolerance on perturbed scores (temperature-scaled logits)")] = (
        1e-3
    )
    max_mismatch_fraction: Annotated[
        float, Field(ge=0.0, le=1.0, description="share of positions allowed to diverge beyond atol")
    ] = 0.0
    micro_batch: Annotated[int, Field(ge=1, description="completions per forward pass")] = 32
    retokenise_passes: Annotated[
        int,
        Field(ge=0, description="batched re-tokenisation passes before falling back to the string-level replay"),
    ] = 8
    replay: Annotated[
        bool,
        Field(
            description="replay at the string level the completions whose first failing token is another "
            "tokenisation of the same text (absorbs BPE re-tokenisation of exchanged strings)"
        ),
    ] = True


def mismatches(
    logits: torch.Tensor,
    ids: torch.Tensor,
    seeds: Sequence[int],
    temperature: float,
    top_k: int,
    top_p: float,
    atol: float,
    mask: torch.Tensor | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per row: how many positions of ``ids`` [B, T] are not the seeded sampler's choice (beyond ``atol``),
    the first such position (-1 if none) and the sampler's own choice there, from logits [B, T, V] and each
    row's seed; padding (``mask`` False) never counts.

    Cost (issue 27: the proof must cost at most a tenth of the teacher-forced pass it checks). With top-k
    (the papers sample with k = 50) only the k best tokens of a position can be chosen, so one ``topk`` over the
    vocabulary and noise for B x T x k tokens decide every position, all of it vectorised: no pass over the
    vocabulary beyond ``topk`` and one comparison for ties, no per-token Python. A position whose k-th score is
    tied with tokens past the k-th (the sampler keeps them all) and sampling without top-k go the general way
    (:func:`mismatches_full`: noise for every kept token)."""
    B, T = ids.shape
    V = logits.shape[-1]
    if B * T == 0:  # nothing to check
        return np.zeros(B, dtype=np.int64), np.full(B, -1, dtype=np.int64), np.full(B, -1, dtype=np.int64)
    if not 0 < top_k < V - 1:
        return mismatches_full(logits, ids, seeds, temperature, top_k, top_p, atol, mask)
    # k + 1 best: the sampler keeps every token tied with the k-th, so where the next one ties with it more
    # than k are kept (then the general way); no other pass over the vocabulary
    values, tokens = torch.topk(logits.float(), top_k + 1, dim=-1)  # [B, T, k + 1], best first
    tied_at = values[..., top_k] == values[..., top_k - 1]
    if mask is not None:
        tied_at &= mask  # padding is never checked: a tie there is no reason to go the general way
    tied = tied_at.any(-1).numpy()  # rows with such a position
    values, tokens = values[..., :top_k], tokens[..., :top_k]
    scores = values.double() / temperature  # [B, T, k]
    tok = tokens.numpy().astype(np.int64)
    kept = np.ones(tok.shape, dtype=bool)
    if top_p < 1.0:
        # the nucleus among the k kept tokens, ranked as kept_mask ranks them: by probability, then token id
        order = np.lexsort((tok, -scores.numpy()), axis=-1)
        ranked = torch.from_numpy(np.take_along_axis(scores.numpy(), order, -1))
        probs = torch.softmax(ranked, dim=-1)
        before = (torch.cumsum(probs, dim=-1) - probs).numpy()  # mass of strictly better-ranked tokens
        np.put_along_axis(kept, order, before < top_p, -1)
    seed_arr = np.asarray(seeds, dtype=np.uint64)
    positions = np.arange(T, dtype=np.uint64)[None, :, None]
    perturbed = scores.numpy() + gumbel_noise(seed_arr[:, None, None], positions, tok)
    perturbed = np.where(kept, perturbed, -np.inf)
    best = perturbed.max(-1)  # [B, T]
    # the sampler's choice: the best perturbed score, ties to the lowest token id
    choice_all = np.where(perturbed == best[..., None], tok, np.iinfo(np.int64).max).min(-1)
    own_scores, own = _claimed(logits, ids, seeds, temperature)
    ok = (own >= best - atol) & (own_scores >= scores[..., -1].numpy() - atol)  # the best, and within top-k
    if top_p < 1.0:
        ok &= ((tok == ids.numpy()[..., None]) & kept).any(-1)
    count, first = _failures(ok, mask)
    choice = np.where(first >= 0, choice_all[np.arange(B), np.maximum(first, 0)], -1)
    if tied.any():  # those rows the general way (rare: float ties at the k-th score)
        rows = np.flatnonzero(tied)
        at = torch.from_numpy(rows)
        sub = mismatches_full(
            logits[at], ids[at], [seeds[int(r)] for r in rows], temperature, top_k, top_p, atol,
            None if mask is None else mask[at],
        )  # fmt: skip
        count[rows], first[rows], choice[rows] = sub
    return count, first, choice


def mismatches_full(
    logits: torch.Tensor,
    ids: torch.Tensor,
    seeds: Sequence[int],
    temperature: float,
    top_k: int,
    top_p: float,
    atol: float,
    mask: torch.Tensor | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """:func:`mismatches` over every kept token of the vocabulary (no top-k, or ties at the k-th score)."""
    B, T = ids.shape
    scores = logits.float() / temperature
    keep = kept_mask(scores, top_k, top_p)
    b_idx, t_idx, tok_idx = (x.numpy() for x in keep.nonzero(as_tuple=True))
    seed_arr = np.asarray(seeds, dtype=np.uint64)
    # Noise is added in double precision to the (float32) scaled logits, as the sampler does.
    kept_scores = (logits[keep].double() / temperature).numpy()
    perturbed = kept_scores + gumbel_noise(seed_arr[b_idx], t_idx, tok_idx)
    best = np.full(B * T, -np.inf)
    np.maximum.at(best, b_idx * T + t_idx, perturbed)
    own_scores, own = _claimed(logits, ids, seeds, temperature)
    ok = own >= best.reshape(B, T) - atol
    if 0 < top_k < scores.shape[-1]:
        kth = (torch.topk(logits, top_k, dim=-1).values[..., -1].double() / temperature).numpy()
        ok &= own_scores >= kth - atol
    if top_p < 1.0:
        ok &= keep.gather(-1, ids.unsqueeze(-1)).squeeze(-1).numpy()
    count, first = _failures(ok, mask)
    # The sampler's choice at each row's first failing position: the first kept token (lowest id) whose
    # perturbed score is the best of its position.
    flat = b_idx * T + t_idx
    is_best = perturbed == best[flat]
    choice = np.full(B, -1, dtype=np.int64)
    for b in np.flatnonzero(first >= 0):
        hit = np.flatnonzero(is_best & (flat == b * T + first[b]))
        choice[b] = tok_idx[hit[0]] if len(hit) else -1
    return count, first, choice


def _claimed(
    logits: torch.Tensor, ids: torch.Tensor, seeds: Sequence[int], temperature: float
) -> tuple[np.ndarray, np.ndarray]:
    """The claimed tokens' scaled scores [B, T] and their perturbed scores (plus the sampler's noise)."""
    B, T = ids.shape
    own_scores = (logits.gather(-1, ids.unsqueeze(-1)).squeeze(-1).double() / temperature).numpy()
    seed_arr = np.broadcast_to(np.asarray(seeds, dtype=np.uint64)[:, None], (B, T))
    return own_scores, own_scores + gumbel_noise(seed_arr, np.broadcast_to(np.arange(T), (B, T)), ids.numpy())


def _failures(ok: np.ndarray, mask: torch.Tensor | None) -> tuple[np.ndarray, np.ndarray]:
    """Per row: failing positions counted (padding never) and the first one (-1 if none)."""
    bad = ~ok if mask is None else ~ok & mask.numpy()
    return bad.sum(-1), np.where(bad.any(-1), bad.argmax(-1), -1)


def plausible_retokenisation(learner: Learner, text: str, prefix: Sequence[int], choice: int) -> bool:
    """Whether the sampler's choice at the first failing position still spells ``text`` (the author sampled
    another tokenisation of the same characters), rather than something else (an edited or foreign token)."""
    if choice < 0 or choice in learner.eos_ids:
        return False
    spelled = str(learner.tokenizer.decode([*prefix, choice], skip_special_tokens=True)).rstrip("\ufffd")
    return text.startswith(spelled) and len(spelled) > len(
        str(learner.tokenizer.decode(list(prefix), skip_special_tokens=True)).rstrip("\ufffd")
    )


def retokenise(
    learner: Learner,
    pending: Sequence[tuple[str, str, int, list[int], int, int]],
    sampling: SamplingParams,
    atol: float,
    passes: int,
) -> list[bool | None]:
    """Rebuild the author's tokenisation of completions that failed the fast check where the sampler's own
    token still spells their text. ``pending``: (prompt, text, seed, checked ids, first failing position, the
    sampler's token there). Each pass puts the sampler's token at the failing position, encodes the rest of
    the text afresh and checks every row again in one batched forward pass. Per row: True (every token is the
    sampler's and they spell the text), False (a divergence that is not a re-tokenisation) or None (undecided:
    left to :func:`replay`)."""
    tok = learner.tokenizer
    out: list[bool | None] = [None] * len(pending)
    state = {i: (ids, first, choice) for i, (_, _, _, ids, first, choice) in enumerate(pending)}
    for _ in range(passes):
        todo: list[tuple[int, list[int], int]] = []
        for i, (ids, first, choice) in state.items():
            text = pending[i][1]
            prefix = [*ids[:first], choice]
            spelled = str(tok.decode(prefix, skip_special_tokens=True))
            if spelled.endswith("\ufffd") or not text.startswith(spelled):
                continue  # ends inside a character: only the replay can follow it
            rebuilt = prefix + list(tok(text[len(spelled) :], add_special_tokens=False)["input_ids"])
            if len(rebuilt) > sampling.max_new_tokens or tok.decode(rebuilt, skip_special_tokens=True) != text:
                continue
            if len(rebuilt) < sampling.max_new_tokens:
                rebuilt.append(learner.eos_ids[0])
            todo.append((i, rebuilt, first))
        if not todo:
            break
        samples = [(learner.encode_prompt(pending[i][0]), rebuilt) for i, rebuilt, _ in todo]
        logits, forced, mask = learner.forced_logits(samples)
        bad, firsts, choices = mismatches(
            logits.float().cpu(),
            forced.cpu(),
            [pending[i][2] for i, _, _ in todo],
            sampling.temperature,
            sampling.top_k,
            sampling.top_p,
            atol,
            mask.cpu().bool(),
        )
        state = {}
        for j, (i, rebuilt, first) in enumerate(todo):
            if bad[j] == 0:
                out[i] = True
            elif firsts[j] > first and plausible_retokenisation(
                learner, pending[i][1], rebuilt[: firsts[j]], int(choices[j])
            ):
                state[i] = (rebuilt, int(firsts[j]), int(choices[j]))
            else:
                out[i] = False  # the sampler's own token spells something else there: not a re-tokenisation
    return out


def replay(
    learner: Learner,
    prompt: str,
    text: str,
    seed: int,
    sampling: SamplingParams,
    atol: float,
    prefix: Sequence[int] = (),
) -> bool:
    """The string-level check: decode with the seeded sampler, token by token, keeping only choices whose text
    continues ``text``; True when it spells ``text`` exactly (then stops, or reaches ``max_new_tokens``).

    Completions travel as strings, and a sampled token sequence need not be the one the tokenizer gives back
    (two newline tokens re-encode as one double-newline token, say). The fast check then fails at a position
    or two for an honest completion; this replay follows the author's own tokenisation instead. At each step
    the choices within ``atol`` of the best perturbed score are tried in order (float noise), and a choice
    whose text leaves ``text`` is a divergence. ``prefix``: tokens the fast pass already checked. Costs one
    generation of the rest; used only where the fast check's first failure looks like re-tokenisation.
    """
    tok = learner.tokenizer
    model: Any = learner.model
    eos = set(learner.eos_ids)
    ids: list[int] = list(prefix)  # tokens already checked by the fast pass
    decoded = str(tok.decode(ids, skip_special_tokens=True))
    input_ids = torch.tensor([[*learner.encode_prompt(prompt), *ids]], device=learner.device)
    past = None
    cache_arg = cache_argument(model)
    with learner.inference():
        for position in range(len(ids), sampling.max_new_tokens):
            out = model(input_ids=input_ids, use_cache=True, **{cache_arg: past})
            past = getattr(out, cache_arg)
            scores = out.logits[0, -1].double().cpu() / sampling.temperature
            tokens = kept_mask(scores[None], sampling.top_k, sampling.top_p)[0].nonzero().flatten().numpy()
            perturbed = scores.numpy()[tokens] + gumbel_noise(seed, position, tokens)
            order = np.argsort(-perturbed, kind="stable")
            chosen = None
            for j in order:
                if perturbed[j] < perturbed[order[0]] - atol:
                    break
                token = int(tokens[j])
                if token in eos:
                    if decoded == text:
                        return True
                    continue
                candidate = str(tok.decode([*ids, token], skip_special_tokens=True))
                if text.startswith(candidate.rstrip("\ufffd")):
                    chosen = token
                    decoded = candidate
                    break
            if chosen is None:
                return False
            ids.append(chosen)
            input_ids = torch.tensor([[chosen]], device=learner.device)
    return decoded == text


@DEFENSES.register("sampling-proof")
class SamplingProofDefense(ModelDefense):
    name = "sampling-proof"
    cost = 60
    proof = True
    Options = SamplingProofOptions

    def __init__(self, options: dict[str, Any] | None = None) -> None:
        super().__init__(options)
        self.replayed_ok = 0  # honest completions the fast check failed and the string-level replay accepted
        self.retokenised_ok = 0  # ... and the batched re-tokenisation accepted

    def claimed_tokens(self, learner: Learner, candidate: Candidate, max_new_tokens: int) -> tuple[int, ...] | None:
        """The author's tokens where they spell its text exactly as generation decodes them (no stop inside,
        at most ``max_new_tokens``): then exactly these are checked, in the one teacher-forced pass. Otherwise
        (none sent, or tokens that spell something else) the text is checked as if none had been sent."""
        tokens = candidate.tokens
        if tokens is None or len(tokens) > max_new_tokens or any(t in learner.eos_ids for t in tokens):
            return None
        if max(tokens, default=0) >= int(learner.model.get_input_embeddings().num_embeddings):
            return None  # no such token
        text, _ = learner.sampled(tokens)
        return tokens if text == candidate.text else None

    def check_batch(self, ctx: DefenseContext, candidates: Sequence[Candidate], batch: ForcedBatch) -> list[Verdict]:
        assert ctx.learner is not None
        run = ctx.sampling
        seeds = [completion_seed(ctx.run_id, ctx.round, c.author, c.prompt.id, c.index) for c in candidates]
        bad, first, choice = mismatches(
            batch.logits, batch.ids, seeds, run.temperature, run.top_k, run.top_p, self.options.atol, batch.mask
        )
        verdicts: list[Verdict | None] = [None] * len(candidates)
        retok: list[int] = []  # rows whose first failing token looks like another tokenisation of the text
        for k, c in enumerate(candidates):
            length = int(batch.mask[k].sum())
            if batch.claimed[k]:
                # The author's own tokens, which spell its text: they are the sampler's or they are not.
                verdicts[k] = ACCEPT if bad[k] == 0 else self.reject("diverged", bad[k] / max(length, 1))
            elif bad[k] == 0 and batch.overflow[k]:
                # Every checked token is the sampler's, so the author stopped at max_new_tokens: the text
                # after them was not sampled.
                verdicts[k] = self.reject("overflow", 1.0)
            elif bad[k] <= self.options.max_mismatch_fraction * length and not batch.overflow[k]:
                verdicts[k] = ACCEPT
            elif self.options.replay and plausible_retokenisation(
                ctx.learner, c.text, batch.ids[k, : first[k]].tolist(), int(choice[k])
            ):
                retok.append(k)
            else:
                verdicts[k] = self.reject("diverged", bad[k] / max(length, 1))
        pending = [
            (candidates[k].prompt.text, candidates[k].text, seeds[k], batch.ids[k, : int(batch.mask[k].sum())].tolist(),
             int(first[k]), int(choice[k]))
            for k in retok
        ]  # fmt: skip
        decided = retokenise(ctx.learner, pending, run, self.options.atol, self.options.retokenise_passes)
        for k, ok in zip(retok, decided, strict=True):
            if ok is None:  # undecided: the exact string-level replay from the first failing position
                prefix = batch.ids[k, : first[k]].tolist()
                c = candidates[k]
                ok = replay(ctx.learner, c.prompt.text, c.text, seeds[k], run, self.options.atol, prefix)
                self.replayed_ok += ok
            else:
                self.retokenised_ok += ok
            verdicts[k] = ACCEPT if ok else self.reject("diverged", bad[k] / max(int(batch.mask[k].sum()), 1))
        decided_all = [v for v in verdicts if v is not None]
        assert len(decided_all) == len(candidates)  # every row got exactly one verdict above
        return decided_all
