"""The signed run manifest: canonical bytes and verdicts, the daemon's hold/join rules, serving and fetching
over real libp2p streams, and `dgrpo node join` against real daemon processes (docs/protocol.md, "Run
manifest")."""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio

from dgrpo.daemon.join import join_settings
from dgrpo.daemon.manifest_exchange import ManifestService, fetch_from_address, fetch_verified
from dgrpo.daemon.run_manifest import (
    MANIFEST_FILE,
    create_manifest,
    hold_manifest,
    joining,
    load_manifest,
    run_config,
    settings_from_manifest,
)
from dgrpo.daemon.settings import NodeSettings
from dgrpo.errors import ConfigError
from dgrpo.net.gossip import GossipConfig, GossipNode
from dgrpo.protocol.identity import Identity
from dgrpo.protocol.manifest import (
    DOMAIN_TAG,
    MAX_MANIFEST_BYTES,
    BaseWeights,
    RunManifest,
    SignedManifest,
    canonical_json,
    sign_manifest,
    signing_bytes,
    verify_document,
)
from dgrpo.protocol.manifest_wire import LENGTH_BYTES, MANIFEST_PROTOCOL, REQUEST

DOC = Path(__file__).resolve().parent.parent / "docs" / "protocol.md"
CREATOR = Identity.from_seed(bytes([7]) * 32)
OTHER = Identity.from_seed(bytes([8]) * 32)
BASE = BaseWeights(sha256=hashlib.sha256(b"base").hexdigest(), dtype="float32")
TINY_ARITH_FLOAT32 = "129dd10999fef5dc991745d160762d98433157ae6bb09dcf0bea635a99b891b3"  # docs, weights digest


def manifest(identity: Identity = CREATOR, run_id: str = "run-a", **config: Any) -> SignedManifest:
    body = RunManifest(
        v=1,
        protocol=1,
        run_id=run_id,
        creator=identity.public_bytes.hex(),
        model_id="dgrpo:tiny-arith",
        base_weights=BASE,
        config={"model": {"name": "dgrpo:tiny-arith"}, "learner": {"lr": 5e-05}, **config},
    )
    return sign_manifest(identity, body)


def doc_obj(signed: SignedManifest) -> dict[str, Any]:
    obj: dict[str, Any] = json.loads(signed.document())
    return obj


def reason(data: bytes, **kwargs: Any) -> str:
    return verify_document(data, **kwargs).reason


# ----------------------------------------------------------------- the document
def test_the_documented_vector() -> None:
    match = re.search(r"<!-- test-vector: run-manifest -->\n```\n(.*?)```", DOC.read_text(), re.S)
    assert match, "docs/protocol.md has the run-manifest test vector"
    lines = dict(line.split(" ", 1) for line in match.group(1).splitlines())
    identity = Identity.from_seed(bytes.fromhex(lines["seed"]))
    assert lines["creator"] == f"{identity.public_bytes.hex()} {identity.peer_id}"
    body = RunManifest.model_validate(json.loads(lines["canonical"]))
    assert canonical_json(body.model_dump(mode="json")).decode() == lines["canonical"]
    assert signing_bytes(body) == DOMAIN_TAG + lines["canonical"].encode()
    assert lines["signing"] == f"bytes {len(signing_bytes(body))}"
    signed = sign_manifest(identity, body)
    assert signed.sha256 == lines["sha256"] == hashlib.sha256(signing_bytes(body)).hexdigest()
    assert signed.signature == lines["signature"]
    assert verify_document(signed.document()).ok
    assert body.base_weights.sha256 == hashlib.sha256(b"base").hexdigest()


def test_sign_and_verify() -> None:
    signed = manifest()
    verdict = verify_document(signed.document(), run_id="run-a")
    assert verdict.ok and verdict.manifest == signed
    assert verdict.manifest.manifest.creator_peer_id == CREATOR.peer_id
    assert signed.document() == canonical_json(doc_obj(signed))
    with pytest.raises(ValueError, match="creator"):
        sign_manifest(OTHER, signed.manifest)


