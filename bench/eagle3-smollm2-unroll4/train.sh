#!/usr/bin/env bash
# Fine-tune the 4,000-step drafter (runs/eagle3-4k) with a fourth training-time-test pass:
# `train eagle3 --init`, 1,000 steps at a third of the peak rate, other batches (seed 1).
set -euo pipefail
cd "$(dirname "$0")/../.."
T=${TARGET:-/tmp/sjcache/smollm2-135m-instruct}
exec nice -n 10 .venv/bin/python -m specjax train eagle3 --target "$T" --data runs/eagle2 \
    --features runs/eagle2-features --taps 2,15,27 --features-dtype float16 \
    --init runs/eagle3-4k --out runs/eagle3-4k-u4 --work runs/eagle3-4k-u4.work --unroll 4 \
    --batch 4 --learning-rate 3e-4 --warmup 20 --draft-vocab 8192 --steps 1000 --seed 1 \
    --held-out 8 --checkpoint-every 50 --eval-every 500 "$@"
