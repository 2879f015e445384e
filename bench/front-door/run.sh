#!/usr/bin/env bash
# The front door, cold and warm (issue 74, item 3): `generate --method all` with a cache of
# its own, SmolLM2 fetched on first use and nothing compiled, then the same command again.
set -euo pipefail
export SPECJAX_CACHE="${SPECJAX_CACHE:-$(mktemp -d)}"
for run in cold warm; do
  start=$(date +%s.%N)
  python -m specjax generate --prompt "def fibonacci(n):" --method all > "$run.txt" 2> "$run-stderr.txt"
  echo "$run: $(echo "$(date +%s.%N) - $start" | bc) s"
done
