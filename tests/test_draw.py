"""The draw stage (``dgrpo/round/draw.py``) and seniority (``dgrpo/defense/seniority.py``): bounded work per
node and a cap on what fresh identities can take, with numbers worked out by hand."""

from __future__ import annotations

import random
import statistics

import pytest

from dgrpo.defense.seniority import Seniority
from dgrpo.protocol.messages import DEFAULT_SAMPLING, Rollout
from dgrpo.round.draw import DrawRules, draw, private_rng, young_cap
from dgrpo.round.outcome import Admitted
from dgrpo.tasks.base import Prompt

ME = "me"


def admitted(author: str, prompt: str, n: int, part: int = 0) -> Admitted:
    rollout = Rollout(
        author=author, round=1, part=part, parts=8, prompt_id=prompt, prompt=prompt, completions=tuple(
            f"{author}-{prompt}-{i}" for i in range(n)
        ), indices=tuple(range(10, 10 + n)), model_id="m", weights="", sampling=DEFAULT_SAMPLING, split="horizontal",
    )  # fmt: skip
    return Admitted(rollout, Prompt(prompt, prompt, "0"))


class FixedRng(random.Random):
    """``random()`` returns the given values in turn (the keyed draw takes one per peer rollout, in order)."""

    def __init__(self, values: list[float]) -> None:
        super().__init__(0)
        self.values = list(values)

    def random(self) -> float:  # then the seeded generator's (which of a capped rollout's completions are taken)
        return self.values.pop(0) if self.values else super().random()


class Counting(random.Random):
    """Counts the uniform numbers drawn (``Counting.calls``, reset by the test): what a draw path costs."""

    calls = 0

    def random(self) -> float:
        Counting.calls += 1
        return super().random()


def texts(result: object) -> list[str]:
    return [t for a in result.admitted for t in a.rollout.completions]  # type: ignore[attr-defined]


def test_without_a_bound_everything_is_kept() -> None:
    rounds = [admitted(ME, "p1", 2), admitted("a", "p1", 2), admitted("b", "p1", 3)]
    out = draw(rounds, ME, DrawRules(external=None), lambda _: 1.0, lambda _: False, random.Random(0))
    assert out.admitted == tuple(rounds)
    assert (out.offered, out.drawn, out.young_drawn, out.full) == (5, 5, 0, True)
    assert out.by_author == {"a": 2, "b": 3}


def test_keys_order_the_draw_and_caps_skip() -> None:
    # peers' rollouts in admitted order: a (3 completions), b (2), y (2), z (1); y, z young; weights 1: key = u
    rounds = [admitted(ME, "p1", 2), admitted("a", "p1", 3), admitted("b", "p1", 2), admitted("y", "p1", 2)]
    rounds.append(admitted("z", "p2", 1))
    u = [0.50, 0.95, 0.99, 0.60]
    rules = DrawRules(external=4, per_author=2, young_share=0.25)  # young cap floor(4 * 0.25) = 1
    out = draw(rounds, ME, rules, lambda _: 1.0, lambda p: p in ("y", "z"), FixedRng(u))
    # by key: y .99 (young: room 1, the cap, so one of its two), b .95 (room 2: whole), z .60 (young cap reached:
    # skipped), a .50 (room 1 of J left: one of its three, per_author would have allowed 2)
    assert (out.offered, out.drawn, out.young_drawn, out.full) == (8, 4, 1, True)
    assert out.by_author == {"y": 1, "b": 2, "a": 1}
    assert [a.rollout.author for a in out.admitted] == [ME, "a", "b", "y"]  # the admitted order
    assert texts(out)[:2] == ["me-p1-0", "me-p1-1"] and texts(out)[3:5] == ["b-p1-0", "b-p1-1"]
    # a drawn completion keeps its own index (the plan binding and the sampling proof judge it as before)
    for drawn in (out.admitted[1].rollout, out.admitted[3].rollout):
        assert len(drawn.completions) == 1
        assert drawn.indices[0] == 10 + int(drawn.completions[0].rsplit("-", 1)[1])
    assert out.admitted[2] is rounds[2]  # a whole rollout is not copied


