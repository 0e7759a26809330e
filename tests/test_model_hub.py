"""A hub model id that cannot be fetched fails at once with one line (dgrpo.learner.models.hub_access), not
after some 50 s and 48 lines of huggingface retry warnings."""

from __future__ import annotations

import http.server
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from huggingface_hub import constants

from dgrpo.config import ModelConfig
from dgrpo.errors import ModelNotFoundError
from dgrpo.learner.models import hub_access, hub_unreachable, load_model

CLOSED = "http://127.0.0.1:9"  # the discard port: nothing listens, the connection is refused at once


@pytest.fixture
def offline(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    monkeypatch.setattr(constants, "ENDPOINT", CLOSED)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    return tmp_path / "hub"


def test_an_unreachable_hub_and_an_uncached_model_fail_fast_in_one_line(
    offline: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    t0 = time.monotonic()
    with pytest.raises(ModelNotFoundError) as error:
        load_model(ModelConfig(name="someorg/no-such-model"))
    assert time.monotonic() - t0 < 10
    message = str(error.value)
    assert "\n" not in message and message.startswith("model 'someorg/no-such-model': the hub (http://127.0.0.1:9)")
    assert f"not in the local cache ({offline})" in message and "dgrpo:tiny-arith" in message
    assert "Retrying" not in capfd.readouterr().err


def test_a_cached_model_loads_from_the_cache_when_the_hub_is_unreachable(offline: Path) -> None:
    snapshot = offline / "models--someorg--cached" / "snapshots" / "abc"
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text("{}")
    (offline / "models--someorg--cached" / "refs").mkdir()
    (offline / "models--someorg--cached" / "refs" / "main").write_text("abc")
    assert hub_access("someorg/cached", "someorg/cached") == {"local_files_only": True}


@pytest.fixture
def answering_hub() -> Iterator[str]:
    class NotFound(http.server.BaseHTTPRequestHandler):
        def do_HEAD(self) -> None:
            self.send_response(404)
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), NotFound)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_a_hub_that_answers_is_reachable_whatever_it_answers(answering_hub: str) -> None:
    assert hub_unreachable(answering_hub, 5.0) is None
    assert hub_unreachable(CLOSED, 5.0) is not None
