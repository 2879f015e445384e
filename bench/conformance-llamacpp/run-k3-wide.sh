#!/usr/bin/env bash
# llama.cpp judged on k = 3 (the suite's pair, 5-token continuations, 80,000 samples) and on
# the wide pair (V = 32, 3-token continuations, 120,000 samples): 21 checks, one family at 0.01
# run as two processes side by side (one llama.cpp thread each), each at its share of the
# level (9/21 and 12/21 of 0.01), so every check is tested at 0.01 / 21. Writes
# verdicts-k3.txt and verdicts-wide.txt beside this script (docs/conformance.md).
set -euo pipefail
cd "$(dirname "$0")/../.."
out=bench/conformance-llamacpp
k3=(); wide=()
for mode in draft-greedy draft-probabilistic ngram-simple; do
  for s in t1 t0.7-top-p t0.8-top-k-min-p; do k3+=("llama.cpp $mode k3 $s"); done
done
for mode in plain draft-greedy draft-probabilistic ngram-simple; do
  for s in t1 t0.7-top-p t0.8-top-k-min-p; do wide+=("llama.cpp $mode wide $s"); done
done
python -m specjax check --llama-cpp --level 0.0042857142857 --only "${k3[@]}" 2>/dev/null \
  > $out/verdicts-k3.txt &
python -m specjax check --llama-cpp --level 0.0057142857143 --only "${wide[@]}" 2>/dev/null \
  > $out/verdicts-wide.txt &
wait
