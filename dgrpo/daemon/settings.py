"""The daemon's configuration: TOML, overridden by ``DGRPO_*`` environment variables, overridden by the
command line (``--set section.key=value``). Typed and split by concern; every key carries help text.

Environment variables use ``__`` between levels: ``DGRPO_LEARNER__LR=1e-4``, ``DGRPO_RUN_ID=mynet``.
"""

from __future__ import annotations

import contextvars
import tomllib
from pathlib import Path
from typing import Annotated, Any, Literal, get_args

from multiaddr import Multiaddr
from pydantic import Field, ValidationError, field_validator
from pydantic_settings import (
    BaseSettings,
    JsonConfigSettingsSource,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
)

from dgrpo.config import RunConfig, Section
from dgrpo.daemon.ports import DEFAULT_LISTEN_PORT, DEFAULT_STATUS_PORT
from dgrpo.errors import ConfigError
from dgrpo.net.traversal_config import TraversalConfig
from dgrpo.overrides import apply_overrides, explain_validation_error

_TOML_FILE: contextvars.ContextVar[Path | None] = contextvars.ContextVar("dgrpo_toml_file", default=None)
_SAVED_FILE: contextvars.ContextVar[Path | None] = contextvars.ContextVar("dgrpo_saved_file", default=None)


class IdentitySettings(Section):
    key_path: Annotated[
        Path | None, Field(description="Ed25519 identity key (dgrpo keygen); default <state_dir>/identity.key")
    ] = None
    create: Annotated[bool, Field(description="create the key if it does not exist")] = True


def _multiaddr_problem(addr: str) -> str | None:
    """Why ``addr`` is no multiaddr (the parser's reason), None where it is one."""
    try:
        Multiaddr(addr)
    except Exception as exc:  # the parser's own error types differ by cause; its message says which
        return str(exc).partition(" (string:")[0]
    return None


class NetworkSettings(Section):
    listen: Annotated[str, Field(description="listen multiaddr")] = f"/ip4/0.0.0.0/tcp/{DEFAULT_LISTEN_PORT}"
    bootstrap: Annotated[list[str], Field(description="bootstrap peers as multiaddrs ending in /p2p/<peer id>")] = (
        Field(default_factory=list)
    )
    gossip: Annotated[
        dict[str, Any], Field(description="gossipsub tuning (heartbeat, degrees, rate limit, pacing)")
    ] = Field(default_factory=dict)
    traversal: Annotated[
        TraversalConfig,
        Field(description="NAT traversal and discovery: relay service, relays, hole punching, peer target"),
    ] = TraversalConfig()

    # Checked here, so that `--listen foo` is one line naming the key, not a traceback from libp2p's host start.
    @field_validator("listen")
    @classmethod
    def _listen_is_a_multiaddr(cls, value: str) -> str:
        problem = _multiaddr_problem(value)
        if problem is not None:
            raise ValueError(f"{problem}; give a multiaddr such as /ip4/0.0.0.0/tcp/{DEFAULT_LISTEN_PORT}")
        return value

    @field_validator("bootstrap")
    @classmethod
    def _bootstrap_names_peers(cls, value: list[str]) -> list[str]:
        for addr in value:
            problem = _multiaddr_problem(addr)
            if problem is None and not addr.rstrip("/").rpartition("/")[0].endswith("/p2p"):
                problem = f"{addr!r} names no peer"
            if problem is not None:
                raise ValueError(
                    f"{problem}; a bootstrap address ends in /p2p/<peer id>, e.g. /ip4/203.0.113.7/tcp/"
                    f"{DEFAULT_LISTEN_PORT}/p2p/12D3KooW... (the running node logs its own and writes it to node.json)"
                )
        return value


