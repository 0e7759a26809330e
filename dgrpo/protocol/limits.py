"""The one limits object: everything a node bounds in what peers send it (``docs/protocol.md``, "Limits").

The envelope models carry only the protocol's fixed bounds (a 32-byte key, 64-byte signature); the limits
here may differ between nodes. The message limits are checked by
:class:`dgrpo.protocol.validator.MessageValidator` after decoding, the round limits (how far ahead, how many
messages) by the round's admission stage (:mod:`dgrpo.round.admit`); each violation has its own reason code.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field

MIB = 1024 * 1024


class Limits(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", validate_default=True)

    max_message_bytes: Annotated[
        int,
        Field(
            ge=1024,
            le=16 * MIB,
            description="largest accepted wire message in bytes (gossipsub drops outbound messages over 1 MiB)",
        ),
    ] = MIB
    max_completions: Annotated[int, Field(ge=1, description="completions in one rollout message")] = 64
    max_completion_chars: Annotated[int, Field(ge=1, description="characters in one completion")] = 16384
    max_prompt_chars: Annotated[int, Field(ge=1, description="characters in a rollout's prompt text")] = 8192
    max_string_chars: Annotated[
        int,
        Field(
            ge=1,
            description="characters in an identifier (prompt id, model id, listen address, a global's client); "
            "prompt and model ids are capped at 256 and clients at 128 regardless, with the same reason",
        ),
    ] = 256
    clock_skew_seconds: Annotated[
        float,
        Field(gt=0.0, description="accepted difference between a message's timestamp and the local clock"),
    ] = 120.0
    replay_window: Annotated[
        int,
        Field(ge=1, le=1 << 20, description="nonces remembered per author below its highest (sliding window)"),
    ] = 4096
    max_tracked_peers: Annotated[
        int,
        Field(
            ge=1,
            description="authors kept by the replay guard and peers kept by the rejection counters; the least "
            "recently seen are forgotten first",
        ),
    ] = 10_000
    rounds_ahead: Annotated[
        int, Field(ge=0, description="rounds after the current one whose rollouts are kept until they open")
    ] = 2
    messages_per_round: Annotated[
        int, Field(ge=1, description="rollout messages kept for one round, from all peers together")
    ] = 10_000
    max_update_bytes: Annotated[
        int,
        Field(
            ge=1024,
            description="federated mode: largest encoded model update (the whole payload of its chunks), bytes",
        ),
    ] = 64 * MIB
    max_update_chunks: Annotated[
        int, Field(ge=1, description="federated mode: most chunks one update may be cut into")
    ] = 1024
    blacklist_after: Annotated[
        int,
        Field(
            ge=1,
            description="rejections of signed-but-invalid or malformed messages from one authenticated peer "
            "before it is blacklisted (replays and clock skew do not count)",
        ),
    ] = 20