def test_which_completions_a_capped_draw_keeps_is_drawn_too() -> None:
    # One author, capped at 2 of its 4: the two taken are the private randomness's choice, not the first two
    # (an author cannot put the answers it wants trained on first); every pair turns up over seeds.
    rounds = [admitted("a", "p1", 4)]
    seen = set()
    for s in range(200):
        out = draw(rounds, ME, DrawRules(external=8, per_author=2), lambda _: 1.0, lambda _: False, random.Random(s))
        assert out.drawn == 2
        seen.add(out.admitted[0].rollout.indices)
    assert seen == {(10, 11), (10, 12), (10, 13), (11, 12), (11, 13), (12, 13)}


def test_per_author_cap_and_short_rounds() -> None:
    rounds = [admitted("a", "p1", 5)]
    out = draw(rounds, ME, DrawRules(external=4, per_author=2), lambda _: 1.0, lambda _: False, random.Random(1))
    assert out.drawn == 2 and out.by_author == {"a": 2} and not out.full  # one author can give only 2


def test_weights_bias_the_draw() -> None:
    # Efraimidis-Spirakis: weight 1 against 1/6, one completion each, one drawn: P(heavy) = 6 / 7
    rounds = [admitted("heavy", "p1", 1), admitted("light", "p1", 1)]
    rules = DrawRules(external=1, per_author=1, young_share=1.0)
    weights = {"heavy": 1.0, "light": 1 / 6}
    wins = sum(
        draw(rounds, ME, rules, weights.__getitem__, lambda _: False, random.Random(s)).by_author.get("heavy", 0)
        for s in range(4000)
    )
    assert wins / 4000 == pytest.approx(6 / 7, abs=0.02)


def test_young_cap() -> None:
    assert [young_cap(j, 0.25) for j in (0, 1, 3, 4, 7, 8, 16)] == [0, 0, 0, 1, 1, 2, 4]
    assert young_cap(10, 0.3) == 3  # not 2 from 2.9999999999999996


def test_private_rng_is_the_nodes_own_and_per_round() -> None:
    assert private_rng(b"k1", 3).random() == private_rng(b"k1", 3).random()
    assert private_rng(b"k1", 3).random() != private_rng(b"k2", 3).random()
    assert private_rng(b"k1", 3).random() != private_rng(b"k1", 4).random()


def test_seniority_counts_rounds_of_verified_work() -> None:
    s = Seniority(young_rounds=3, max_authors=2)
    assert s.young("x") and s.weight("x") == pytest.approx(1 / 4)
    s.credit(1, ["x", "x"])
    s.credit(1, ["x"])  # once per round
    assert s.rounds("x") == 1 and s.weight("x") == pytest.approx(2 / 4)
    s.credit(2, ["x"])
    assert not s.has_seniors()
    s.credit(3, ["x"])
    assert s.rounds("x") == 3 and not s.young("x") and s.weight("x") == 1.0 and s.has_seniors()
    s.credit(4, ["x"])
    assert s.weight("x") == 1.0  # capped at K
    s.credit(5, ["y"])
    s.credit(6, ["z"])  # x, credited least recently, is forgotten: young again
    assert s.rounds("x") == 0 and s.young("x")
    restored = Seniority(3)
    restored.load({**s.to_dict(), "bad": "entry"})
    assert restored.snapshot() == {"y": 1, "z": 1}


@pytest.mark.parametrize("sybils", [10, 50])
def test_fresh_identities_take_at_most_the_young_share_whatever_their_number(sybils: int) -> None:
    """3 honest peers (senior) and ``sybils`` fresh identities, every one with 8 completions a round; the
    node draws J = 16. Sybils never earn seniority (their completions are junk: no positive reward). Over 200
    rounds their share of the draw stays within the cap, 0.25; without the cap it is far above it (this test
    fails without the young-share rule)."""
    honest = [f"h{i}" for i in range(3)]
    fresh = [f"s{i}" for i in range(sybils)]
    rounds = [admitted(a, f"p{k}", 2, part=k) for a in honest + fresh for k in range(4)]
    seniority = Seniority(young_rounds=5)
    for r in range(5):
        seniority.credit(r, honest)

    def shares(rules: DrawRules) -> list[float]:
        out = []
        for r in range(200):
            d = draw(rounds, ME, rules, seniority.weight, seniority.young, private_rng(b"node", r))
            out.append(sum(n for a, n in d.by_author.items() if a in fresh) / d.drawn)
        return out

    capped = shares(DrawRules(external=16, per_author=4, young_share=0.25))
    assert max(capped) <= 0.25
    uncapped = shares(DrawRules(external=16, per_author=4, young_share=1.0))
    assert statistics.mean(uncapped) > 0.3, "without the cap the Sybils' share is above it"


