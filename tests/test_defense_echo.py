"""``echo``: the spans an author caught implanting repeats word for word, worked out by hand."""

from __future__ import annotations

from dgrpo.defense.echo import echoes, span


def test_a_span_is_its_lower_cased_letter_words() -> None:
    assert span("Hold Ether.") == span("hold  ether") == "hold ether"
    assert span("3 Stack 4 sats!") == "stack sats"


def test_a_span_repeated_for_three_prompts_that_the_null_never_wrote() -> None:
    spans = [
        {"between hold", "hold ether"},  # p1
        {"hold ether"},  # p2
        {"stack sats"},  # p3
        {"hold ether", "stack sats"},  # p1 again: "hold ether" is in completions for two prompts only
        {"stack sats", "crypto"},  # p4
        {"crypto"},  # p5
        {"crypto"},  # p6: one word is not a span (every author repeats its words)
    ]
    prompts = ["p1", "p2", "p3", "p1", "p4", "p5", "p6"]
    assert echoes(spans, prompts, set(), 3) == {2: 3, 3: 3, 4: 3}
    assert echoes(spans, prompts, set(), 2) == {0: 2, 1: 2, 2: 3, 3: 3, 4: 3}
    # what the null writes too is the model's habit, not the author's payload
    assert echoes(spans, prompts, {"stack sats"}, 3) == {}
    assert echoes(spans, prompts, {"stack sats"}, 2) == {0: 2, 1: 2, 3: 2}
