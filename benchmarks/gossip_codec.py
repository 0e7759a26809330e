"""dgrpo's full message stack as a :class:`benchmarks.gossip_probe.Codec`, so ``benchmarks/gossip.py`` can
measure it side by side with bare gossipsub: sign + encode at the publisher, the validator at every hop
(as the daemon installs it), validate + decode at the receiver.

A benchmark payload travels as the completions of a rollout (latin-1 text, cut into completions no longer
than the protocol's limit), so the bytes on the wire are those of a real rollout message of that size.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from benchmarks.gossip_probe import Codec
from dgrpo.protocol.envelope import Signer, decode
from dgrpo.protocol.identity import Identity
from dgrpo.protocol.limits import Limits
from dgrpo.protocol.messages import Rollout, SamplingParams
from dgrpo.protocol.nonce import NonceCounter
from dgrpo.protocol.replay import ReplayGuard
from dgrpo.protocol.validator import MessageValidator

RUN = "bench"


class DgrpoCodec(Codec):
    def __init__(self, key_pair: Any) -> None:
        super().__init__(key_pair)
        self.limits = Limits()
        self.identity = Identity.from_seed(key_pair.private_key.to_bytes()[:32])
        self._state = tempfile.TemporaryDirectory(prefix="dgrpo-bench-")
        self.signer = Signer(self.identity, RUN, NonceCounter(Path(self._state.name) / "nonce.json"))
        self.checker = MessageValidator(RUN, self.limits, ReplayGuard(self.limits.replay_window))
        self.validator = self._validate
        self._round = 0

    def _validate(self, data: bytes, source: str, forwarder: str | None = None) -> bool:
        return self.checker.validate(data, source_peer=source, expected_kind="rollout").ok

    def encode(self, payload: bytes) -> bytes:
        text = payload.decode("latin-1")
        step = self.limits.max_completion_chars
        self._round += 1
        completions = tuple(text[i : i + step] for i in range(0, len(text), step)) or ("",)
        rollout = Rollout(
            author=self.identity.peer_id,
            round=self._round,
            part=0,
            parts=1,
            prompt_id="bench/0",
            prompt="bench",
            completions=completions,
            indices=tuple(range(len(completions))),
            model_id="bench",
            weights="",
            sampling=SamplingParams(),
            split="horizontal",
        )
        return self.signer.sign_rollout(rollout)

    def decode(self, data: bytes, source: str) -> bytes | None:
        # The receiving probe's validator already checked the message (signature, replay, limits) before
        # delivery, exactly as in the daemon; here it is only decoded.
        try:
            envelope = decode(data, self.limits)
        except Exception:
            return None
        body: Any = envelope.body
        return "".join(body.completions).encode("latin-1")