class RoundSettings(Section):
    deadline_seconds: Annotated[
        float, Field(gt=0, description="a round closes at quorum or this long after our own publish")
    ] = 60.0
    max_rounds: Annotated[int | None, Field(ge=1, description="stop after this many rounds; None: run on")] = None
    # 1, not 0: a node started alone should wait for its network, not train alone (a creator whose second node
    # came up minutes later had run 182 rounds by itself); `node run --solo` sets 0 for a deliberate lone node.
    min_peers: Annotated[
        int, Field(ge=0, description="wait for this many peers before the first round (0: start alone, --solo)")
    ] = 1
    # Minutes, not seconds: the second node is often started by hand, on another machine.
    start_timeout_seconds: Annotated[
        float, Field(gt=0, description="stop (exit status 2) when min_peers have not come within this long")
    ] = 600.0
    slowdown: Annotated[
        float,
        Field(
            ge=1.0,
            le=100.0,
            description="fault injection (--slow): after its generation and its update the node waits "
            "slowdown - 1 times as long as each took, as a machine that many times slower would",
        ),
    ] = 1.0
    heartbeat_seconds: Annotated[float, Field(gt=0, description="control-topic heartbeat period")] = 2.0
    keep_pace: Annotated[
        bool,
        Field(
            description="async mode: more than limits.rounds_ahead rounds past the upper median of the live peers' "
            "progress, wait for it before the next step (at most deadline_seconds); off: never wait"
        ),
    ] = True
    announce_rounds: Annotated[
        bool,
        Field(
            description="a heartbeat at every round start besides the periodic ones (peers see a node's round at "
            "once); off in large testnets, where the round's rollouts tell it (each message costs every node)"
        ),
    ] = True
    linger: Annotated[
        bool, Field(description="after max_rounds keep gossiping and serving status until SIGINT/SIGTERM")
    ] = False
    peer_timeout_seconds: Annotated[
        float,
        Field(gt=0, description="a peer silent this long is no longer expected, even mid-round (4 heartbeats)"),
    ] = 8.0


class CheckpointSettings(Section):
    folder: Annotated[Path | None, Field(description="default <state_dir>/checkpoints")] = None
    every: Annotated[int, Field(ge=1, description="write a checkpoint every k rounds (and at shutdown)")] = 5
    keep: Annotated[int, Field(ge=1, description="checkpoints kept")] = 3


class StatusSettings(Section):
    host: Annotated[str, Field(description="status/metrics HTTP address")] = "127.0.0.1"
    port: Annotated[
        int, Field(ge=0, le=65535, description="HTTP port; 0 picks a free one; the default taken, the next free one")
    ] = DEFAULT_STATUS_PORT
    enabled: Annotated[bool, Field(description="serve /status and /metrics")] = True
    weights_digest: Annotated[
        bool, Field(description="record a SHA-256 of the weights after every round (cheap for small models)")
    ] = False


class SyncSettings(Section):
    """The weights sync of the completion exchange (docs/protocol.md, "Weights sync"): a node that joins late,
    falls behind or diverges takes the trainable state a strict majority of its peers announce."""

    enabled: Annotated[
        bool,
        Field(
            description="serve and announce this node's trainable state after every round, and take the state a "
            "majority of peers hold when joining late, catching up or diverging (sync rounds, every node training "
            "on every completion: rollout.mode = sync without rollout.external_per_round)"
        ),
    ] = True
    wait_seconds: Annotated[
        float, Field(gt=0, description="how long a joiner waits for its peers to agree on the state it needs")
    ] = 120.0
    max_state_bytes: Annotated[
        int,
        Field(ge=1, description="the largest state served or fetched (weights and optimizer state, in bytes)"),
    ] = 1 << 30
    serve_bytes_per_second: Annotated[
        float, Field(gt=0, description="bytes a second this node serves to joiners, all of them together")
    ] = 64.0 * 1024 * 1024
    young_wait_seconds: Annotated[
        float,
        Field(
            ge=0,
            description="after every expected peer delivered a round, wait for young peers that announce this "
            "node's own state (a joiner that took it) at most this long or as long as the round took so far, "
            "whichever is longer: every node then trains on their completions alike; a young peer is otherwise not "
            "waited for (identities are free). 0: never wait",
        ),
    ] = 2.0


class MonitorSettings(Section):
    detectors: list[str] = Field(
        default_factory=lambda: ["text", "math", "code"],
        description="attack detectors counting poisoned completions trained on (status only, no filtering)",
    )


class EvalSettings(Section):
    every: Annotated[
        int, Field(ge=0, description="held-out accuracy every k rounds (rounds.jsonl, /status, the live page); 0: off")
    ] = 0
    prompts: Annotated[int, Field(ge=1, description="held-out prompts per evaluation (greedy)")] = 32