def test_young_authors_top_up_where_seniors_offer_too_few() -> None:
    # At the start of a run everyone is young: the cap (1 of 4) would leave 3 places empty; the second pass, in
    # key order, fills them from the young authors' skipped completions.
    rounds = [admitted("y", "p1", 3), admitted("z", "p1", 3)]
    rules = DrawRules(external=4, per_author=3, young_share=0.25)
    out = draw(rounds, ME, rules, lambda _: 1.0, lambda _: True, FixedRng([0.9, 0.8]))
    # pass 1: y .9, one completion (the cap); z skipped. Pass 2 in key order: y's other two, then one of z's
    assert out.by_author == {"y": 3, "z": 1} and (out.drawn, out.young_drawn, out.full) == (4, 4, True)
    assert texts(out)[:3] == ["y-p1-0", "y-p1-1", "y-p1-2"]
    # one senior offering 2 of the 3 places the cap leaves: a node that knows no senior tops up from the young
    rounds = [admitted("s", "p1", 2), *rounds]
    u = [0.3, 0.9, 0.8]  # s y z
    out = draw(rounds, ME, rules, lambda _: 1.0, lambda a: a != "s", FixedRng(u))
    # pass 1: y 1 (the cap), z skipped, s 2; pass 2: y one more
    assert out.by_author == {"y": 2, "s": 2} and out.young_drawn == 2
    # ... and one that knows a senior never does: 3 of 4, the young within their cap of 1
    out = draw(rounds, ME, rules, lambda _: 1.0, lambda a: a != "s", FixedRng(u), top_up=False)
    assert out.by_author == {"s": 2, "y": 1} and out.young_drawn == 1 and (out.drawn, out.full) == (3, False)


def crowd(seniors: int, youngs: int, n: int = 2) -> list[Admitted]:
    rounds = [admitted(ME, "p1", n)]
    rounds += [admitted(f"s{k}", "p1", n) for k in range(seniors)]
    rounds += [admitted(f"y{k}", "p1", n) for k in range(youngs)]
    return sorted(rounds, key=lambda a: (a.rollout.prompt_id, a.rollout.author))


def test_sampling_and_keying_draw_alike(monkeypatch: pytest.MonkeyPatch) -> None:
    """Far more offered than drawn, the draw samples (O(J)) instead of keying every completion; the two paths
    are the same successive weighted sampling without replacement: the same shares, within noise."""
    import dgrpo.round.draw as module

    rounds = crowd(20, 20)  # 80 peers' completions, J = 8: the sampling path
    weights = {f"s{k}": 1.0 for k in range(20)} | {f"y{k}": 1 / 6 for k in range(20)}
    rules = DrawRules(external=8, per_author=2, young_share=1.0)

    def heavy_share() -> float:
        runs = [
            draw(rounds, ME, rules, weights.__getitem__, lambda _: False, random.Random(s), per_rollout=2)
            for s in range(400)
        ]
        assert all(r.drawn == 8 for r in runs)
        return statistics.fmean(sum(v for a, v in r.by_author.items() if a[0] == "s") / 8 for r in runs)

    sampled = heavy_share()
    monkeypatch.setattr(module, "SCAN_FACTOR", 10**6)  # force the keyed pass
    keyed = heavy_share()
    # By hand, the first draw is heavy with probability 40 / (40 + 40 / 6) = 6 / 7 = 0.857; later ones a little
    # less as heavy completions are used up: both paths land near 0.85.
    assert 0.80 < sampled < 0.90 and 0.80 < keyed < 0.90
    assert abs(sampled - keyed) < 0.03


def test_a_crowd_of_young_authors_stays_capped_on_the_sampling_path() -> None:
    # 100 young authors and one senior with 2 completions: J = 8, young cap 2. The senior's 2 and 2 young ones
    # are drawn, no more (a node that knows a senior never tops up from the young).
    rounds = crowd(1, 100)
    for s in range(50):
        out = draw(
            rounds, ME, DrawRules(external=8, per_author=4, young_share=0.25), lambda _: 1.0,
            lambda a: a.startswith("y"), random.Random(s), top_up=False, per_rollout=2,
        )  # fmt: skip
        assert out.young_drawn == 2 and out.by_author.get("s0") == 2 and out.drawn == 4 and not out.full


