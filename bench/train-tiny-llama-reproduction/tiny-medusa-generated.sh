#!/usr/bin/env bash
# After runs/after-finetune.sh: the tiny Medusa reproduction on exactly the shipped heads' data
# (the sequence set without its original-text documents: 1,024 documents, 98,304 generated
# tokens), 12 epochs of 8 documents a step as the card's, compared on the shipped heads' tree.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=.venv/bin/python
echo "[$(date +%T)] tiny medusa, generated documents only"
$PY -m specjax train data --preset tiny-llama --import data/eagle/llama.npz --out runs/tiny-data-generated \
    --max-length 256 --leave-out text-original
$PY -m specjax train medusa --preset tiny-llama --data runs/tiny-data-generated --held-out 68 \
    --format specjax --head subset --subset 1024 --heads 4 --blocks 1 --decay 0.8 \
    --learning-rate 1e-3 --warmup 50 --clip 1.0 --batch 8 --steps 1536 --eval-every 0 \
    --tree-nodes 0 --out runs/tiny-medusa-generated
$PY scripts/compare_drafters.py --preset tiny-llama --data runs/tiny-data-generated --method medusa \
    --out runs/tiny-medusa-generated-compare.json weights/llama-medusa runs/tiny-medusa-generated
echo "[$(date +%T)] done"
