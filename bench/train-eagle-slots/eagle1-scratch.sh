#!/usr/bin/env bash
# The shipped SmolLM2 EAGLE drafter's kind (specjax style, 8,192-id subset), trained from scratch
# by the product on all of data/eagle2 (runs/eagle2, its features in runs/eagle2-features), in
# batches of like lengths (--slots 4096, the script's batch size in positions). Resumable.
set -euo pipefail
cd "$(dirname "$0")/../.."
T=${TARGET:-/tmp/sjcache/smollm2-135m-instruct}
OUT=${OUT:-runs/eagle1-scratch}
exec nice -n 10 .venv/bin/python -m specjax train eagle --target "$T" --data runs/eagle2 \
    --features runs/eagle2-features --features-dtype float16 \
    --style specjax --subset 8192 --format specjax \
    --out "$OUT" --work "$OUT.work" --unroll 2 --decay 0.8 \
    --noise 0.1 --learning-rate 0.002 --warmup 50 --clip 1.0 --seed 0 \
    --held-out 8 --checkpoint-every 10 --eval-every 0 "$@"
