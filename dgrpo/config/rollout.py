"""What one node generates per round, and how: the paper's horizontal or vertical split (sec. 3) and the
sampler every node of a run must share."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from dgrpo.config.sections import Section
from dgrpo.protocol.messages import SplitMode

Sampler = Literal["multinomial", "seeded"]
RoundMode = Literal["sync", "async"]


class RolloutConfig(Section):
    """What one node generates per round (the paper's horizontal / vertical split, sec. 3)."""

    split: Annotated[
        SplitMode,
        Field(description="horizontal: all nodes answer the same prompts; vertical: each its own prompts"),
    ] = "horizontal"
    prompts_per_round: Annotated[int, Field(ge=1, description="prompts this node answers per round")] = 8
    completions_per_prompt: Annotated[int, Field(ge=1, description="completions per prompt per node")] = 2
    sampler: Annotated[
        Sampler,
        Field(
            description="multinomial: transformers' sampling from the node's seed; seeded: the verifiable seeded "
            "sampler (each completion's seed derived from run, round, author, prompt and index; needed by the "
            "sampling-proof defense; docs/protocol.md)"
        ),
    ] = "multinomial"
    external_per_round: Annotated[
        int | None,
        Field(
            ge=1,
            description="J: peers' completions a node draws per round to verify and train on, besides its own "
            "(SAPO's I local / J external), drawn in whole rollouts as the caps allow; None: every admitted one "
            "(the papers' all-gather)",
        ),
    ] = None
    external_per_author: Annotated[
        int, Field(ge=1, description="at most this many of the J drawn completions from one author")
    ] = 4
    young_rounds: Annotated[
        int,
        Field(
            ge=0,
            description="K: rounds of verified work (a drawn completion that passed the defense and scored a "
            "positive reward) before an author is no longer young; 0: nobody is",
        ),
    ] = 5
    young_share: Annotated[
        float,
        Field(ge=0.0, le=1.0, description="at most this share of the J drawn completions from young authors"),
    ] = 0.25
    mode: Annotated[
        RoundMode,
        Field(
            description="sync: a round waits for every expected peer's rollouts (or its deadline), as in the "
            "papers; async: a node never waits for a straggler, each step training on what has arrived from "
            "the last max_staleness rounds; it waits only when more than rounds_ahead past half its peers "
            "(docs/scale.md)"
        ),
    ] = "sync"
    max_staleness: Annotated[
        int,
        Field(
            ge=0,
            le=16,
            description="S (async mode): a step at round t takes peers' rollouts of rounds t-S..t; older ones are "
            "dropped, never importance-weighted (AReaL's bounded staleness; docs/scale.md)",
        ),
    ] = 4
    async_rounds_per_peer: Annotated[
        int | None,
        Field(
            ge=1,
            description="async mode: the most rounds of one peer's rollouts a step trains on, newest first; older "
            "complete ones wait for a later step until they leave the window (a straggler's step then stays one "
            "sync round's work instead of growing with its lag). None (default): all of them; 1 cost the fast "
            "nodes 1.2 points more on the straggler benchmark (docs/scale.md)",
        ),
    ] = None
    async_fill: Annotated[
        bool,
        Field(
            description="async mode: where peers delivered fewer completions this step than a full step's (a "
            "round's share from every peer heard in the last 10 steps), generate that many more of the node's own "
            "for the step's prompts and train on them too "
            "(never published: the plan binds what a node publishes); keeps the batch full beside a straggler "
            "(AReaL's fixed batch; on by default: without it async trails sync by 3 to 4 points; docs/scale.md)",
        ),
    ] = True
