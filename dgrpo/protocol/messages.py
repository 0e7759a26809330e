"""Message bodies exchanged between nodes.

Strict, frozen pydantic models (extra fields forbidden, no type coercion), as hivemind does for untrusted
records: a peer's message is either exactly well-typed or rejected. The signed envelope around these bodies
is specified in ``docs/protocol.md``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

SplitMode = Literal["horizontal", "vertical"]
# SHA-256 of the author's weights when it sampled, as 64 lowercase hex digits; empty: not announced.
WEIGHTS_PATTERN = r"^([0-9a-f]{64})?$"
# The protocol's fixed cap on prompt and model ids; ``Limits.max_string_chars`` may lower it. On the wire the
# validator checks it (``string_too_long``), so a rollout envelope's ids carry no length bound of their own.
MAX_ID_CHARS = 256


class StrictModel(BaseModel):
    model_config = ConfigDict(strict=True, frozen=True, extra="forbid")


class SamplingParams(StrictModel):
    """How completions were sampled. ``top_k=0`` and ``top_p=1.0`` disable those filters."""

    temperature: Annotated[float, Field(gt=0.0, le=10.0)] = 1.0
    top_k: Annotated[int, Field(ge=0)] = 0
    top_p: Annotated[float, Field(gt=0.0, le=1.0)] = 1.0
    max_new_tokens: Annotated[int, Field(ge=1, le=65536)] = 64
    seed: Annotated[int, Field(ge=0, lt=2**63)] = 0


# The sampling every shipped configuration uses (the paper samples with top-k 50 at temperature 1.0; the tiny
# models' vocabularies are small, so 10).
DEFAULT_SAMPLING = SamplingParams(temperature=1.0, top_k=10, top_p=1.0, max_new_tokens=48)


class Rollout(StrictModel):
    """One author's completions for one prompt in one round (the paper exchanges these as strings).

    ``part``/``parts`` say how many rollout messages the author publishes this round, so a receiver knows
    when it has everything from that author (round quorum) without a separate control message.
    ``indices`` names each completion's index within the author's share for the prompt (the seeded sampler
    derives its seed from it); ``weights`` is the SHA-256 of the weights the author sampled with, so that
    receivers route same-model checks only to authors holding their own weights (``docs/protocol.md``).
    ``tokens`` (optional: empty, or one per completion) are the token ids each completion was sampled as, up
    to its end-of-sequence: the sampling proof checks exactly these in one pass where they spell the string,
    instead of searching for the author's tokenisation of it.
    """

    author: Annotated[str, Field(min_length=1, max_length=128)]
    round: Annotated[int, Field(ge=0)]
    part: Annotated[int, Field(ge=0)]
    parts: Annotated[int, Field(ge=1)]
    prompt_id: Annotated[str, Field(min_length=1, max_length=MAX_ID_CHARS)]
    prompt: str
    completions: tuple[str, ...]
    indices: tuple[Annotated[int, Field(ge=0)], ...]
    model_id: Annotated[str, Field(max_length=MAX_ID_CHARS)]
    weights: Annotated[str, Field(pattern=WEIGHTS_PATTERN)]
    sampling: SamplingParams
    split: SplitMode
    tokens: tuple[tuple[Annotated[int, Field(ge=0, lt=2**32)], ...], ...] = ()

    @model_validator(mode="after")
    def _one_index_per_completion(self) -> Rollout:
        if len(self.indices) != len(self.completions):
            raise ValueError(f"{len(self.indices)} indices for {len(self.completions)} completions")
        if self.tokens and len(self.tokens) != len(self.completions):
            raise ValueError(f"{len(self.tokens)} token lists for {len(self.completions)} completions")
        return self

    def subset(self, positions: Sequence[int]) -> Rollout:
        """The same rollout with only the completions at ``positions`` (distinct, in range), each keeping its
        index. A subset of a validated rollout satisfies every field's constraint, so it is built without
        validating again: the draw stage (:mod:`dgrpo.round.draw`) takes a few completions of each of J
        rollouts every round, and ``model_copy`` cost twice as much (2 us against 1 us here)."""
        fields = self.__dict__.copy()
        fields["completions"] = tuple([self.completions[p] for p in positions])
        fields["indices"] = tuple([self.indices[p] for p in positions])
        if self.tokens:
            fields["tokens"] = tuple([self.tokens[p] for p in positions])
        new = Rollout.__new__(Rollout)
        object.__setattr__(new, "__dict__", fields)
        object.__setattr__(new, "__pydantic_fields_set__", self.__pydantic_fields_set__)  # frozen: shared safely
        object.__setattr__(new, "__pydantic_extra__", None)
        object.__setattr__(new, "__pydantic_private__", None)
        return new
