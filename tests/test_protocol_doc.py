"""docs/protocol.md must describe the code: field tables, limits, reason codes, and the worked example."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from dgrpo.protocol.chunks import FEDERATED_REASONS
from dgrpo.protocol.envelope import (
    DOMAIN_TAG,
    Envelope,
    HeartbeatBody,
    RolloutBody,
    UnsignedEnvelope,
    WireSamplingParams,
    canonical_bytes,
    decode,
    encode,
    verify_signature,
)
from dgrpo.protocol.identity import Identity
from dgrpo.protocol.limits import Limits
from dgrpo.protocol.messages import SamplingParams
from dgrpo.protocol.sync import DOMAIN_TAG as SYNC_DOMAIN_TAG
from dgrpo.protocol.sync import MAX_HEADER_BYTES, SYNC_REASONS, SyncHeader, encode_request, sync_protocol
from dgrpo.protocol.topics import control_topic, global_topic, rollout_topic, update_topic
from dgrpo.protocol.update_bodies import GlobalBody, UpdateBody
from dgrpo.protocol.validator import BENIGN_REASONS, REASONS

DOC = Path(__file__).resolve().parents[1] / "docs" / "protocol.md"
MODELS: dict[str, list[type[BaseModel]]] = {
    "Envelope": [Envelope],
    "RolloutBody": [RolloutBody],
    "SamplingParams": [WireSamplingParams, SamplingParams],
    "HeartbeatBody": [HeartbeatBody],
    "UpdateBody": [UpdateBody],
    "GlobalBody": [GlobalBody],
}


@pytest.fixture(scope="module")
def doc() -> str:
    return DOC.read_text(encoding="utf-8")


def _cells(line: str) -> list[str]:
    # split on "|" but not on the escaped "\|" used inside a cell
    return [c.strip().replace("\\|", "|") for c in re.split(r"(?<!\\)\|", line.strip())[1:-1]]


def table_after(doc: str, marker: str, header: list[str]) -> list[list[str]]:
    """Rows of the first table with ``header`` after the line ``marker``."""
    lines = doc.splitlines()
    start = lines.index(marker)
    for i in range(start + 1, len(lines)):
        if lines[i].startswith("|"):
            assert _cells(lines[i]) == header, f"table after {marker!r} has header {lines[i]!r}"
            rows = []
            for line in lines[i + 2 :]:
                if not line.startswith("|"):
                    break
                rows.append(_cells(line))
            return rows
    raise AssertionError(f"no table after {marker!r}")


def code_block_after(doc: str, marker: str) -> str:
    after = doc[doc.index(marker) + len(marker) :]
    match = re.match(r"\s*```\n(.*?)```", after, re.S)
    assert match, f"no code block after {marker!r}"
    return "".join(match.group(1).split())


@pytest.mark.parametrize("name", MODELS)
def test_field_tables_match_models(doc: str, name: str) -> None:
    rows = table_after(doc, f"### Model: {name}", ["field", "type", "notes"])
    for model in MODELS[name]:
        assert [r[0] for r in rows] == list(model.model_fields), f"{name} fields or order differ from {model}"
        for field_name, type_cell, _ in rows:
            annotation = model.model_fields[field_name].annotation
            assert type_cell.startswith("bin[") == (annotation is bytes), field_name
            assert (type_cell == "float64") == (annotation is float), field_name


def test_every_model_heading_is_known(doc: str) -> None:
    assert re.findall(r"^### Model: (\w+)$", doc, re.M) == list(MODELS)


def test_limits_table(doc: str) -> None:
    rows = table_after(doc, "## Limits", ["limit", "default", "notes"])
    defaults = Limits()
    assert [r[0] for r in rows] == list(Limits.model_fields)
    for name, default, _ in rows:
        assert type(getattr(defaults, name))(default) == getattr(defaults, name), name


def test_admission_reasons(doc: str) -> None:
    from dgrpo.round.admit import ARRIVAL_REASONS, CLOSE_REASONS

    rows = table_after(doc, "## Admission", ["reason", "when", "check"])
    assert tuple(r[0] for r in rows if r[1] == "arrival") == ARRIVAL_REASONS
    assert tuple(r[0] for r in rows if r[1] == "close") == CLOSE_REASONS


def test_federated_reasons(doc: str) -> None:
    rows = table_after(doc, "## Federated mode", ["reason", "when", "check"])
    assert tuple(r[0] for r in rows) == FEDERATED_REASONS


def test_state_sync(doc: str) -> None:
    rows = table_after(doc, "#### Sync header", ["field", "type", "notes"])
    assert [r[0] for r in rows] == list(SyncHeader.model_fields)
    for name, type_cell, _ in rows:
        annotation = SyncHeader.model_fields[name].annotation
        assert type_cell.startswith("bin[") == (annotation is bytes), name
        assert type_cell.startswith("float64") == (annotation in (float, float | None)), name
        assert type_cell.endswith(" or nil") == (type(None) in getattr(annotation, "__args__", ())), name
    rows = table_after(doc, "#### Sync checks", ["reason", "side", "check"])
    assert tuple(r[0] for r in rows) == SYNC_REASONS
    assert f"`{sync_protocol('RUN').replace('RUN', '<run>')}`" in doc
    assert " ".join(f"{b:02x}" for b in SYNC_DOMAIN_TAG) in doc
    assert " ".join(f"{b:02x}" for b in encode_request(1)[:4]) in doc and f"at most {MAX_HEADER_BYTES} bytes" in doc


def test_reason_codes(doc: str) -> None:
    rows = table_after(doc, "## Validation", ["reason", "check", "counts towards blacklisting"])
    assert tuple(r[0] for r in rows) == REASONS
    assert {r[0] for r in rows if r[2] == "no"} == BENIGN_REASONS
    assert {r[2] for r in rows} == {"yes", "no"}


def test_topics_and_domain_tag(doc: str) -> None:
    for topic in (rollout_topic("RUN"), control_topic("RUN"), update_topic("RUN"), global_topic("RUN")):
        assert f"`{topic.replace('RUN', '<run>')}`" in doc
    assert " ".join(f"{b:02x}" for b in DOMAIN_TAG) in doc


def _worked_example() -> tuple[Identity, UnsignedEnvelope]:
    ident = Identity.from_seed(bytes(range(32)))
    sampling = WireSamplingParams(temperature=0.7, top_k=0, top_p=1.0, max_new_tokens=64, seed=3)
    body = RolloutBody(
        part=0, parts=2, prompt_id="arith-42", prompt="1+1=", completions=("2", "11"), indices=(0, 1),
        model_id="dgrpo:tiny-arith", weights=hashlib.sha256(b"demo").hexdigest(), sampling=sampling,
        split="horizontal",
    )  # fmt: skip
    unsigned = UnsignedEnvelope(
        v=1, kind="rollout", run="demo-run", round=7, author=ident.public_bytes,
        nonce=1_700_000_000_000_000, ts=1_700_000_000_123, body=body,
    )  # fmt: skip
    return ident, unsigned


def test_worked_example(doc: str) -> None:
    ident, unsigned = _worked_example()
    canonical = canonical_bytes(unsigned)
    assert code_block_after(doc, "<!-- test-vector: canonical -->") == canonical.hex()
    assert f"Canonical bytes ({len(canonical)} bytes, hex)" in doc
    sig = ident.sign(canonical)
    assert code_block_after(doc, "<!-- test-vector: signature -->") == sig.hex()
    fields: dict[str, Any] = {name: getattr(unsigned, name) for name in UnsignedEnvelope.model_fields}
    wire = encode(Envelope(**fields, sig=sig))
    assert code_block_after(doc, "<!-- test-vector: wire -->") == wire.hex()
    assert f"({len(wire)} bytes;" in doc
    env = decode(bytes.fromhex(code_block_after(doc, "<!-- test-vector: wire -->")))
    assert verify_signature(env)
    assert ident.public_bytes.hex() in doc and ident.peer_id in doc
