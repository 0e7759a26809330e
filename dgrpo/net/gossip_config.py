"""The gossip layer's settings (:class:`GossipConfig`), with py-libp2p's size limits they are checked against."""

from __future__ import annotations

from typing import Annotated, Self

from libp2p.peer.peerinfo import info_from_p2p_addr
from multiaddr import Multiaddr
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

LIBP2P_MAX_RPC_BYTES = 1024 * 1024  # py-libp2p's per-RPC limit; bigger outbound RPCs are dropped silently
RPC_OVERHEAD_BYTES = 8 * 1024  # room for from, seqno, topic, signature, key and the signed peer record


class GossipConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True)

    listen: Annotated[str, Field(description="listen multiaddr; tcp/0 picks a free port")] = "/ip4/127.0.0.1/tcp/0"
    bootstrap: Annotated[tuple[str, ...], Field(description="peers to keep dialled: multiaddrs with /p2p/<id>")] = ()
    heartbeat_interval: Annotated[float, Field(gt=0.0, description="s; py-libp2p's 120 s meshes slowly")] = 1.0
    degree: Annotated[int, Field(ge=1, description="target mesh degree D")] = 6
    degree_low: Annotated[int, Field(ge=1, description="mesh degree below which peers are grafted")] = 4
    degree_high: Annotated[int, Field(ge=1, description="mesh degree above which peers are pruned")] = 12
    publish_to_seniors: Annotated[
        int,
        Field(
            ge=0,
            description="own messages also go straight to up to this many senior peers (verified work), besides "
            "the mesh: a mesh of Sybils cannot cut a node off from them (0: the mesh only)",
        ),
    ] = 16
    # py-libp2p's default, 10/s per (forwarding peer, topic), counts our own publishes too and drops the excess
    # without error: one node publishing a message per rollout group, or a relay forwarding several authors'
    # rollouts, passes it within a round. 1000/s still stops a flood.
    max_messages_per_topic_per_second: Annotated[
        float, Field(gt=0.0, description="spam limit per (forwarding peer, topic); the excess is not forwarded")
    ] = 1000.0
    max_message_bytes: Annotated[
        int, Field(ge=1, description="largest payload publish accepts; py-libp2p drops RPCs over 1 MiB silently")
    ] = LIBP2P_MAX_RPC_BYTES - RPC_OVERHEAD_BYTES
    max_inbound_rpc_size: Annotated[int, Field(ge=1, description="a bigger inbound RPC resets the stream")] = (
        LIBP2P_MAX_RPC_BYTES + 64 * 1024
    )
    max_outbound_queue: Annotated[
        int, Field(ge=1, le=31, description="publish waits while a peer's outbound queue (32 RPCs) is longer")
    ] = 8
    pacing_timeout: Annotated[float, Field(gt=0.0, description="s publish waits at most for the queues")] = 10.0
    stuck_after: Annotated[
        float,
        Field(
            gt=0.0,
            description="s a peer's full outbound queue may stay unmoved before publish stops waiting for it "
            "(what does not fit is dropped to that peer, counted per peer)",
        ),
    ] = 1.0
    dead_stream_after: Annotated[
        float,
        Field(
            gt=0.0,
            description="s a connected peer that had a pubsub stream may go without one before its connection is "
            "closed, to be dialled again (dgrpo.net.stream_watch)",
        ),
    ] = 10.0
    inbound_queue: Annotated[int, Field(ge=1, description="messages buffered per topic; more are dropped")] = 4096
    bootstrap_backoff_initial: Annotated[float, Field(gt=0.0, description="s before the first redial")] = 0.5
    bootstrap_backoff_max: Annotated[float, Field(gt=0.0, description="cap on the redial backoff, in s")] = 30.0
    dial_timeout: Annotated[float, Field(gt=0.0, description="s one bootstrap dial may take")] = 10.0
    strict_signing: Annotated[bool, Field(description="sign our messages, drop unsigned or forged ones")] = True
    equivocation_cache: Annotated[int, Field(ge=1, description="whole messages gossipsub keeps to compare")] = 256
    shutdown_flush_timeout: Annotated[float, Field(ge=0.0, description="s closing may wait for the flush")] = 5.0
    max_tracked_peers: Annotated[
        int, Field(ge=1, description="peers kept by the rejection counters; the least recently rejected go first")
    ] = 10_000

    @field_validator("listen")
    @classmethod
    def _parse_listen(cls, value: str) -> str:
        Multiaddr(value)
        return value

    @field_validator("bootstrap")
    @classmethod
    def _parse_bootstrap(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for addr in value:
            try:
                info_from_p2p_addr(Multiaddr(addr))
            except Exception as error:
                raise ValueError(f"bootstrap address {addr!r} is not a multiaddr ending in /p2p/<id>") from error
        return value

    @model_validator(mode="after")
    def _check_bounds(self) -> Self:
        if not self.degree_low <= self.degree <= self.degree_high:
            raise ValueError("need degree_low <= degree <= degree_high")
        if self.max_message_bytes > LIBP2P_MAX_RPC_BYTES - RPC_OVERHEAD_BYTES:
            raise ValueError(f"max_message_bytes must be <= {LIBP2P_MAX_RPC_BYTES - RPC_OVERHEAD_BYTES}")
        if self.max_inbound_rpc_size < self.max_message_bytes + RPC_OVERHEAD_BYTES:
            raise ValueError("max_inbound_rpc_size must be >= max_message_bytes + RPC_OVERHEAD_BYTES")
        if self.bootstrap_backoff_initial > self.bootstrap_backoff_max:
            raise ValueError("need bootstrap_backoff_initial <= bootstrap_backoff_max")
        return self
