#!/usr/bin/env bash
# Tokens/s of the SmolLM2 heads made by `train medusa` (bench/train-smollm2-medusa/) with the tree
# the command searched, (0) (1) (0,0), and with the shipped heads' tree, (0) (1) (2) (0,0): the
# same heads, two directories that differ only in config.json's tree; one bench each, back to
# back, each with its own autoregressive baseline.
set -euo pipefail
cd "$(dirname "$0")/../.."
HEADS=${HEADS:-runs/smollm2-medusa-tree}
OUT=bench/medusa-tree-search
rm -rf /tmp/heads-shipped-tree && cp -r "$HEADS" /tmp/heads-shipped-tree
.venv/bin/python - <<'PY'
import json
p = "/tmp/heads-shipped-tree/config.json"
c = json.load(open(p))
c["tree"] = [[0], [1], [2], [0, 0]]
json.dump(c, open(p, "w"), indent=2)
PY
for name in searched shipped; do
    heads=$HEADS; [ $name = shipped ] && heads=/tmp/heads-shipped-tree
    .venv/bin/python -m specjax bench --preset smollm2 --quick --no-peers --methods medusa \
        --heads "$heads" --reps 3 --out /tmp/bench-tree-$name > $OUT/log-$name.txt 2>&1
    cp /tmp/bench-tree-$name/results.json $OUT/results-$name.json
done