def test_a_node_that_knows_no_senior_samples_uncapped() -> None:
    # The start of a run: 40 young authors, nobody senior. The keyed pass would take the cap's 2 and top up to 8
    # from the same order; the sampling path, told that everyone is young, draws the 8 directly, as many per
    # author as the rules allow, every one young.
    rounds = crowd(0, 40)
    for s in range(20):
        out = draw(
            rounds, ME, DrawRules(external=8, per_author=1, young_share=0.25), lambda _: 1 / 6, lambda _: True,
            random.Random(s), per_rollout=2, everyone_young=True,
        )  # fmt: skip
        assert (out.drawn, out.young_drawn, out.full) == (8, 8, True) and max(out.by_author.values()) == 1


def test_the_weight_bound_keeps_the_distribution_and_cuts_rejections() -> None:
    # 20 authors at weight 1/6 and 20 at 2/6 (one round earned), 2 completions each; J = 8, uncapped. Told the
    # bound 2/6 the sampling path keeps a sample with probability w / (2/6): 1/2 and 1, the same ratio as 1/6 to
    # 2/6, so the heavier authors' share is the same with and without the bound (by hand, the first draw is
    # heavy with probability 40 * 2 / (40 * 2 + 40 * 1) = 2/3), with fewer random numbers drawn.
    heavy = {f"h{i}" for i in range(20)}
    rounds = [admitted(a, "p1", 2) for a in sorted(heavy | {f"l{i}" for i in range(20)})]
    weight = lambda a: 2 / 6 if a in heavy else 1 / 6  # noqa: E731
    rules = DrawRules(external=8, per_author=2, young_share=0.25)

    share, tries = {}, {}
    for bound in (1.0, 2 / 6):
        got = []
        Counting.calls = 0
        for s in range(400):
            out = draw(
                rounds, ME, rules, weight, lambda _: True, Counting(s), per_rollout=2, everyone_young=True,
                max_weight=bound,
            )  # fmt: skip
            assert out.drawn == 8
            got.append(sum(n for a, n in out.by_author.items() if a in heavy) / 8)
        share[bound], tries[bound] = statistics.mean(got), Counting.calls / 400
    assert 0.60 < share[1.0] < 0.72 and 0.60 < share[2 / 6] < 0.72
    assert abs(share[1.0] - share[2 / 6]) < 0.04
    # by hand: a sample is kept with probability 1/4 on average without the bound, 3/4 with it
    assert tries[2 / 6] < 0.5 * tries[1.0], tries


def test_seniority_bounds_every_weight() -> None:
    s = Seniority(young_rounds=5, max_authors=2)
    assert s.max_weight() == 1 / 6  # nobody credited: everyone fresh
    for r in range(3):
        s.credit(r, ["a"])
    s.credit(3, ["b"])
    assert s.max_weight() == 4 / 6 == s.weight("a")
    s.credit(4, ["c"])  # max_authors 2: "a" is forgotten, the bound stays (an upper bound, never too low)
    assert s.weight("a") == 1 / 6 and s.max_weight() == 4 / 6
    for r in range(5, 12):
        s.credit(r, ["b"])
    assert s.max_weight() == 1.0


def test_has_seniors_is_counted_exactly_through_credits_forgetting_and_restore() -> None:
    """``has_seniors`` runs every round, so it is a counter rather than a scan over up to 10,000 authors; it
    must agree with the scan whatever the credits, the forgetting of the least recently credited, and a
    restore from a checkpoint."""
    rng = random.Random(7)
    for k in (0, 1, 3):
        seniority = Seniority(young_rounds=k, max_authors=6)
        for round_idx in range(60):
            seniority.credit(round_idx, rng.sample([f"a{i}" for i in range(12)], rng.randrange(0, 4)))
            if rng.random() < 0.2:  # credited twice in one round: counts once
                seniority.credit(round_idx, ["a0"])
            scan = any(earned >= k for earned in seniority.snapshot().values())
            assert seniority.has_seniors() == scan
            restored = Seniority(young_rounds=k, max_authors=6)
            restored.load(seniority.to_dict())
            assert restored.has_seniors() == scan


def test_a_drawn_subset_of_a_rollout_equals_a_validated_copy() -> None:
    r = Rollout(
        author="a", round=3, part=1, parts=8, prompt_id="p", prompt="x", completions=("u", "v", "w"),
        indices=(4, 5, 6), model_id="m", weights="", sampling=DEFAULT_SAMPLING, split="horizontal",
    )  # fmt: skip
    sub = r.subset([2, 0])
    assert (sub.completions, sub.indices) == (("w", "u"), (6, 4))
    assert sub == Rollout.model_validate({**r.model_dump(), "completions": ("w", "u"), "indices": (6, 4)})
    assert (r.completions, r.indices) == (("u", "v", "w"), (4, 5, 6))  # the original is untouched
    with pytest.raises(ValueError):
        sub.round = 4  # type: ignore[misc]  # still frozen
    assert sub.model_dump()["completions"] == ("w", "u")


