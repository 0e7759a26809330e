"""How a node gets through NATs and finds peers (:mod:`dgrpo.net.traversal`): relay service and relay use,
hole punching, reachability checks, the connection target and its bounds. py-libp2p 0.8.1's parts do the work;
these are their knobs, with the defaults a home node needs."""

from __future__ import annotations

from typing import Annotated, Self

from multiaddr import Multiaddr
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator


class RelayLimitsConfig(BaseModel):
    """What a relay grants (circuit relay v2 ``RelayLimits``). A round's traffic between two peers is a few
    hundred KiB (rollouts are small; ``benchmarks/nat.py`` measures it), so the defaults let a relayed pair run
    for an hour before the circuit is renewed (the peering loop redials a closed circuit at once)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    duration_seconds: Annotated[int, Field(ge=1, description="longest life of one relayed connection")] = 3600
    data_bytes: Annotated[int, Field(ge=1024, description="bytes one relayed connection may carry")] = 256 * 1024**2
    max_circuits: Annotated[
        int,
        Field(
            ge=1, description="relayed connections open at once to one peer holding a slot (py-libp2p counts per peer)"
        ),
    ] = 64
    max_reservations: Annotated[
        int, Field(ge=1, description="peers holding a slot at once (each holds a connection: at most max_peers)")
    ] = 48
    reservation_ttl_seconds: Annotated[int, Field(ge=10, description="a slot lasts this long unless renewed")] = 3600


class TraversalConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True)

    relay_service: Annotated[
        bool, Field(description="serve as a circuit relay v2 for private peers (public nodes; open its port)")
    ] = False
    relay_limits: RelayLimitsConfig = RelayLimitsConfig()
    use_relays: Annotated[
        bool, Field(description="unless publicly reachable, reserve slots on relays and announce /p2p-circuit")
    ] = True
    max_relays: Annotated[int, Field(ge=0, le=8, description="relays to hold a reservation on at once")] = 2
    hole_punching: Annotated[bool, Field(description="upgrade relayed connections to direct ones (DCUtR)")] = True
    relayed_grace_seconds: Annotated[
        float,
        Field(
            ge=0,
            description="s a relayed connection stays up once a hole punch made a direct one (py-libp2p: 60; "
            "meanwhile the pair's gossip still crosses the relay)",
        ),
    ] = 10.0
    hole_punch_dial_timeout: Annotated[
        int, Field(ge=1, description="s DCUtR's dials may take (py-libp2p's default 10 s delays every upgrade)")
    ] = 3
    reachability_interval: Annotated[
        float, Field(gt=0, description="s between AutoNAT checks (sooner while still unknown)")
    ] = 60.0
    reachability_confirmations: Annotated[
        int, Field(ge=1, description="agreeing AutoNAT servers needed before public/private is believed")
    ] = 1
    dial_back_timeout: Annotated[float, Field(gt=0, description="s an AutoNAT server's dial-back may take")] = 5.0
    announce: Annotated[
        tuple[str, ...],
        Field(description="addresses announced besides the observed ones (a port forwarded on your router)"),
    ] = ()
    target_peers: Annotated[
        int, Field(ge=1, description="direct or relayed connections to keep, from bootstrap and peer exchange")
    ] = 8
    max_peers: Annotated[int, Field(ge=1, description="connections accepted in total (the resource manager)")] = 64
    max_per_ip: Annotated[int, Field(ge=1, description="connections from one IP address (Sybils share IPs)")] = 8
    max_per_subnet: Annotated[
        int, Field(ge=1, description="peers dialled by peer exchange in one /24 (IPv4) or /48 (IPv6)")
    ] = 2
    redial_initial_seconds: Annotated[float, Field(gt=0, description="backoff after a failed dial")] = 1.0
    redial_max_seconds: Annotated[float, Field(gt=0, description="cap on the redial backoff")] = 60.0
    peering_interval: Annotated[float, Field(gt=0, description="s between looks at the connection target")] = 1.0
    mdns: Annotated[bool, Field(description="find peers on the local network by mDNS (opt-in)")] = False

    @field_validator("announce")
    @classmethod
    def _parse_announce(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for addr in value:
            Multiaddr(addr)
        return value

    @model_validator(mode="after")
    def _check(self) -> Self:
        if self.redial_initial_seconds > self.redial_max_seconds:
            raise ValueError("need redial_initial_seconds <= redial_max_seconds")
        if self.target_peers > self.max_peers:
            raise ValueError("need target_peers <= max_peers")
        if self.relay_service and self.relay_limits.max_reservations > self.max_peers:
            raise ValueError("need relay_limits.max_reservations <= max_peers (a slot is held over a connection)")
        return self
