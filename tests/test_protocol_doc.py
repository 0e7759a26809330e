"""docs/protocol.md must describe the code: field tables, limits, reason codes, and the worked example."""

from __future__ import annotations

import hashlib
import json
import math
import random
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


# ------------------------------------------------------------------------------ prompts (Plan binding)
VECTOR_AUTHOR = Identity.from_seed(bytes(range(32))).peer_id


def _vector_block(doc: str, name: str) -> list[str]:
    match = re.search(rf"<!-- test-vector: {name} -->\n```\n(.*?)```", doc, re.S)
    assert match, f"no test vector {name!r}"
    return match.group(1).splitlines()


class _MT19937:
    """The generator as "Prompts and prompt ids" describes it, written without Python's ``random``."""

    def __init__(self, seed: int) -> None:
        words = [(seed >> (32 * i)) & 0xFFFFFFFF for i in range(max(1, (seed.bit_length() + 31) // 32))]
        mt = [19650218]
        for i in range(1, 624):
            mt.append((1812433253 * (mt[i - 1] ^ (mt[i - 1] >> 30)) + i) & 0xFFFFFFFF)
        i, j = 1, 0
        for _ in range(max(624, len(words))):
            mt[i] = ((mt[i] ^ ((mt[i - 1] ^ (mt[i - 1] >> 30)) * 1664525)) + words[j] + j) & 0xFFFFFFFF
            i, j = i + 1, (j + 1) % len(words)
            if i >= 624:
                mt[0], i = mt[623], 1
        for _ in range(623):
            mt[i] = ((mt[i] ^ ((mt[i - 1] ^ (mt[i - 1] >> 30)) * 1566083941)) - i) & 0xFFFFFFFF
            i += 1
            if i >= 624:
                mt[0], i = mt[623], 1
        mt[0] = 0x80000000
        self.mt, self.at = mt, 624

    def uint32(self) -> int:
        mt = self.mt
        if self.at >= 624:
            for k in range(624):
                y = (mt[k] & 0x80000000) | (mt[(k + 1) % 624] & 0x7FFFFFFF)
                mt[k] = mt[(k + 397) % 624] ^ (y >> 1) ^ (0x9908B0DF if y & 1 else 0)
            self.at = 0
        y = mt[self.at]
        self.at += 1
        y ^= y >> 11
        y ^= (y << 7) & 0x9D2C5680
        y ^= (y << 15) & 0xEFC60000
        return y ^ (y >> 18)

    def below(self, n: int) -> int:
        bits = n.bit_length()
        assert bits <= 32
        while (x := self.uint32() >> (32 - bits)) >= n:
            pass
        return x

    def sample(self, n: int, k: int) -> list[int]:
        setsize = 21 + (4 ** math.ceil(math.log(3 * k, 4)) if k > 5 else 0)
        out: list[int] = []
        if n <= setsize:
            pool = list(range(n))
            for i in range(k):
                j = self.below(n - i)
                out.append(pool[j])
                pool[j] = pool[n - i - 1]
            return out
        while len(out) < k:
            j = self.below(n)
            if j not in out:
                out.append(j)
        return out


def _seed(*parts: object) -> int:
    return int.from_bytes(hashlib.sha256("\x1f".join(map(str, parts)).encode()).digest()[:8], "big") >> 1


def _arith_pairs() -> list[tuple[int, int]]:
    """The default task's training pairs as the document defines them."""
    return [(a, b) for a in range(10, 1000) for b in range(10, 1000) if _seed("arith", a, b) % 10 != 0]


def _prompts_vector(split: str, indices_of: Any, prompt_at: Any) -> list[str]:
    key = "demo-run/7" if split == "horizontal" else f"demo-run/7/{VECTOR_AUTHOR}"
    indices = indices_of(key)
    lines = [f"{split}: key {key}", f"seed {_seed(key)}", f"indices {' '.join(map(str, indices))}"]
    for part, index in enumerate(indices):
        prompt_id, text, answer = prompt_at(index)
        lines.append(f"part {part}: id {prompt_id} text {json.dumps(text)} answer {answer}")
    return lines


def test_sampling_algorithm_as_documented() -> None:
    for key in ("demo-run/7", f"demo-run/7/{VECTOR_AUTHOR}", "x", "run/123456"):
        seed = _seed(key)
        for n, k in ((882050, 8), (882050, 3), (1000, 40), (30, 8), (10, 3), (22, 22), (5, 5)):
            assert _MT19937(seed).sample(n, k) == random.Random(seed).sample(range(n), k), (key, n, k)
    for small in (0, 1, 2**32 - 1, 2**32):
        assert _MT19937(small).sample(100, 5) == random.Random(small).sample(range(100), 5)


def test_prompts_test_vector(doc: str) -> None:
    """The vector, regenerated from the code (the task and ``planned_prompts``) and from the document's own
    description (MT19937 and the arith pair order, written out above)."""
    from dgrpo.config import RolloutConfig
    from dgrpo.round.binding import planned_prompts
    from dgrpo.tasks import get_task

    task = get_task("arith")
    n = RolloutConfig().prompts_per_round
    from_code: list[str] = []
    for split in ("horizontal", "vertical"):
        prompts = iter(planned_prompts(task, RolloutConfig(split=split), "demo-run", VECTOR_AUTHOR, 7))
        from_code += _prompts_vector(
            split,
            lambda key: random.Random(_seed(key)).sample(range(task.num_train), n),
            lambda i, prompts=prompts: (lambda p: (p.id, p.text, p.answer))(next(prompts)),
        )
    pairs = _arith_pairs()
    assert len(pairs) == task.num_train and f"`num_train = {len(pairs)}`" in doc
    assert task.train_prompt(0).id == f"arith/{pairs[0][0]}+{pairs[0][1]}"
    from_doc: list[str] = []
    for split in ("horizontal", "vertical"):
        from_doc += _prompts_vector(
            split,
            lambda key: _MT19937(_seed(key)).sample(len(pairs), n),
            lambda i: (f"arith/{pairs[i][0]}+{pairs[i][1]}", f"{pairs[i][0]}+{pairs[i][1]}=", sum(pairs[i])),
        )
    assert from_code == from_doc
    assert _vector_block(doc, "prompts-arith") == from_code


# ------------------------------------------------------------------------------ reason codes, transport
def test_every_reason_code_is_in_the_reason_table(doc: str) -> None:
    """Every code the code can produce has a row of "Reason codes" with its stage: a code added to the code and
    not documented fails here (the table may list more, e.g. codes other branches are adding)."""
    from dgrpo.net.gossip import OVERSIZE_RPC
    from dgrpo.net.p2p import REFUSED
    from dgrpo.net.transport import DROP_REASONS
    from dgrpo.protocol.train_sync import STATE_REASONS
    from dgrpo.protocol.validator import INTERNAL_ERROR
    from dgrpo.round.admit import ARRIVAL_EVIDENCE, ARRIVAL_REASONS, CLOSE_REASONS, EVIDENCE_REASONS
    from dgrpo.round.binding import ROLLOUT_REASONS, ROUND_REASONS

    header = ["code", "stage", "blacklisting", "when", "`/status`", "`/metrics`"]
    rows = table_after(doc, "## Reason codes", header)
    documented = {(r[0], r[1]): r for r in rows}
    assert len(documented) == len(rows), "a (code, stage) row is repeated"
    by_stage = {
        "validator": (*REASONS, INTERNAL_ERROR),
        "arrival": ARRIVAL_REASONS,
        "close": (*CLOSE_REASONS, *ROLLOUT_REASONS, *ROUND_REASONS),
        "federated": FEDERATED_REASONS,
        "sync": SYNC_REASONS,
        "weights-sync": STATE_REASONS,
        "transport": (*DROP_REASONS, OVERSIZE_RPC, *REFUSED),
    }
    for stage, codes in by_stage.items():
        for code in codes:
            assert (code, stage) in documented, f"reason {code!r} ({stage}) is not in the reason table"
    assert "dgrpo_messages_rejected_total" in documented[(OVERSIZE_RPC, "transport")][5]
    for code in REASONS:
        assert documented[(code, "validator")][2].startswith("no" if code in BENIGN_REASONS else "yes"), code
        assert "dgrpo_messages_rejected_total" in documented[(code, "validator")][5]
    for code in (*ARRIVAL_REASONS, *CLOSE_REASONS, *FEDERATED_REASONS, *SYNC_REASONS, *STATE_REASONS):
        stage = next(s for s in ("arrival", "close", "federated", "sync", "weights-sync") if code in by_stage[s])
        assert "dgrpo_admission_rejected_total" in documented[(code, stage)][5], code
    for code in CLOSE_REASONS:
        assert (documented[(code, "close")][2] == "evidence") == (code in EVIDENCE_REASONS), code
    for code in ARRIVAL_REASONS:
        assert (documented[(code, "arrival")][2] == "yes") == (code in ARRIVAL_EVIDENCE), code
    assert {r[1] for r in rows} <= {*by_stage, "defense"}
    assert "route:foreign_model" in {r[0] for r in rows if r[1] == "defense"}


def test_gossipsub_parameters_and_stack(doc: str) -> None:
    from libp2p.pubsub.gossipsub import PROTOCOL_ID_V11, PROTOCOL_ID_V12

    from dgrpo.net.gossip import GossipConfig
    from dgrpo.protocol.sync import sync_protocol

    defaults = GossipConfig()
    rows = table_after(doc, "### Gossipsub parameters", ["parameter", "default", "notes"])
    assert rows, "no gossipsub parameters"
    for name, default, _ in rows:
        value = getattr(defaults, name)
        assert type(value)(default) == value if not isinstance(value, bool) else default == str(value), name
    stack = {r[0]: r[1] for r in table_after(doc, "### Stack", ["layer", "what a dgrpo node uses"])}
    assert f"`{PROTOCOL_ID_V12}` and `{PROTOCOL_ID_V11}`" in stack["pubsub"]
    assert stack["stream muxer"].startswith("offered in this order: `/yamux/1.0.0`")
    from libp2p.crypto.ed25519 import create_new_key_pair

    from dgrpo.net.gossip import noise_only

    offered = [str(p) for p in noise_only(create_new_key_pair())]
    assert offered == ["/noise"] and stack["security"].startswith("`/noise` only")
    assert f"`{sync_protocol('RUN').replace('RUN', '<run>')}`" in stack["request/response"]
    assert "`from || seqno`" in doc


def test_stack_lists_every_stream_protocol(doc: str) -> None:
    """The request/response row names every stream protocol a node serves or opens besides gossipsub, with the
    ids of the installed py-libp2p (tests/test_protocol_nat_vectors.py checks what a live host registers)."""
    from libp2p.host.autonat.autonat import AUTONAT_PROTOCOL_ID
    from libp2p.host.ping import ID as PING_ID
    from libp2p.identity.identify.identify import ID as IDENTIFY_ID
    from libp2p.identity.identify_push.identify_push import ID_PUSH
    from libp2p.relay.circuit_v2.dcutr import PROTOCOL_ID as DCUTR_ID
    from libp2p.relay.circuit_v2.protocol import PROTOCOL_ID as HOP_ID
    from libp2p.relay.circuit_v2.protocol import STOP_PROTOCOL_ID

    from dgrpo.protocol.manifest_wire import MANIFEST_PROTOCOL

    row = {r[0]: r[1] for r in table_after(doc, "### Stack", ["layer", "what a dgrpo node uses"])}["request/response"]
    named = set(re.findall(r"`(/[^`]+)`", row))
    ids = {IDENTIFY_ID, ID_PUSH, PING_ID, AUTONAT_PROTOCOL_ID, HOP_ID, STOP_PROTOCOL_ID, DCUTR_ID, MANIFEST_PROTOCOL}
    from dgrpo.protocol.train_sync import state_protocol

    own = {sync_protocol("RUN").replace("RUN", "<run>"), state_protocol("RUN").replace("RUN", "<run>")}
    assert named == {str(i) for i in ids} | own
    assert row.endswith("No other stream protocol")


# ------------------------------------------------------------------------------ canonical text, weights digest
EMBEDDED_TOKENIZER_SHA256 = "9016f2d8f65d55c0c28666bdd86dae525f512e68101afc415cf70c714ab469c7"
SPECIAL_TOKENS = ("<pad>", "<bos>", "<eos>", "<unk>")


def _canonical_as_documented(text: str) -> str:
    """The rule of "Canonical text": cut the special-token strings out in one pass, keep LF and U+0020..U+007E."""
    kept = re.split("|".join(map(re.escape, SPECIAL_TOKENS)), text)
    return "".join(c for c in "".join(kept) if c == "\n" or " " <= c <= "~")


def test_the_embedded_tokenizer_is_the_documented_one(doc: str) -> None:
    from dgrpo.learner.models import embedded_models

    folders = embedded_models()
    assert {f"`{name}`" for name in folders} <= set(re.findall(r"`dgrpo:[\w-]+`", doc))
    for folder in folders.values():
        data = (folder / "tokenizer.json").read_bytes()
        assert hashlib.sha256(data).hexdigest() == EMBEDDED_TOKENIZER_SHA256, folder
    assert EMBEDDED_TOKENIZER_SHA256 in doc and f"({len(data)} bytes)" in doc
    spec = json.loads(data)
    vocab = spec["model"]["vocab"]
    expected = {t: i for i, t in enumerate(SPECIAL_TOKENS)} | {"Ġ": 4, "Ċ": 99}
    expected |= {chr(c): c - 28 for c in range(0x21, 0x7F)}
    assert vocab == expected and spec["model"]["merges"] == [] and spec["normalizer"] is None
    assert [t["content"] for t in spec["added_tokens"] if t["special"]] == list(SPECIAL_TOKENS)


def test_canonical_text_vectors(doc: str) -> None:
    """The document's vectors, against the embedded tokenizer's round trip as the learner does it, and the
    document's rule against the tokenizer on random text (so that a receiver can check it without one)."""
    from transformers import AutoTokenizer

    from dgrpo.learner.models import resolve_model

    tokenizer = AutoTokenizer.from_pretrained(resolve_model("dgrpo:tiny-arith"))

    def round_trip(text: str) -> tuple[str, list[int]]:  # Learner.canonical_text
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        return tokenizer.decode(ids, skip_special_tokens=True), list(ids)

    lines = _vector_block(doc, "canonical-text")
    assert len(lines) >= 8
    for line in lines:
        match = re.fullmatch(r'(".*") -> (".*") ids ?([\d ]*)', line)
        assert match, line
        text, canonical = json.loads(match.group(1)), json.loads(match.group(2))
        assert round_trip(text) == (canonical, [int(i) for i in match.group(3).split()]), line
        assert _canonical_as_documented(text) == canonical, line
    rng = random.Random(7)
    alphabet = ["\n", "\t", "\r", " ", "é", "€", "Ġ", "\x00", "\x7f", *SPECIAL_TOKENS, "<", ">", "e", "os"]
    alphabet += [chr(c) for c in range(0x21, 0x7F)]
    for _ in range(2000):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randrange(0, 12)))
        assert _canonical_as_documented(text) == round_trip(text)[0], repr(text)


def test_weights_digest_vectors(doc: str) -> None:
    import struct

    import torch
    from safetensors.torch import load_file

    from dgrpo.config import ModelConfig
    from dgrpo.learner.learner import state_digest
    from dgrpo.learner.models import load_model, resolve_model

    def digest(state: dict[str, torch.Tensor]) -> str:  # the reference, on any state dict
        return state_digest(state)

    lines = _vector_block(doc, "weights-digest")
    state = {"b.bias": torch.tensor([-0.5]), "a.weight": torch.tensor([[1.0, 2.0], [3.0, 4.0]])}
    as_documented = b"a.weight" + struct.pack("<4f", 1, 2, 3, 4) + b"b.bias" + struct.pack("<f", -0.5)
    assert lines[1] == 'bytes "a.weight" 0000803f 00000040 00004040 00008040 "b.bias" 000000bf'
    assert lines[2] == f"sha256 {hashlib.sha256(as_documented).hexdigest()}" == f"sha256 {digest(state)}"
    folder = Path(resolve_model("dgrpo:tiny-arith"))
    loaded = load_model(ModelConfig(name="dgrpo:tiny-arith", device="cpu", dtype="float32")).model
    tensors = load_file(str(folder / "model.safetensors"))
    tensors["lm_head.weight"] = tensors["model.embed_tokens.weight"]  # tied, as the document says
    assert set(tensors) == set(loaded.state_dict())
    from_file = digest(tensors)
    assert lines[3] == f"dgrpo:tiny-arith, initial weights, float32: {from_file}"
    assert digest(loaded.state_dict()) == from_file
    assert hashlib.sha256((folder / "model.safetensors").read_bytes()).hexdigest() in doc
