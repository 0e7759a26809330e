"""Gossipsub topic names. The run id and a protocol version are part of the name, so nodes of different runs,
or of incompatible protocol versions, never share a mesh (``docs/protocol.md``, "Topics")."""

from __future__ import annotations

import re

from dgrpo.errors import ConfigError

RUN_ID_PATTERN = r"[A-Za-z0-9._-]{1,64}"
_RUN_ID_RE = re.compile(RUN_ID_PATTERN)
TOPIC_VERSION = 1


def is_valid_run_id(run: str) -> bool:
    # fullmatch, and no "$": "$" would also match before a trailing newline
    return isinstance(run, str) and _RUN_ID_RE.fullmatch(run) is not None


def validate_run_id(run: str) -> str:
    """Return ``run`` if it is 1..64 characters of ``[A-Za-z0-9._-]``, else raise :class:`ConfigError`."""
    if not is_valid_run_id(run):
        raise ConfigError(f"invalid run id {run!r}: use 1 to 64 characters of A-Z a-z 0-9 . _ -")
    return run


def rollout_topic(run: str) -> str:
    """``/dgrpo/<run>/rollouts/1``: rollout messages."""
    return f"/dgrpo/{validate_run_id(run)}/rollouts/{TOPIC_VERSION}"


def control_topic(run: str) -> str:
    """``/dgrpo/<run>/control/1``: heartbeats (and later control messages)."""
    return f"/dgrpo/{validate_run_id(run)}/control/{TOPIC_VERSION}"


def update_topic(run: str) -> str:
    """``/dgrpo/<run>/updates/1``: federated mode's client updates (chunked)."""
    return f"/dgrpo/{validate_run_id(run)}/updates/{TOPIC_VERSION}"


def global_topic(run: str) -> str:
    """``/dgrpo/<run>/global/1``: federated mode's global updates from the aggregator (star topology)."""
    return f"/dgrpo/{validate_run_id(run)}/global/{TOPIC_VERSION}"


def topic_kind(topic: str, run: str) -> str | None:
    """The envelope kind carried by ``topic`` of ``run`` (pass it as ``expected_kind``), None for a foreign topic."""
    kinds = {
        rollout_topic(run): "rollout",
        control_topic(run): "heartbeat",
        update_topic(run): "update",
        global_topic(run): "global",
    }
    return kinds.get(topic)
