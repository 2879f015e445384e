#!/usr/bin/env bash
# weights/llama-medusa's recipe with `python -m specjax train`: its data (data/eagle/llama.npz,
# imported: the same 1,093 prompts' continuations), 4 subset heads of the 1,024 most frequent
# ids, one block each, lambda_k = 0.8^k, lr 1e-3, 50 warm-up steps, clip 1.0, 2,280 steps of 8
# documents (~12 epochs, as the card's 2,280 batches of 512 positions).
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=.venv/bin/python
$PY -m specjax train data --preset tiny-llama --import data/eagle/llama.npz --out runs/tiny-data \
    --max-length 256
exec $PY -m specjax train medusa --preset tiny-llama --data runs/tiny-data --held-out 68 \
    --format specjax --head subset --subset 1024 --heads 4 --blocks 1 --decay 0.8 \
    --learning-rate 1e-3 --warmup 50 --clip 1.0 --batch 8 --steps 2280 --eval-every 0 \
    --out runs/tiny-medusa "$@"
