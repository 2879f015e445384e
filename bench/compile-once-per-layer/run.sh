#!/usr/bin/env bash
# Old code (OLD, a checkout of the commit before the scan) against new (this checkout), side by
# side on one idle host: compile times per method (compile_times.py) and the step, 9- and
# 17-token calls in four dtypes (scripts/bench_forward.py), each twice for the noise.
#   OLD=/path/to/old/checkout bash bench/compile-once-per-layer/run.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
out=bench/compile-once-per-layer
model=$(python -c "from specjax.io.fetch import fetch; print(fetch('smollm2'))")
lscpu | grep -E "Model name|^CPU\(s\)" > "$out/host.txt"
python -c "import jax; print('jax', jax.__version__)" >> "$out/host.txt"
for tree in new old; do
  path=$([ "$tree" = new ] && pwd || echo "$OLD")
  PYTHONPATH="$path" python "$out/compile_times.py" --out "$out/compile-$tree.json"
done
for round in 1 2; do
  for dtype in float32 bfloat16 int8 q8_0; do
    for tree in new old; do
      path=$([ "$tree" = new ] && pwd || echo "$OLD")
      PYTHONPATH="$path" SPECJAX_COMPILE_CACHE=off python "$path/scripts/bench_forward.py" \
        --model "$model" --dtype "$dtype" --sizes 9,17 > "$out/forward-$tree-$dtype-$round.txt" 2>&1
    done
  done
done
