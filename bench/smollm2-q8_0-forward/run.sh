#!/bin/bash
# Issue 62, item 3: what a SmolLM2 call on n tokens costs in q8_0 beside int8 (the same
# matrices; int8 multiplies float32 activations, q8_0 rounds them to 8 bits and sums integers).
# scripts/bench_forward.py --sizes, the two dtypes alternating, two rounds, nothing else running.
# Usage: bash bench/smollm2-q8_0-forward/run.sh > bench/smollm2-q8_0-forward/forward.txt
M=${MODEL:-~/.cache/specjax/smollm2-135m-instruct}
for round in 1 2; do
  for dtype in int8 q8_0; do
    echo "== round $round, $dtype"
    python scripts/bench_forward.py --model "$M" --dtype $dtype --sizes 2,5,9,17 --reps 7 2>&1 \
      | grep -E 'decode step \(|^ +[0-9]+ |one-token step'
  done
done