def by_weight(rounds: list[Admitted], weight: object) -> dict[float, tuple[int, ...]]:
    """What the admit stage indexes for the draw: peers' rollouts (positions) by their author's weight."""
    index: dict[float, list[int]] = {}
    for k, a in enumerate(rounds):
        if a.rollout.author != ME:
            index.setdefault(weight(a.rollout.author), []).append(k)  # type: ignore[operator]
    return {w: tuple(ks) for w, ks in index.items()}


def test_sampling_by_weight_class_draws_as_the_keys_do(monkeypatch: pytest.MonkeyPatch) -> None:
    """The admit stage's index by weight lets the sampling path pick a class in proportion to its total weight
    and a rollout in it uniformly: the same draw as keying every completion (by hand the first draw is heavy with
    probability 6/7, later ones a little less), with no rejection by weight."""
    import dgrpo.round.draw as module

    rounds = crowd(20, 20)
    weights = {f"s{k}": 1.0 for k in range(20)} | {f"y{k}": 1 / 6 for k in range(20)}
    index = by_weight(rounds, weights.__getitem__)
    rules = DrawRules(external=8, per_author=2, young_share=1.0)

    def heavy_share(**extra: object) -> float:
        runs = [
            draw(rounds, ME, rules, weights.__getitem__, lambda _: False, Counting(s), per_rollout=2, **extra)  # type: ignore[arg-type]
            for s in range(400)
        ]
        assert all(r.drawn == 8 for r in runs)
        return statistics.fmean(sum(v for a, v in r.by_author.items() if a[0] == "s") / 8 for r in runs)

    Counting.calls = 0
    classes = heavy_share(by_weight=index)
    assert Counting.calls / 400 < 3 * 8 * 1.3  # three numbers a try, few tries lost (per-author cap, duplicates)
    monkeypatch.setattr(module, "SCAN_FACTOR", 10**6)
    keyed = heavy_share()
    assert 0.80 < classes < 0.90 and abs(classes - keyed) < 0.03


def test_a_young_crowd_costs_no_tries_once_the_cap_is_full(monkeypatch: pytest.MonkeyPatch) -> None:
    # 200 young authors beside one senior: once 2 young are drawn (the cap), the young classes leave the pool and
    # the senior's 2 complete the draw; no keyed pass over the 400 offered completions follows.
    import dgrpo.round.draw as module

    scan = module._DrawState.scan
    keyed: list[int] = []

    def counted(self: module._DrawState, me: str, rng: random.Random, top_up: bool, positions: object = None) -> None:
        keyed.append(len(self.admitted) if positions is None else len(positions))  # type: ignore[arg-type]
        scan(self, me, rng, top_up, positions)  # type: ignore[arg-type]

    monkeypatch.setattr(module._DrawState, "scan", counted)
    rounds = crowd(1, 200)
    weight = lambda a: 1.0 if a == "s0" else 1 / 6  # noqa: E731
    index = by_weight(rounds, weight)
    for s in range(50):
        out = draw(
            rounds, ME, DrawRules(external=8, per_author=4, young_share=0.25), weight, lambda a: a.startswith("y"),
            random.Random(s), top_up=False, per_rollout=2, by_weight=index,
        )  # fmt: skip
        assert out.young_drawn == 2 and out.by_author.get("s0") == 2 and out.drawn == 4 and not out.full
    assert keyed and max(keyed) == 1  # the senior's one rollout keyed, never the 201 offered


def test_seniors_are_the_authors_past_k_rounds_most_work_first_up_to_the_limit() -> None:
    s = Seniority(young_rounds=2)
    for r in range(1, 6):
        s.credit(r, ["a"])  # 5 rounds
    for r in range(1, 4):
        s.credit(r, ["b"])  # 3 rounds
    s.credit(1, ["young"])  # 1 round: still young
    s.credit(2, ["c"])
    s.credit(3, ["c"])  # 2 rounds: just senior
    assert s.seniors(10) == ["a", "b", "c"]
    assert s.seniors(2) == ["a", "b"]
    assert s.seniors(0) == []
