"""Held-out evaluation of the honest nodes: accuracy, mean completion length and the attack's ASR.

ASR follows "Hail to the Thief" (sec. 5): the fraction of honest models' completions on held-out prompts
that show the injected behaviour, judged by the attack's detector. For MATH only completions that compute
the targeted operation count, on held-out prompts chosen so that they do; for DoS the metric is the mean
completion length. Every honest node is evaluated and the values averaged; nodes with identical weights
(the homogeneous setting) give identical completions under the same seed, so each distinct set of weights is
sampled once.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from dgrpo.adversary.detectors import Detector
from dgrpo.round.observer import RoundObserver
from dgrpo.round.outcome import RoundOutcome
from dgrpo.simulations.sim_node import SimNode
from dgrpo.tasks.base import Prompt


@dataclass(frozen=True)
class EvalPoint:
    accuracy: float
    mean_length: float
    asr: float | None  # None: no attack configured, or no completion counted


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else 0.0


class Evaluator(RoundObserver):
    """Evaluates the honest ``nodes`` every ``every`` rounds and after ``last`` (``points``: (round, point)
    pairs, round 0 included once :meth:`start` ran)."""

    def __init__(
        self,
        prompts: list[Prompt],
        detector: Detector | None,
        asr_prompts: list[Prompt] | None,
        greedy: bool,
        seed: int,
        dedupe: bool,
        nodes: Sequence[SimNode] = (),
        every: int = 5,
        last: int = 0,
        source: Callable[[], list[EvalPoint]] | None = None,
    ) -> None:
        """``source``: where the honest nodes live elsewhere (the Ray engine's actors), their points, in node
        order (each actor runs :meth:`node_points` on its own nodes)."""
        self.prompts = prompts
        self.detector = detector
        self.asr_prompts = asr_prompts  # None: the ASR is read off the accuracy prompts' completions
        self.greedy = greedy
        self.seed = seed
        self.dedupe = dedupe
        self.nodes = list(nodes)
        self.every = every
        self.last = last
        self.source = source
        self.points: list[tuple[int, EvalPoint]] = []

    def start(self) -> None:
        """The evaluation before any training (round 0)."""
        self.points.append((0, self.evaluate()))

    def on_round(self, round_idx: int, outcomes: Sequence[RoundOutcome]) -> None:
        if round_idx % self.every == 0 or round_idx == self.last:
            self.points.append((round_idx, self.evaluate()))

    def evaluate(self) -> EvalPoint:
        return combine(self.source() if self.source is not None else self.node_points(self.nodes))

    def point_at(self, round_idx: int) -> EvalPoint | None:
        return next((p for r, p in reversed(self.points) if r == round_idx), None)

    def _one(self, sim: SimNode) -> EvalPoint:
        node = sim.node
        texts = node.eval_completions(self.prompts, self.greedy, self.seed)
        rewards = [r[0] for r in node.task.rewards_batch([(p, [t]) for p, t in zip(self.prompts, texts, strict=True)])]
        asr = None
        if self.detector is not None:
            asr_texts = texts
            if self.asr_prompts is not None:
                asr_texts = node.eval_completions(self.asr_prompts, self.greedy, self.seed)
            asr = self.detector.value(asr_texts)
        return EvalPoint(_mean(rewards), _mean([float(len(t)) for t in texts]), asr)

    def __call__(self, nodes: list[SimNode]) -> EvalPoint:
        return combine(self.node_points(nodes))

    def node_points(self, nodes: Sequence[SimNode]) -> list[EvalPoint]:
        """One point per honest node, in node order."""
        cache: dict[str, EvalPoint] = {}
        points = []
        for sim in nodes:
            if not sim.honest:
                continue
            key = sim.node.learner.weights_digest() if self.dedupe else ""
            if not key or key not in cache:
                point = self._one(sim)
                if key:
                    cache[key] = point
            else:
                point = cache[key]
            points.append(point)
        return points


def combine(points: Sequence[EvalPoint]) -> EvalPoint:
    """The network's point: the mean over honest nodes."""
    asrs = [p.asr for p in points if p.asr is not None]
    return EvalPoint(
        _mean([p.accuracy for p in points]),
        _mean([p.mean_length for p in points]),
        _mean(asrs) if asrs else None,
    )
