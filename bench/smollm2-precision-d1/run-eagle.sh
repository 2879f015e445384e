#!/bin/bash
# The second half of run.sh, run alone after D1 was reverted (run.sh was stopped after its
# forward timings): EAGLE on the quick prompts with the drafter in the target's dtype (the new
# default) and in float32, for bfloat16 and int8, one after another on the idle host.
set -u
OUT=${OUT:-bench/smollm2-precision-d1}
PY=${PY:-python}
git log -1 --format="eagle runs: %H" >> "$OUT/host.txt"
for dtype in bfloat16 int8; do
  for drafter in default float32; do
    extra=$([ $drafter = float32 ] && echo "--drafter-dtype float32" || true)
    $PY -m specjax bench --preset smollm2 --quick --dtype $dtype $extra --methods eagle \
        --max-new-tokens 64 --reps 2 --warmup 1 --contexts none --no-peers --out "$OUT/eagle-$dtype-drafter-$drafter" \
        > "$OUT/eagle-$dtype-drafter-$drafter.log" 2>&1
  done
done
echo done > "$OUT/done.txt"
