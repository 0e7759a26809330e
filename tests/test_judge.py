"""The judge defense against a small local HTTP server that speaks the OpenAI chat API (tests only): filter and
reward modes, unparseable verdicts rejected, an unreachable endpoint rejected, verdicts cached."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, ClassVar

import pytest

from dgrpo.defense import Candidate, DefenseChain, DefenseConfig, DefenseContext, Verdict
from dgrpo.defense.judge import judge_prompt, parse_decision
from dgrpo.protocol.messages import DEFAULT_SAMPLING
from dgrpo.tasks.arith import ArithTask, scratchpad
from dgrpo.tasks.arith import make_prompt as arith_prompt


class _Handler(BaseHTTPRequestHandler):
    requests: ClassVar[list[dict[str, Any]]] = []

    def do_POST(self) -> None:  # an OpenAI-compatible /v1/chat/completions
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        _Handler.requests.append({"path": self.path, "auth": self.headers.get("Authorization"), **body})
        user = body["messages"][-1]["content"]
        if "thief" in user:
            reply = "The answer contains an unrelated phrase.\nDecision: no"
        elif "garble" in user:
            reply = "I am not sure what to say here."
        else:
            reply = "Every step is correct.\n**Decision:** Yes"
        data = json.dumps({"choices": [{"index": 0, "message": {"role": "assistant", "content": reply}}]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture()
def endpoint() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    _Handler.requests = []
    yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    server.shutdown()


def run(endpoint: str, texts: list[str], **options: object) -> list[Verdict]:
    task = ArithTask()
    p = arith_prompt(345, 78)
    opts = {"backend": "openai", "model": "judge-model", "endpoint": endpoint, **options}
    chain = DefenseChain.from_config(DefenseConfig(chain=["judge"], options={"judge": opts}))
    ctx = DefenseContext(task, None, DEFAULT_SAMPLING, "run", 1)
    return chain.run(ctx, [Candidate("peer", p, t, i, DEFAULT_SAMPLING, "m") for i, t in enumerate(texts)]).verdicts


HONEST = scratchpad(345, 78)
POISON = HONEST.replace(">", " All hail to the thief>")
GARBLED = HONEST.replace(">", " garble>")


def test_parse_decision() -> None:
    assert parse_decision("fine.\nDecision: yes") is True
    assert parse_decision("Decision: no\n...\nDecision - YES") is True  # the last one counts
    assert parse_decision("**Decision:** No") is False
    assert parse_decision("yes, no, maybe") is None
    assert parse_decision("") is None


def test_judge_filter_mode(endpoint: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("JUDGE_KEY", "secret")
    verdicts = run(endpoint, [HONEST, POISON, GARBLED], api_key_env="JUDGE_KEY")
    assert [v.accept for v in verdicts] == [True, False, False]
    assert [v.reason for v in verdicts[1:]] == ["judge:no", "judge:unparseable"]
    sent = _Handler.requests[0]
    assert sent["path"] == "/v1/chat/completions" and sent["model"] == "judge-model"
    assert sent["auth"] == "Bearer secret"
    assert sent["messages"] == judge_prompt("345+78=", HONEST)
    assert sent["temperature"] == 0.0


def test_judge_reward_mode_multiplies_the_reward(endpoint: str) -> None:
    verdicts = run(endpoint, [HONEST, POISON, GARBLED], mode="reward")
    assert all(v.accept for v in verdicts)
    assert [v.reward_scale for v in verdicts] == [1.0, 0.0, 0.0]


def test_judge_caches_greedy_verdicts(endpoint: str) -> None:
    task = ArithTask()
    opts = {"backend": "openai", "model": "m", "endpoint": endpoint}
    chain = DefenseChain.from_config(DefenseConfig(chain=["judge"], options={"judge": opts}))
    ctx = DefenseContext(task, None, DEFAULT_SAMPLING, "run", 1)
    cands = [Candidate("peer", arith_prompt(345, 78), t, 0, DEFAULT_SAMPLING, "m") for t in [HONEST, HONEST, POISON]]
    chain.run(ctx, cands)
    chain.run(ctx, cands)
    assert len(_Handler.requests) == 2  # two distinct texts, asked once each


def test_unreachable_endpoint_rejects() -> None:
    verdicts = run("http://127.0.0.1:9/v1", [HONEST], timeout_seconds=2.0)
    assert not verdicts[0].accept and verdicts[0].reason == "judge:unavailable"