@pytest.mark.parametrize(
    ("path", "value"),
    [
        (("run_id",), "run-b"),
        (("creator",), OTHER.public_bytes.hex()),
        (("base_weights", "sha256"), "0" * 64),
        (("base_weights", "dtype"), "bfloat16"),
        (("config", "learner", "lr"), 1e-4),
        (("config", "task"), {"name": "gsm8k"}),
    ],
)
def test_tampering_with_any_field_breaks_the_signature(path: tuple[str, ...], value: Any) -> None:
    obj = doc_obj(manifest())
    node = obj["manifest"]
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    assert reason(canonical_json(obj)) == "bad_signature"


def test_tampering_with_the_model_or_the_signature() -> None:
    obj = doc_obj(manifest())
    obj["manifest"]["model_id"] = obj["manifest"]["config"]["model"]["name"] = "dgrpo:tiny-arith-llama"
    assert reason(canonical_json(obj)) == "bad_signature"
    obj = doc_obj(manifest())
    obj["signature"] = ("1" if obj["signature"][0] == "0" else "0") + obj["signature"][1:]
    assert reason(canonical_json(obj)) == "bad_signature"


def test_one_manifest_per_run_id() -> None:
    pinned = manifest()
    assert verify_document(pinned.document(), pinned=pinned).ok  # the same one, served again
    impostor = manifest(OTHER)  # the same run, content and all, by another key
    assert reason(impostor.document(), pinned=pinned) == "wrong_creator"
    second = manifest(rollout={"completions_per_prompt": 4})  # the creator changed its mind
    assert reason(second.document(), pinned=pinned) == "conflicting_manifest"
    assert reason(second.document(), sha256=pinned.sha256) == "conflicting_manifest"
    assert verify_document(pinned.document(), sha256=pinned.sha256.upper()).ok
    assert reason(manifest(run_id="run-b").document(), pinned=pinned) == "wrong_run_id"
    assert reason(pinned.document(), run_id="run-b") == "wrong_run_id"


def test_hostile_documents_get_a_verdict() -> None:
    good = manifest().document()
    obj = doc_obj(manifest())
    assert reason(b"x" * (MAX_MANIFEST_BYTES + 1)) == "oversize"
    assert reason(b"\xff\xfe") == "malformed"
    assert reason(b"{") == "malformed"
    assert reason(b'{"a":1,"a":2}') == "malformed"
    assert reason(b'{"a":NaN}') == "malformed"
    assert reason(b"[" * 20 + b"]" * 20) == "malformed"
    assert reason(b"[" * 40000) == "malformed"
    assert reason(b'{"a":"\\ud800"}') == "non_canonical"
    assert reason(good.replace(b":", b": ", 1)) == "non_canonical"
    assert reason(json.dumps(obj, sort_keys=False).encode()) == "non_canonical"
    assert reason(b"[]") == "schema"
    assert reason(b"null") == "schema"
    for change in (
        lambda m: m.pop("base_weights"),
        lambda m: m.update(extra=1),
        lambda m: m.update(creator="zz" * 32),
        lambda m: m.update(run_id="no spaces"),
        lambda m: m.update(model_id="dgrpo:tiny-arith-llama"),
        lambda m: m.update(v=True),
        lambda m: m.update(config=[]),
        lambda m: m["base_weights"].update(dtype="int8"),
    ):
        tampered = doc_obj(manifest())
        change(tampered["manifest"])
        assert reason(canonical_json(tampered)) == "schema"
    for key, value in (("v", 2), ("protocol", 2)):
        tampered = doc_obj(manifest())
        tampered["manifest"][key] = value
        assert reason(canonical_json(tampered)) == "version"
    assert reason("not bytes") == "malformed"  # type: ignore[arg-type]


