#!/usr/bin/env bash
# The shipped SmolLM2 EAGLE drafter's last round (round four), remade with `python -m specjax
# train eagle`: specjax's EAGLE-1 style with the 8,192-id subset head, started from round three
# (the weights in weights/smollm2-eagle at git a7aab63), on all of data/eagle2, with the card's
# settings (noise 0.1, two passes weighted 0.8^i, peak rate 1.5e-3 after 30 warm-up steps, cosine
# to a tenth, clip 1.0, 796 steps). Batches are 20 documents (about the card's 4,096 slots).
# It reads the final states of the EAGLE-3 features pass (docs/training.md) and resumes.
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=.venv/bin/python
T=${TARGET:-/tmp/sjcache/smollm2-135m-instruct}
mkdir -p runs/smollm2-eagle-round3
for f in config.json model.safetensors; do
    git show a7aab63:weights/smollm2-eagle/$f > runs/smollm2-eagle-round3/$f
done
[ -d runs/eagle2 ] || $PY -m specjax train data --target "$T" --import data/eagle2/smollm2 \
    --out runs/eagle2
[ -f runs/eagle2-features/features.json ] || $PY -m specjax train features --target "$T" \
    --data runs/eagle2 --out runs/eagle2-features --taps 2,15,27 --features-dtype float16
exec nice -n 10 $PY -m specjax train eagle --target "$T" --data runs/eagle2 \
    --features runs/eagle2-features --features-dtype float16 \
    --style specjax --subset 8192 --format specjax --init runs/smollm2-eagle-round3 \
    --out runs/eagle1-round4 --work runs/eagle1-round4.work --unroll 2 --decay 0.8 \
    --noise 0.1 --batch 20 --learning-rate 0.0015 --warmup 30 --clip 1.0 --steps 796 --seed 4 \
    --held-out 8 --checkpoint-every 50 --eval-every 400 "$@"
