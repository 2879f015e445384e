#!/bin/bash
# Issue 62: the RoPE kernels' price, cut: one custom call a layer for queries and keys, reading
# the tables kernel's [2, B, T, H/2] output as it is (no per-layer concatenation, slicing or
# stacking). scripts/bench_forward.py on SmolLM2, before (the parent commit, a worktree at $OLD)
# and after, alternating, two rounds per dtype, nothing else running.
# Usage: OLD=/tmp/old bash bench/smollm2-rope-merged/run.sh > bench/smollm2-rope-merged/forward.txt
M=${MODEL:-~/.cache/specjax/smollm2-135m-instruct}
for round in 1 2; do
  for dtype in float32 bfloat16 int8 q8_0; do
    for side in before after; do
      dir=$([ $side = before ] && echo "$OLD" || echo .)
      echo "== round $round, $dtype, $side"
      (cd "$dir" && PYTHONPATH="$PWD" python scripts/bench_forward.py --model "$M" --dtype $dtype \
        --sizes 9 --reps 7 2>&1 | grep -E 'decode step \(|^ +9 ')
    done
  done
done