# ----------------------------------------------------------------- the daemon's manifest
def settings(tmp_path: Path, *sets: str) -> NodeSettings:
    from dgrpo.overrides import apply_overrides

    return NodeSettings(**apply_overrides({"state_dir": str(tmp_path), "run_id": "run-a"}, list(sets)))


def test_run_config_is_the_run_defining_part(tmp_path: Path) -> None:
    config = run_config(settings(tmp_path, "status.port=1", "network.listen='/ip4/1.2.3.4/tcp/5'"))
    assert set(config) == {
        *["task", "model", "learner", "sampling", "rollout", "defense", "limits", "federated", "mode"],
        "rounds",
        "federation",
    }
    assert "device" not in config["model"] and set(config["rounds"]) == {
        "deadline_seconds",
        "heartbeat_seconds",
        "max_rounds",
    }
    # local keys do not change it; run keys do
    assert run_config(settings(tmp_path, "torch_threads=4", "adversary.name='text'", "rounds.min_peers=3")) == config
    assert run_config(settings(tmp_path, "rollout.completions_per_prompt=3")) != config


def test_a_creator_creates_keeps_and_replaces(tmp_path: Path) -> None:
    s = settings(tmp_path)
    signed, origin = hold_manifest(s, CREATOR, BASE)
    assert origin == "created" and load_manifest(tmp_path / MANIFEST_FILE) == signed
    assert signed.manifest.config == run_config(s) and signed.manifest.run_id == "run-a"
    assert hold_manifest(s, CREATOR, BASE) == (signed, "kept")
    changed, origin = hold_manifest(settings(tmp_path, "learner.lr=1e-4"), CREATOR, BASE)
    assert origin == "created" and changed.sha256 != signed.sha256
    assert load_manifest(tmp_path / MANIFEST_FILE) == changed


def test_a_joiner_takes_the_creators_manifest_unchanged(tmp_path: Path) -> None:
    creator = create_manifest(settings(tmp_path / "c"), CREATOR, BASE)
    joiner = settings_from_manifest(creator.manifest, [f"state_dir='{tmp_path / 'j'}'", "status.port=0"])
    with joining(creator):
        held, origin = hold_manifest(joiner, OTHER, BASE)
    assert (held, origin) == (creator, "joined")
    assert held.document() == creator.document()
    assert hold_manifest(joiner, OTHER, BASE) == (creator, "kept")  # restarted without `join`
    # ... but the state folder belongs to that run: a node of its own there is an error, not a new run
    with pytest.raises(ConfigError, match=r"holds the manifest of run 'run-a'.*learner\.lr"):
        hold_manifest(settings(tmp_path / "j", "learner.lr=1e-4"), OTHER, BASE)


def test_a_manifest_signed_with_the_old_mode_name_is_still_the_run(tmp_path: Path) -> None:
    # Before the rename the completion exchange's mode was "httt": a run created then, its pinned manifest and
    # its joiners go on (the document is signed: it is read in today's names, never rewritten).
    s = settings(tmp_path)
    old = RunManifest(
        v=1, protocol=1, run_id="run-a", creator=CREATOR.public_bytes.hex(), model_id=s.model.name,
        base_weights=BASE, config={**run_config(s), "mode": "httt"},
    )  # fmt: skip
    signed = sign_manifest(CREATOR, old)
    (tmp_path / MANIFEST_FILE).write_text(signed.document().decode())
    assert s.mode == "completions" and hold_manifest(s, CREATOR, BASE) == (signed, "kept")
    joiner = join_settings(signed, f"/ip4/127.0.0.1/tcp/1/p2p/{CREATOR.peer_id}", [f"state_dir='{tmp_path / 'j'}'"])
    assert joiner.mode == "completions"
    with joining(signed):
        assert hold_manifest(joiner, OTHER, BASE) == (signed, "joined")


