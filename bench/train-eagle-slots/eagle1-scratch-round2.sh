#!/usr/bin/env bash
# A second round of the from-scratch drafter (runs/eagle1-scratch, made by eagle1-scratch.sh):
# `train eagle --init` from it on the same data, with the schedule of the shipped drafter's last
# round (peak rate 1.5e-3 after 30 warm-up steps, cosine to a tenth, 800 steps), another seed for
# the draws. Resumable: run it again with the same arguments.
set -euo pipefail
cd "$(dirname "$0")/../.."
T=${TARGET:-/tmp/sjcache/smollm2-135m-instruct}
OUT=${OUT:-runs/eagle1-scratch-round2}
exec nice -n 10 .venv/bin/python -m specjax train eagle --target "$T" --data runs/eagle2 \
    --features runs/eagle2-features --features-dtype float16 \
    --style specjax --subset 8192 --format specjax --init runs/eagle1-scratch \
    --out "$OUT" --work "$OUT.work" --unroll 2 --decay 0.8 \
    --noise 0.1 --slots 4096 --learning-rate 0.0015 --warmup 30 --clip 1.0 --steps 800 --seed 1 \
    --held-out 8 --checkpoint-every 25 --eval-every 0 "$@"
