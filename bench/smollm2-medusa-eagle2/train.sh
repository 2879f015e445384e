#!/usr/bin/env bash
# SmolLM2 Medusa heads made by `python -m specjax train medusa` from the repository's own data,
# data/eagle2 (imported once as runs/eagle2; its features pass, runs/eagle2-features, is reused
# when it is there), with the shipped heads' settings: 4 subset heads of the 4,096 most frequent
# ids, two blocks each, 0.8^k, lr 1e-3 after 50 warm-up steps, clip 1.0; 2,000 steps of 8
# documents (about 2.3 passes over the data). Resumable: run it again. --verify-cost measure
# (the default) times decoding steps: run it alone on the host.
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=.venv/bin/python
T=${TARGET:-/tmp/sjcache/smollm2-135m-instruct}
[ -d runs/eagle2 ] || $PY -m specjax train data --target "$T" --import data/eagle2/smollm2 \
    --out runs/eagle2
exec nice -n 5 $PY -m specjax train medusa --target "$T" --data runs/eagle2 \
    --features runs/eagle2-features --features-dtype float16 --held-out 20 \
    --format specjax --head subset --subset 4096 --heads 4 --blocks 2 --decay 0.8 \
    --learning-rate 1e-3 --warmup 50 --clip 1.0 --batch 8 --steps 2000 --eval-every 0 \
    --checkpoint-every 100 --tree-nodes 8 --out runs/smollm2-medusa-eagle2 \
    --work runs/smollm2-medusa-eagle2.work "$@"
