#!/usr/bin/env bash
# weights/llama-eagle's recipe with `python -m specjax train`: its data (data/eagle/llama.npz,
# imported), EAGLE-1's loss, unroll 1, the 1,024-token subset, lr 5e-3, 46 warm-up steps,
# 452 steps of 27 documents (~7.7 epochs, as the card's 452 of ~4,096 slots).
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=.venv/bin/python
$PY -m specjax train data --preset tiny-llama --import data/eagle/llama.npz --out runs/tiny-data \
    --max-length 256
exec $PY -m specjax train eagle --preset tiny-llama --data runs/tiny-data --held-out 68 \
    --style specjax --format specjax --subset 1024 --unroll 1 --learning-rate 5e-3 --warmup 46 \
    --clip 1.0 --batch 27 --steps 452 --eval-every 0 --out runs/tiny-eagle "$@"
