#!/usr/bin/env bash
# The attacker-freedom matrix (issue 12): the paper's four attacks and the five attacks on the exchange
# (select, over-publish, repeat-part, off-plan, non-canonical) x {none, logit, sampling-proof, best chain},
# homogeneous, 4 nodes, 1 malicious (node-3), then one `dgrpo report` table.
# Usage: ROUNDS=20 JOBS=2 bash scripts/binding_matrix.sh [OUT_DIR]      (default runs/binding)
# Every cell samples with the seeded sampler, and the attacker trains through the honest chain (adversary.in_sync)
# so that its weights stay equal to the honest nodes' and the same-model checks judge its draws (an attacker
# whose weights drift is rejected as foreign_model, which would measure the routing, not the check).
# The plan binding and the canonical-text rule are part of the
# protocol, so they act in every cell, "none" included; single defenses run with the reputation policy off
# (their stop rates then measure the filter and the binding), the best chain as deployed, with it on.
# Scenarios: as scripts/defense_matrix.sh (TEXT at lr 2e-4; MATH twice: as the paper's vertical attacker,
# which picks prompts with a 2+2 column and is now off-plan, and on its plan, where only the false step
# remains to stop: there every one-digit column sum a+b is made a+b+1, as 2+2=5 is, so that most planned
# prompts carry poison); the exchange attacks on dos-horizontal's model (tiny-arith-text).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT="${1:-runs/binding}"
FACTS="[$(for a in 0 1 2 3 4 5 6 7 8 9; do for b in 0 1 2 3 4 5 6 7 8 9; do if [ $((a + b)) -lt 9 ]; then printf '"%d+%d=%d",' $a $b $((a + b + 1)); fi; done; done | sed 's/,$//')]"
ROUNDS="${ROUNDS:-20}"
JOBS="${JOBS:-2}"
BEST='["code-policy","sampling-proof"]'
mkdir -p "$OUT"
declare -A SCEN=([text]=text-horizontal [math]=math-vertical [math-on-plan]=math-vertical [code]=code-horizontal
    [dos]=dos-horizontal [select]=dos-horizontal [over-publish]=dos-horizontal [repeat-part]=dos-horizontal
    [off-plan]=dos-horizontal [non-canonical]=dos-horizontal)
declare -A EXTRA=([text]="-s learner.lr=2e-4" [math]="" [math-on-plan]="-s adversary.options.choose_prompts=false -s 'adversary.options.facts=$FACTS'"
    [code]="" [dos]="" [select]="-s adversary.name=select" [over-publish]="-s adversary.name=over-publish"
    [repeat-part]="-s adversary.name=repeat-part" [off-plan]="-s adversary.name=off-plan"
    [non-canonical]="-s adversary.name=non-canonical")
ATTACKS=(text math math-on-plan code dos select over-publish repeat-part off-plan non-canonical)
cells=()
for attack in "${ATTACKS[@]}"; do
    for defense in none logit sampling-proof best; do
        case "$defense" in
            none) chain="" ;;
            best) chain="$BEST" ;;
            *) chain="[\"$defense\"]" ;;
        esac
        args="${SCEN[$attack]} --out $OUT/$attack-$defense -s rounds=$ROUNDS -s rollout.sampler=seeded"
        args+=" -s eval.every=5 -s eval.prompts=64 -s eval.asr_prompts=64 -s adversary.in_sync=true ${EXTRA[$attack]}"
        [ -n "$chain" ] && args+=" -s 'defense.chain=$chain'"
        [ -n "$chain" ] && [ "$defense" != best ] && args+=" -s defense.reputation.enabled=false"
        [ -f "$OUT/$attack-$defense/summary.json" ] || cells+=("$args")
    done
done
printf '%s\n' "${cells[@]}" | xargs -d '\n' -P "$JOBS" -I{} sh -c '.venv/bin/dgrpo simulate {} > /dev/null 2>&1 || echo "failed: {}"'
runs=()
for attack in "${ATTACKS[@]}"; do for defense in none logit sampling-proof best; do runs+=("$OUT/$attack-$defense"); done; done
.venv/bin/dgrpo report "${runs[@]}" --out "$OUT/report"
