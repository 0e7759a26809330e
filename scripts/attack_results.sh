#!/usr/bin/env bash
# Run every shipped tiny-model attack scenario (no defense) plus honest-only baselines, then build the
# comparison table and overlay plot that docs/results.md reports. One scenario at a time (2-core machine).
# Usage: bash scripts/attack_results.sh [OUT_DIR]   (default runs/attacks)
set -euo pipefail
cd "$(dirname "$0")/.."
OUT="${1:-runs/attacks}"
DGRPO=.venv/bin/dgrpo
mkdir -p "$OUT"
for attack in text math code dos; do
    for split in horizontal vertical; do
        [ -f "$OUT/$attack-$split/summary.json" ] || $DGRPO simulate "$attack-$split" --out "$OUT/$attack-$split"
    done
done
# Honest-only baselines: the same scenarios with no malicious node (the DoS figure is relative to these).
for s in dos-horizontal dos-vertical; do
    [ -f "$OUT/$s-honest/summary.json" ] || $DGRPO simulate "$s" -s nodes.malicious=0 --out "$OUT/$s-honest"
done
$DGRPO report "$OUT"/{text,math,code}-{horizontal,vertical} --out "$OUT/report"
$DGRPO report "$OUT"/dos-horizontal "$OUT"/dos-horizontal-honest --baseline "$OUT/dos-horizontal-honest" \
    --out "$OUT/report-dos-horizontal"
$DGRPO report "$OUT"/dos-vertical "$OUT"/dos-vertical-honest --baseline "$OUT/dos-vertical-honest" \
    --out "$OUT/report-dos-vertical"
