"""Every shipped scenario is healthy at its defaults (issue 44): run without its attacker (the honest baseline:
``nodes.malicious = 0``; a federated one without ``[federated.attack]``) for a few rounds, its held-out accuracy
does not fall beyond noise. A scenario whose honest nodes collapse on their own makes every attack and defense
number measured with it meaningless: `text-horizontal` at lr 5e-4 went 0.445 -> 0.008 in 10 rounds with no
attacker at all (it now ships 2e-4; this test fails at 5e-4: 0.445 -> 0.016 in its 6 rounds).

Parametrized from the scenario folder, so that a new scenario is covered without editing this file. The
scenarios on the embedded tiny models and the arith task run in the fast tier (a few seconds each); those
that run programs in the sandbox (arith-code) or a federation (5 clients x 5 local steps a round) in the slow
tier. Not run here: ``paper-*`` (a 1.5B model: a GPU and the hub) and ``gym-*`` (SmolLM2-135M on the CPU,
about 4 minutes a round here: docs/results.md, "A real model").
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from dgrpo.simulations.runner import run_simulation
from dgrpo.simulations.scenario import SCENARIO_DIR, Scenario, load_scenario

EVAL_PROMPTS = 128  # held-out prompts: two standard errors of a difference are about 0.12 at accuracy 0.5
FAST_ROUNDS = 6  # text-* at lr 5e-4 fell from 0.445 to 0.09 by round 2 (64 prompts)
SLOW_ROUNDS = 10
# 5 clients x 5 local steps a round. SGD momentum at the shipped step overshoots at first (fed-grpo-skewed on
# 1,024 prompts: 0.496 -> 0.331 at round 2 -> 0.570 at round 6 -> 0.728 at 12): the check reads round 6.
FEDERATED_ROUNDS = 6

NOT_HERE = {
    "paper-": "paper scale (Qwen2.5-1.5B): needs a GPU and the hub",
    "gym-": "SmolLM2-135M-Instruct on the CPU takes about 4 minutes a round here (docs/results.md, 'A real model')",
}
# Scenarios that reproduce a method's failure on purpose: the check runs and reports them, without failing.
UNHEALTHY_BY_DESIGN = {
    "fgrpo-skewed": "FGRPO's relative-gain weighting gives the noisy client the most weight and backfires on this "
    "federation (docs/federated.md: below FedAvg on every seed, collapsed on 2 of 8); here 0.461 -> 0.305 by round 6 "
    "on 128 prompts (0.496 -> 0.362 at round 4 -> 0.640 at round 12 on 1,024)",
}


def honest_baseline(name: str) -> tuple[Scenario, str]:
    """The shipped scenario ``name`` without its attackers, shortened to a few rounds; and its tier (fast or
    slow)."""
    shipped = load_scenario(Path(name))
    if shipped.federated is not None:
        rounds, tier = FEDERATED_ROUNDS, "slow"
        honest = ["federated.attack=null"] if shipped.federated.attack is not None else []
    else:
        fast = shipped.task.name == "arith" and shipped.model.name.startswith("dgrpo:")
        rounds, tier = (FAST_ROUNDS, "fast") if fast else (SLOW_ROUNDS, "slow")
        honest = ["nodes.malicious=0"]
    # no snapshots (nothing here resumes); an evaluation at the start and at the end only
    overrides = [
        *honest,
        f"rounds={rounds}",
        f"eval.every={rounds}",
        f"eval.prompts={EVAL_PROMPTS}",
        "checkpoint_every=0",
    ]
    if shipped.learner.lr_schedule != "constant":
        overrides.append(f"learner.lr_rounds={shipped.lr_rounds()}")  # the shipped run's first rounds, same lr
    return load_scenario(Path(name), overrides), tier


def _params() -> list[object]:
    params: list[object] = []
    for path in sorted(SCENARIO_DIR.glob("*.toml")):
        name = path.stem
        reason = next((why for prefix, why in NOT_HERE.items() if name.startswith(prefix)), None)
        if reason is not None:
            params.append(pytest.param(name, marks=pytest.mark.skip(reason=reason), id=name))
            continue
        _, tier = honest_baseline(name)
        marks = [pytest.mark.slow] if tier == "slow" else []
        if name in UNHEALTHY_BY_DESIGN:
            # not strict: the dip's depth depends on the machine's build of the model (docs/results.md)
            marks.append(pytest.mark.xfail(reason=UNHEALTHY_BY_DESIGN[name], strict=False))
        params.append(pytest.param(name, marks=marks, id=name))
    return params


def noise(initial: float, final: float, prompts: int) -> float:
    """Two standard errors of the difference between two accuracies, each on ``prompts`` held-out prompts (a
    reward in [0, 1] has at most the binomial variance p (1 - p))."""
    return 2.0 * math.sqrt((initial * (1.0 - initial) + final * (1.0 - final)) / prompts)


def header(path: Path) -> list[str]:
    """The comment lines that open a scenario file, without their ``#``."""
    lines = []
    for line in path.read_text().splitlines():
        if not line.startswith("#"):
            break
        lines.append(line.lstrip("#").strip())
    return lines


def test_every_attack_scenario_says_what_to_expect() -> None:
    """Line 1 of every header is its one-line summary (`dgrpo scenarios` lists it); an attack scenario that runs
    here also says what a user should see (an ``Expect:`` line, measured): the paper-* ones are not measured here."""
    missing = []
    for path in sorted(SCENARIO_DIR.glob("*.toml")):
        lines = header(path)
        if not lines or not lines[0]:
            missing.append(f"{path.name}: no one-line summary on line 1")
            continue
        sc = load_scenario(path)
        attacked = sc.nodes.malicious > 0 or (sc.federated is not None and sc.federated.attack is not None)
        if attacked and not path.stem.startswith("paper-") and not any(x.startswith("Expect:") for x in lines):
            missing.append(f"{path.name}: an attack scenario whose header has no 'Expect:' line")
    assert not missing, missing


@pytest.mark.parametrize("name", _params())
def test_honest_accuracy_does_not_fall_at_the_shipped_defaults(name: str, tmp_path: Path) -> None:
    scenario, _ = honest_baseline(name)
    summary = run_simulation(scenario, tmp_path / name)
    (r0, initial), (r1, final) = summary.accuracy[0], summary.accuracy[-1]
    assert r0 == 0 and r1 == scenario.rounds
    allowed = noise(initial, final, EVAL_PROMPTS)
    assert final >= initial - allowed, (
        f"{name}: honest held-out accuracy {initial:.3f} -> {final:.3f} in {scenario.rounds} rounds, a fall of "
        f"{initial - final:.3f} beyond noise ({allowed:.3f}, two standard errors on {EVAL_PROMPTS} prompts); "
        f"check its [learner] lr (docs/results.md)"
    )