def test_a_joiner_whose_base_model_differs_is_refused(tmp_path: Path) -> None:
    creator = create_manifest(settings(tmp_path / "c"), CREATOR, BASE)
    joiner = settings_from_manifest(creator.manifest, [f"state_dir='{tmp_path / 'j'}'"])
    local = BaseWeights(sha256="cd34" + "0" * 60, dtype="float32")
    with joining(creator), pytest.raises(ConfigError) as refused:
        hold_manifest(joiner, OTHER, local)
    assert f"base model weights differ: manifest sha256 {BASE.sha256[:16]}…, local cd34000000000000…" in str(
        refused.value
    )
    assert not (tmp_path / "j" / MANIFEST_FILE).exists()  # nothing pinned by a refused join
    with (
        joining(creator),
        pytest.raises(ConfigError, match="base model dtype differs: manifest float32, local bfloat16"),
    ):
        hold_manifest(joiner, OTHER, BaseWeights(sha256=BASE.sha256, dtype="bfloat16"))
    other_model = settings(tmp_path / "j", "model.name='dgrpo:tiny-arith-llama'")
    with joining(creator), pytest.raises(ConfigError) as refused:
        hold_manifest(other_model, OTHER, local)
    assert 'model.name: manifest "dgrpo:tiny-arith", local "dgrpo:tiny-arith-llama"' in str(refused.value)


def test_join_settings(tmp_path: Path) -> None:
    creator = create_manifest(settings(tmp_path, "rollout.completions_per_prompt=3"), CREATOR, BASE)
    addr = f"/ip4/127.0.0.1/tcp/4001/p2p/{CREATOR.peer_id}"
    joined = join_settings(creator, addr, ["status.port=0", "network.listen='/ip4/0.0.0.0/tcp/0'"])
    assert joined.network.bootstrap == [addr] and joined.run_id == "run-a"
    assert joined.rollout.completions_per_prompt == 3 and joined.status.port == 0
    with pytest.raises(ConfigError, match=r"rollout\.completions_per_prompt: manifest 3, local 2"):
        join_settings(creator, addr, ["rollout.completions_per_prompt=2"])


def test_a_state_folder_pins_its_run(tmp_path: Path) -> None:
    first = create_manifest(settings(tmp_path / "c"), CREATOR, BASE)
    joiner = settings_from_manifest(first.manifest, [f"state_dir='{tmp_path / 'j'}'"])
    with joining(first):
        hold_manifest(joiner, OTHER, BASE)
    second = create_manifest(settings(tmp_path / "c", "learner.lr=1e-4"), CREATOR, BASE)
    with joining(second), pytest.raises(ConfigError, match="conflicting_manifest"):
        hold_manifest(settings_from_manifest(second.manifest, [f"state_dir='{tmp_path / 'j'}'"]), OTHER, BASE)


# ----------------------------------------------------------------- over real libp2p
FAST = {"bootstrap_backoff_initial": 0.05, "bootstrap_backoff_max": 0.2, "shutdown_flush_timeout": 0.5}


@asynccontextmanager
async def two_hosts() -> AsyncIterator[tuple[GossipNode, GossipNode]]:
    async with AsyncExitStack() as stack:
        a = await stack.enter_async_context(GossipNode.open(GossipConfig(**FAST), CREATOR.to_libp2p_keypair()))
        cfg = GossipConfig(**FAST, bootstrap=tuple(a.listen_addrs()))
        b = await stack.enter_async_context(GossipNode.open(cfg, OTHER.to_libp2p_keypair()))
        await b.wait_for_peers(1, timeout=10)
        yield a, b


