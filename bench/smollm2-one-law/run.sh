#!/bin/bash
# Issue 62, one law (first part): the cost of the RoPE kernels and of the float32 one-row step
# through the few-row kernel. scripts/bench_forward.py --sizes on SmolLM2, before (02a4833, a
# worktree at $OLD) and after (this commit), alternating, one round per dtype, nothing else
# running. Usage: OLD=/tmp/old bash bench/smollm2-one-law/run.sh > bench/smollm2-one-law/forward.txt
M=${MODEL:-~/.cache/specjax/smollm2-135m-instruct}
for round in 1; do
  for dtype in float32 bfloat16 int8; do
    for side in before after; do
      dir=$([ $side = before ] && echo "$OLD" || echo .)
      echo "== round $round, $dtype, $side"
      (cd "$dir" && PYTHONPATH="$PWD" python scripts/bench_forward.py --model "$M" --dtype $dtype --sizes 2,9 \
        --reps 7 2>&1 | grep -E 'decode step \(|verify call|^ +[0-9]+ ')
    done
  done
done
