"""One simulated node: its round pipeline, its end of the in-memory network and its inbox (the runner builds
them; the evaluator reads their learners)."""

from __future__ import annotations

from dataclasses import dataclass

from dgrpo.net.memory import InMemoryTransport
from dgrpo.round.node import Node
from dgrpo.round.receive import RoundInbox


@dataclass
class SimNode:
    node: Node
    transport: InMemoryTransport
    inbox: RoundInbox
    honest: bool = True
