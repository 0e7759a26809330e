"""Typed configuration of an adversary: what every attack shares, plus its own ``options``.

Configured in TOML (a scenario's or a node's ``[adversary]`` section) or with ``--adversary NAME`` on the
command line. Attack-specific options are validated by the attack's own ``Options`` model, so an unknown
option is an error that lists the valid ones.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field

from dgrpo.config.sections import Section
from dgrpo.errors import ConfigError

Fill = Literal["auto", "honest", "gibberish"]


class AdversaryConfig(Section):
    name: Annotated[
        str,
        Field(description="a registered attack (an unknown name's error lists them) or a dotted path to a plug-in"),
    ]
    oracle: Annotated[
        bool,
        Field(
            description="the attacker knows the ground-truth answers (paper's default); false: it majority-votes "
            "the answer over its own samples and poisons that one (the paper's no-oracle variant)"
        ),
    ] = True
    vote_samples: Annotated[int, Field(ge=1, description="no-oracle: own samples per prompt for the vote")] = 24
    candidates: Annotated[
        int, Field(ge=0, description="extra samples per prompt drawn to find correct completions to poison")
    ] = 8
    poison_fraction: Annotated[
        float,
        Field(ge=0.0, le=1.0, description="fraction of the attacker's completions per prompt that carry poison"),
    ] = 1.0
    fill: Annotated[
        Fill,
        Field(
            description="what the other completions are: 'honest' (its own samples), 'gibberish' (zero reward, "
            "the paper's vertical setting) or 'auto' (gibberish in the vertical split, honest in the horizontal)"
        ),
    ] = "auto"
    completions_per_prompt: Annotated[
        int | None,
        Field(
            ge=1,
            description="completions published per prompt that carries poison (over-publishing: the protocol "
            "does not bound an author's count per prompt); None, and prompts without poison: the normal share",
        ),
    ] = None
    seed: Annotated[int, Field(ge=0, description="seed of the attack's own random choices")] = 0
    in_sync: Annotated[
        bool,
        Field(
            description="the attacker trains through the honest nodes' defense chain, so that its weights stay "
            "equal to theirs and same-model checks keep accepting its genuine draws (routed by weights, "
            "docs/protocol.md); false: it trains on everything it receives, its own poison included, its "
            "weights drift and same-model checks reject it as foreign_model"
        ),
    ] = False
    options: Annotated[dict[str, Any], Field(description="attack-specific options (see each attack)")] = Field(
        default_factory=dict
    )


def parse_adversary_spec(spec: str) -> tuple[str, int]:
    """``NAME`` or ``NAME:COUNT`` (testnet ``--adversary text:1``) -> (name, count)."""
    name, _, count = spec.partition(":")
    if not name:
        raise ConfigError(f"adversary spec {spec!r}: expected NAME or NAME:COUNT")
    if not count:
        return name, 1
    if not count.isdigit() or int(count) < 1:
        raise ConfigError(f"adversary spec {spec!r}: COUNT must be a positive integer")
    return name, int(count)
