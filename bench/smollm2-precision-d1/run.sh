#!/bin/bash
# Issue 62 on the CPU, one run on an idle host: (1) the few-row kernel before and after design D1
# (bfloat16 and 8-bit weight rows widened once per call past 5 rows), call cost per size in
# one-token steps, the two builds alternating; (2) EAGLE on the quick prompts with the drafter in
# the target's dtype (the new default) and in float32, for bfloat16 and int8.
set -u
OUT=${OUT:-bench/smollm2-precision-d1}
MODEL=~/.cache/specjax/smollm2-135m-instruct
BEFORE=${BEFORE:-/work/wt-before}     # a worktree at the commit before D1
PY=${PY:-python}
{ lscpu | grep -E "Model name|^CPU\(s\)|Flags" | cut -c1-200; grep -m2 -E "cpu family|^model\s" /proc/cpuinfo
  git log -1 --format="after: %H"; git -C "$BEFORE" log -1 --format="before: %H"; } > "$OUT/host.txt"
for dtype in bfloat16 int8; do
  for tree in before after; do
    root=$([ $tree = before ] && echo "$BEFORE" || echo "$PWD")
    PYTHONPATH=$root $PY "$root/scripts/bench_forward.py" --model "$MODEL" --dtype $dtype \
        --sizes 1,5,9,17 --context 256 --reps 5 > "$OUT/forward-$dtype-$tree.txt" 2>&1
  done
done
for dtype in bfloat16 int8; do
  for drafter in default float32; do
    extra=$([ $drafter = float32 ] && echo "--drafter-dtype float32" || true)
    $PY -m specjax bench --preset smollm2 --quick --dtype $dtype $extra --methods eagle \
        --contexts none --no-peers --out "$OUT/eagle-$dtype-drafter-$drafter" \
        > "$OUT/eagle-$dtype-drafter-$drafter.log" 2>&1
  done
done
echo done > "$OUT/done.txt"
