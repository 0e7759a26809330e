#!/usr/bin/env bash
# The heterogeneous defense matrix (issue 12, item 4): every attack x {cheap chain, surprisal, repetition,
# surprisal + repetition (new), judge} on heterogeneous mixes of the tiny models, 4 nodes, 1 malicious
# (node-3), reputation off
# (the stop rates measure the filters themselves), one simulation at a time.
# Usage: ROUNDS=10 JUDGE_ROUNDS=3 bash scripts/surprisal_matrix.sh [OUT_DIR]      (default runs/surprisal)
# The judge is SmolLM2-135M-Instruct on the CPU (as in scripts/defense_matrix.sh), hence its fewer rounds.
# MATH runs on the attacker's own plan (the plan binding rejects the paper's chosen prompts as off_plan), with
# every one-digit column sum a+b made a+b+1 (as 2+2=5) so that most planned prompts carry poison.
# nodes.models is assigned round-robin, so node-3 (the attacker) gets models[3 % len]:
#   E2 = code-text, text (honest: code-text, text, code-text; attacker: text): both English-reading models;
#   A4 = tiny-arith, llama, code-text, text (honest: two digits-only models of two architectures and code-text);
#   D3 = tiny-arith, llama, tiny-arith, text (honest digits-only models, attacker text);
#   M2 = tiny-arith, llama (MATH: honest tiny-arith, llama, tiny-arith; attacker llama);
#   C3 = code-text, tiny-arith, llama, code-text (CODE: the models that still write arith-code programs).
# TEXT runs at lr 2e-4 as in the homogeneous matrix (at the shipped 5e-4 honest runs collapse).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT="${1:-runs/surprisal}"
ROUNDS="${ROUNDS:-10}"
JUDGE_ROUNDS="${JUDGE_ROUNDS:-3}"
FACTS="[$(for a in 0 1 2 3 4 5 6 7 8 9; do for b in 0 1 2 3 4 5 6 7 8 9; do if [ $((a + b)) -lt 9 ]; then printf '"%d+%d=%d",' $a $b $((a + b + 1)); fi; done; done | sed 's/,$//')]"
MATH=(-s adversary.options.choose_prompts=false -s "adversary.options.facts=$FACTS")
PY="${PY:-.venv/bin/python}"
E2='["dgrpo:tiny-arith-code-text","dgrpo:tiny-arith-text"]'
A4='["dgrpo:tiny-arith","dgrpo:tiny-arith-llama","dgrpo:tiny-arith-code-text","dgrpo:tiny-arith-text"]'
D3='["dgrpo:tiny-arith","dgrpo:tiny-arith-llama","dgrpo:tiny-arith","dgrpo:tiny-arith-text"]'
M2='["dgrpo:tiny-arith","dgrpo:tiny-arith-llama"]'
C3='["dgrpo:tiny-arith-code-text","dgrpo:tiny-arith","dgrpo:tiny-arith-llama","dgrpo:tiny-arith-code-text"]'
declare -A CHAIN=(
    [cheap]='["length","arith-check","code-policy"]'
    [surprisal]='["surprisal"]'
    [repetition]='["repetition"]'
    [new]='["surprisal","repetition"]'
    [judge]='["judge"]'
)
run() {  # name scenario models chain [extra -s overrides...]
    local name=$1 scenario=$2 models=$3 chain=$4
    shift 4
    [ -f "$OUT/$name/summary.json" ] && return 0
    local rounds=$ROUNDS
    [[ $name == *-judge ]] && rounds=$JUDGE_ROUNDS
    "$PY" -m dgrpo simulate "$scenario" --out "$OUT/$name" -s "rounds=$rounds" -s nodes.mode=heterogeneous \
        -s "nodes.models=$models" -s defense.reputation.enabled=false -s "defense.chain=$chain" \
        -s eval.every=100 -s eval.prompts=32 -s eval.asr_prompts=32 "$@"
}
for c in cheap surprisal repetition new judge; do
    run "text-E2-$c" text-horizontal "$E2" "${CHAIN[$c]}" -s learner.lr=2e-4
    run "text-A4-$c" text-horizontal "$A4" "${CHAIN[$c]}" -s learner.lr=2e-4
    run "text-D3-$c" text-horizontal "$D3" "${CHAIN[$c]}" -s learner.lr=2e-4
    run "math-M2-$c" math-vertical "$M2" "${CHAIN[$c]}" "${MATH[@]}"
    run "code-C3-$c" code-horizontal "$C3" "${CHAIN[$c]}"
    run "dos-E2-$c" dos-horizontal "$E2" "${CHAIN[$c]}"
done
# The paper's position for the phrase (prepended to the reasoning) instead of the scenario's "end".
run text-E2-start-surprisal text-horizontal "$E2" "${CHAIN[surprisal]}" -s learner.lr=2e-4 \
    -s adversary.options.position=start
for d in "$OUT"/*/; do
    "$PY" - "$d" <<'EOF'
import json, sys
d = json.load(open(sys.argv[1] + "summary.json"))["defense"]
print(f"{sys.argv[1]:40s} stop {d['stop_rate']} fpr {d['false_positive_rate']}")
EOF
done
