#!/usr/bin/env bash
# Medusa heads for SmolLM2 with `python -m specjax train`, from the repository's SmolLM2 sequence
# set (data/eagle/smollm2.npz: 1,221 documents, 115,094 generated tokens), weights/smollm2-medusa's
# head settings: 4 subset heads of the 4,096 most frequent ids, one block each, 0.8^k, lr 1e-3,
# 50 warm-up steps, clip 1.0; 1,800 steps of 8 documents (about the shipped heads' 1.36M examples).
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=.venv/bin/python
T=${TARGET:-/tmp/sjcache/smollm2-135m-instruct}
$PY -m specjax train data --target "$T" --import data/eagle/smollm2.npz --out runs/smollm2-data \
    --max-length 384
exec nice -n 5 $PY -m specjax train medusa --target "$T" --data runs/smollm2-data --held-out 1000 \
    --format specjax --head subset --subset 4096 --heads 4 --blocks 1 --decay 0.8 \
    --learning-rate 1e-3 --warmup 50 --clip 1.0 --batch 8 --steps 1800 --eval-every 0 \
    --out runs/smollm2-medusa "$@"
