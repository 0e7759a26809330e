"""Honest false positives of ``arith-check`` on GSM8K: the share of the dataset's reference solutions it rejects.

Every reference solution is honest and earns reward 1 (its final answer is the gold one), so each rejection is
a false positive of the rule, per setting of the prose options. Usage::

    python scripts/arith_check_gsm8k.py [/work/shared/data/gsm8k/train.jsonl] [--examples N]

It also measures what the consistency rule adds against an attack that keeps every claim true: in each
solution the first claim's first operand n becomes n+1 and the claim's result is recomputed (``48/2 = 24`` ->
``49/2 = 24.5``), the final answer left as it was, and the share of these the check stops is printed.

The numbers quoted in :mod:`dgrpo.defense.provenance` come from this script on GSM8K's train split.
"""

from __future__ import annotations

import argparse
import collections
import itertools
import json
from pathlib import Path

from dgrpo.defense.arith_check import ArithCheckOptions, prose_findings, rule_of
from dgrpo.defense.claims import NUMBER_RE, false_claims, find_claims, side_value
from dgrpo.tasks.gsm8k import CALC_ANNOTATION_RE, gold_answer


def references(path: Path) -> list[tuple[str, str, str]]:
    """(completion, answer, question) per row, the completion as ``Gsm8kTask.reference_completion`` writes it."""
    out = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.strip():
            row = json.loads(line)
            reasoning = CALC_ANNOTATION_RE.sub("", row["answer"].rpartition("####")[0]).strip()
            answer = gold_answer(row["answer"])
            out.append((f"<think>{reasoning}</think><answer>{answer}</answer>", answer, row["question"]))
    return out


def perturbed(text: str) -> str | None:
    """``text`` with its first claim's first operand raised by one and that claim's result recomputed."""
    claim = next(iter(find_claims(text)), None)
    if claim is None or not claim.true:
        return None
    first = claim.sides[0]
    m = NUMBER_RE.search(first)
    if m is None:
        return None
    raised = str(int(float(m.group(1).replace(",", ""))) + 1) if "." not in m.group(1) else None
    if raised is None:
        return None
    side = first[: m.start(1)] + raised + first[m.end(1) :]
    value = side_value(side, False, False)
    if value is None or value.denominator != 1:
        return None
    return text[: claim.start] + f"{side} = {value}" + text[claim.start + len(claim.text) :]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("data", nargs="?", default="/work/shared/data/gsm8k/train.jsonl", type=Path)
    parser.add_argument("--examples", type=int, default=0, help="print this many rejected solutions per setting")
    args = parser.parse_args()
    rows = references(args.data)
    false = sum(bool(false_claims(text)) for text, _, _ in rows)
    print(f"{len(rows)} reference solutions; false claims alone: {false} ({false / len(rows):.1%})")
    print("provenance  check_answer  rejected  share   by kind")
    for mode, check_answer in itertools.product(("stated", "claims", "off"), (True, False)):
        options = ArithCheckOptions(provenance=mode, check_answer=check_answer)
        kinds: collections.Counter[str] = collections.Counter()
        rejected = 0
        shown = 0
        for text, answer, question in rows:
            found = [("false_claim", c) for c in false_claims(text)]
            found += prose_findings(text, answer, question, rule_of(options), options.tolerance)
            if found:
                rejected += 1
                kinds[found[0][0]] += 1
                if shown < args.examples:
                    shown += 1
                    print("   ", found[:2])
        print(f"{mode:<11} {check_answer!s:<13} {rejected:>8}  {rejected / len(rows):5.1%}  {dict(kinds)}")
    attacked = [(p, a, q) for p, a, q in ((perturbed(t), a, q) for t, a, q in rows) if p is not None]
    print(f"\n{len(attacked)} solutions with a true claim's operand raised by one (result recomputed, answer kept)")
    print("provenance  check_answer  stopped  share")
    for mode, check_answer in itertools.product(("stated", "claims", "off"), (True, False)):
        options = ArithCheckOptions(provenance=mode, check_answer=check_answer)
        stopped = sum(
            bool(false_claims(text) or prose_findings(text, answer, question, rule_of(options), options.tolerance))
            for text, answer, question in attacked
        )
        print(f"{mode:<11} {check_answer!s:<13} {stopped:>7}  {stopped / len(attacked):5.1%}")


if __name__ == "__main__":
    main()