def test_serve_and_fetch_over_libp2p() -> None:
    signed = manifest()

    async def main() -> None:
        with trio.fail_after(60):
            async with two_hosts() as (a, b):
                served = ManifestService(signed, "created")
                served.serve(a)
                # a joiner from nothing but the address: a throwaway host, the document checked
                verdict = await fetch_from_address(a.listen_addrs()[0], sha256=signed.sha256)
                assert verdict.ok and verdict.manifest is not None
                assert verdict.manifest.document() == signed.document()
                assert (await fetch_from_address(a.listen_addrs()[0], pinned=manifest(OTHER))).reason == "wrong_creator"
                # a running peer's check of its connected peers: b holds the same manifest, then another
                b_service = ManifestService(signed, "joined")
                with trio.move_on_after(1.0):
                    await b_service.audit(b, interval=0.1)
                assert b_service.agreeing == {CREATOR.peer_id}
                conflicting = ManifestService(manifest(rollout={"sampler": "seeded"}), "created")
                conflicting.record(CREATOR.peer_id, await fetch_verified(b, CREATOR.peer_id, pinned=conflicting.signed))
                assert conflicting.snapshot()["rejected_by_peer"] == {CREATOR.peer_id: {"conflicting_manifest": 1}}
                # a request that is not one: counted by the server, answered with a reset
                stream = await b.open_stream(CREATOR.peer_id, MANIFEST_PROTOCOL)
                await stream.write(b"GET /")
                with pytest.raises(Exception):  # noqa: B017 (a reset or EOF, whichever libp2p reports)
                    await stream.read_exactly(LENGTH_BYTES)
                await trio.sleep(0.2)
                assert served.rejections.snapshot() == {OTHER.peer_id: {"bad_request": 1}}
                assert served.served >= 3

    trio.run(main)


def test_a_hostile_server_gets_verdicts() -> None:
    async def main() -> None:
        with trio.fail_after(60):
            async with two_hosts() as (a, b):
                answers: list[bytes] = []

                async def hostile(stream: Any) -> None:
                    await stream.read_exactly(len(REQUEST))
                    await stream.write(answers.pop(0))
                    await stream.close()

                a.serve_streams(MANIFEST_PROTOCOL, hostile)
                good = manifest().document()
                cases = [
                    ((MAX_MANIFEST_BYTES + 1).to_bytes(4, "big"), "oversize"),
                    (len(good).to_bytes(4, "big") + good[:-5], "unavailable"),  # ended early
                    ((5).to_bytes(4, "big") + b"hello", "malformed"),
                    (len(good).to_bytes(4, "big") + good.replace(b"run-a", b"run-x"), "bad_signature"),
                ]
                for answer, expected in cases:
                    answers.append(answer)
                    assert (await fetch_verified(b, CREATOR.peer_id, timeout=5)).reason == expected
                assert (await fetch_verified(b, "12D3KooWnotapeer", timeout=2)).reason == "unavailable"

    trio.run(main)


# ----------------------------------------------------------------- real processes
def dgrpo(*args: str) -> list[str]:
    return [sys.executable, "-m", "dgrpo", *args]


LOCAL = ["--set", "network.listen='/ip4/127.0.0.1/tcp/0'", "--set", "status.port=0"]


