#!/usr/bin/env bash
# The defense matrix (issue 5): every attack x {none, logit, sampling-proof, judge, arith-check, code-policy,
# length, best chain} on the tiny models, 4 nodes, 1 malicious, then one `dgrpo report` table per attack.
# Usage: bash scripts/defense_matrix.sh [OUT_DIR]      (default runs/matrix)
#   ROUNDS=20 JUDGE_ROUNDS=5 JOBS=2 bash scripts/defense_matrix.sh runs/matrix
# Every cell samples with the seeded sampler (so that sampling-proof can check honest completions). Single
# defenses run with the reputation policy off, so that their stop rates measure the filters themselves; the
# best chain runs as deployed, with it on (poison from a blacklisted attacker counts as stopped).
# Scenarios: TEXT on tiny-arith-text (lr 2e-4: at the shipped 5e-4 the honest-only run collapses, see
# docs/results.md), MATH in the vertical split (the attacker picks 2+2 prompts, so there is poison to stop),
# CODE and DoS as shipped. The judge is SmolLM2-135M-Instruct (pypi:SmolLM2-135M-Instruct) on the CPU, so its
# cells run JUDGE_ROUNDS rounds.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT="${1:-runs/matrix}"
ROUNDS="${ROUNDS:-20}"
JUDGE_ROUNDS="${JUDGE_ROUNDS:-5}"
JOBS="${JOBS:-2}"
BEST='["code-policy","sampling-proof"]'
mkdir -p "$OUT"
declare -A SCEN=([text]=text-horizontal [math]=math-vertical [code]=code-horizontal [dos]=dos-horizontal)
declare -A EXTRA=([text]="-s learner.lr=2e-4" [math]="" [code]="" [dos]="")
cells=()
for attack in text math code dos; do
    for defense in none logit sampling-proof arith-check code-policy length best judge; do
        case "$defense" in
            none) chain="" ;;
            best) chain="$BEST" ;;
            *) chain="[\"$defense\"]" ;;
        esac
        rounds="$ROUNDS"; [ "$defense" = judge ] && rounds="$JUDGE_ROUNDS"
        args="${SCEN[$attack]} --out $OUT/$attack-$defense -s rounds=$rounds -s rollout.sampler=seeded"
        args+=" -s eval.every=5 -s eval.prompts=64 -s eval.asr_prompts=64 ${EXTRA[$attack]}"
        [ -n "$chain" ] && args+=" -s 'defense.chain=$chain'"
        # Single filters are measured alone; the best chain runs with the reputation policy, as deployed.
        [ -n "$chain" ] && [ "$defense" != best ] && args+=" -s defense.reputation.enabled=false"
        [ -f "$OUT/$attack-$defense/summary.json" ] || cells+=("$args")
    done
done
# DoS is measured by length: the same run with no attacker is its baseline.
[ -f "$OUT/dos-honest/summary.json" ] || cells+=("dos-horizontal --out $OUT/dos-honest -s rounds=$ROUNDS \
-s rollout.sampler=seeded -s eval.every=5 -s eval.prompts=64 -s eval.asr_prompts=64 -s nodes.malicious=0")
printf '%s\n' "${cells[@]}" | xargs -d '\n' -P "$JOBS" -I{} sh -c '.venv/bin/dgrpo simulate {} > /dev/null 2>&1 || echo "failed: {}"'
for attack in text math code dos; do
    .venv/bin/dgrpo report "$OUT"/$attack-{none,logit,sampling-proof,judge,arith-check,code-policy,length,best} \
        --out "$OUT/report-$attack" $([ $attack = dos ] && echo "--baseline $OUT/dos-honest")
done