class FederationSettings(Section):
    """A daemon's place in a federation (``mode = "federated"``; the run's ``[federated]`` says how it trains)."""

    client_index: Annotated[
        int | None,
        Field(
            ge=0,
            description="which client's prompts this node trains on (0 .. federated.clients - 1); None: its rank "
            "among the sorted peer ids of the nodes present at the first round",
        ),
    ] = None
    aggregator: Annotated[
        str | None,
        Field(
            max_length=128,
            description="star topology: the aggregator's peer id; None: the lowest peer id present at the first round",
        ),
    ] = None
    chunk_bytes: Annotated[
        int,
        Field(
            ge=1024,
            le=512 * 1024,
            description="payload bytes per update message (every message stays under limits.max_message_bytes)",
        ),
    ] = 128 * 1024


Mode = Literal["completions", "federated"]
MODES: tuple[str, ...] = get_args(Mode)
# Names a mode had before (read from old state folders, saved settings and manifests; never printed).
LEGACY_MODES = {"httt": "completions"}


class NodeSettings(RunConfig, BaseSettings):
    """A daemon's settings: the run configuration (:class:`dgrpo.config.RunConfig`: task, model, learner,
    sampling, rollout, defense, adversary, limits) plus what only a daemon needs."""

    model_config = SettingsConfigDict(
        env_prefix="DGRPO_", env_nested_delimiter="__", extra="forbid", frozen=True, validate_default=True
    )

    run_id: Annotated[str, Field(pattern=r"^[A-Za-z0-9._-]{1,64}$", description="network/run id")] = "dgrpo"
    state_dir: Annotated[Path, Field(description="keys, nonce, replay state, checkpoints, status")] = Path(
        "dgrpo-state"
    )
    identity: IdentitySettings = IdentitySettings()
    network: NetworkSettings = NetworkSettings()
    rounds: RoundSettings = RoundSettings()
    checkpoint: CheckpointSettings = CheckpointSettings()
    status: StatusSettings = StatusSettings()
    monitor: MonitorSettings = MonitorSettings()
    sync: SyncSettings = SyncSettings()
    eval: EvalSettings = EvalSettings()
    mode: Annotated[
        Mode,
        Field(
            description="completions: exchange completions (decentralised GRPO, the default); federated: exchange "
            "model updates (Fed-GRPO)"
        ),
    ] = "completions"
    federation: FederationSettings = FederationSettings()
    torch_threads: Annotated[int, Field(ge=0, description="torch intra-op threads; 0: torch's default")] = 1

    @field_validator("mode", mode="before")
    @classmethod
    def _legacy_mode(cls, value: Any) -> Any:
        return LEGACY_MODES.get(value, value) if isinstance(value, str) else value

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # Precedence: command line (init) > environment > TOML file > the settings a resumed node last ran with.
        return (
            init_settings,
            env_settings,
            TomlConfigSettingsSource(settings_cls, toml_file=_TOML_FILE.get()),
            JsonConfigSettingsSource(settings_cls, json_file=_SAVED_FILE.get()),
        )

    def run_rounds(self) -> int | None:
        return self.rounds.max_rounds

    @property
    def key_path(self) -> Path:
        return self.identity.key_path or self.state_dir / "identity.key"

    @property
    def checkpoint_folder(self) -> Path:
        return self.checkpoint.folder or self.state_dir / "checkpoints"


def load_node_settings(
    config: Path | None = None, overrides: list[str] | None = None, saved: Path | None = None
) -> NodeSettings:
    """Settings from ``saved`` (JSON: what a resumed node last ran with, :mod:`dgrpo.daemon.local_state`),
    ``config`` (TOML), ``DGRPO_*`` variables and ``overrides`` (``key=value``), in that order of increasing
    precedence."""
    if config is not None:
        if not config.is_file():
            raise ConfigError(f"config file {str(config)!r} not found")
        try:
            tomllib.loads(config.read_text())
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"config {config}: invalid TOML: {exc}") from None
    token, saved_token = _TOML_FILE.set(config), _SAVED_FILE.set(saved)
    try:
        return NodeSettings(**apply_overrides({}, overrides or []))
    except ValidationError as exc:
        error = explain_validation_error(exc, NodeSettings, "node setting")
        if saved is not None:
            raise ConfigError(f"{error} (with the saved settings {saved}; edit or remove that file)") from None
        raise error from None
    except ValueError as exc:  # the saved file is not JSON
        raise ConfigError(f"cannot read the saved settings {saved}: {exc}") from None
    finally:
        _TOML_FILE.reset(token)
        _SAVED_FILE.reset(saved_token)