@pytest.mark.slow
def test_node_join_against_a_daemon(tmp_path: Path) -> None:
    from dgrpo.daemon.testnet import NetNode, join_command, launch_node, stop_nodes, tcp_address, wait_until

    fast = ["rounds.deadline_seconds=20", "rounds.peer_timeout_seconds=6", "rollout.prompts_per_round=4"]
    creator = launch_node(0, 2, tmp_path, None, [], extra=fast)  # waits for one peer before its first round
    nodes = [creator]
    try:
        addr = tcp_address(creator)
        created = load_manifest(creator.state_dir / MANIFEST_FILE)
        assert created is not None and created.manifest.creator_peer_id == creator.peer_id
        assert join_command(creator) == f"dgrpo node join {addr} --manifest-sha256 {created.sha256}"
        # refused before the model loads: an override of a run key
        other_model = ["--set", "model.name='dgrpo:tiny-arith-llama'"]
        refused = subprocess.run(
            dgrpo("node", "join", addr, "--state-dir", str(tmp_path / "r"), *LOCAL, *other_model),
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert refused.returncode == 2, refused.stdout + refused.stderr
        assert 'model.name: manifest "dgrpo:tiny-arith", local "dgrpo:tiny-arith-llama"' in " ".join(
            refused.stdout.split()
        )
        # a joiner that is told nothing but the address (and a pin), and plays the run
        state = tmp_path / "joiner"
        state.mkdir()
        log = open(state / "node.log", "wb")  # noqa: SIM115
        cmd = dgrpo("node", "join", addr, "--state-dir", str(state), *LOCAL, "--manifest-sha256", created.sha256)
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        joiner = NetNode(1, state, proc, "")
        nodes.append(joiner)
        wait_until(lambda: (joiner.status() or {}).get("rounds_done", 0) >= 1, 240, "a round on the joiner")
        status = joiner.status()
        assert status is not None and status["manifest"]["origin"] == "joined"
        assert status["manifest"]["sha256"] == created.sha256 and status["run_id"] == "testnet"
        assert status["manifest"]["base_weights_sha256"] == TINY_ARITH_FLOAT32
        saved = load_manifest(state / MANIFEST_FILE)
        assert saved is not None and saved.document() == created.document()
        wait_until(
            lambda: status["peer_id"] in (creator.status() or {}).get("manifest", {}).get("agreeing_peers", []),
            30,
            "the creator to find the joiner's manifest its own",
        )
        assert (creator.status() or {})["manifest"]["rejected_by_peer"] == {}
        # `node run --bootstrap` with no run flag learns the run the same way
        state = tmp_path / "runner"
        state.mkdir()
        log = open(state / "node.log", "wb")  # noqa: SIM115
        cmd = dgrpo("node", "run", "--bootstrap", addr, "--state-dir", str(state), *LOCAL)
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        runner = NetNode(2, state, proc, "")
        nodes.append(runner)
        wait_until(lambda: (runner.status() or {}).get("rounds_done", 0) >= 1, 240, "a round on the runner")
        status = runner.status()
        assert status is not None and status["manifest"]["origin"] == "joined" and status["run_id"] == "testnet"
        assert status["manifest"]["sha256"] == created.sha256
    finally:
        assert stop_nodes(nodes), "every daemon exits 0 on SIGTERM"


@pytest.mark.slow
def test_node_join_refuses_other_base_weights(tmp_path: Path) -> None:
    """A manifest naming the embedded model but other base weights (as a creator with other local files would
    sign): the joiner loads its model, compares, and refuses with both digests."""
    from dgrpo.daemon.run_manifest import create_manifest as create

    s = settings(tmp_path / "c", "network.listen='/ip4/127.0.0.1/tcp/0'")
    signed = create(s, CREATOR, BaseWeights(sha256="ab12" + "0" * 60, dtype="float32"))
    result: dict[str, Any] = {}

    async def main() -> None:
        with trio.fail_after(200):
            async with GossipNode.open(GossipConfig(**FAST), CREATOR.to_libp2p_keypair()) as a:
                ManifestService(signed, "created").serve(a)
                cmd = dgrpo("node", "join", a.listen_addrs()[0], "--state-dir", str(tmp_path / "j"), *LOCAL)
                env = {**os.environ, "COLUMNS": "400"}
                result["proc"] = await trio.run_process(
                    cmd, capture_stdout=True, capture_stderr=True, check=False, env=env
                )

    trio.run(main)
    proc = result["proc"]
    out = " ".join(proc.stdout.decode().split())
    assert proc.returncode == 2, out + proc.stderr.decode()
    assert f"base model weights differ: manifest sha256 ab12000000000000…, local {TINY_ARITH_FLOAT32[:16]}…" in out
    assert not (tmp_path / "j" / MANIFEST_FILE).exists()
