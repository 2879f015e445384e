#!/usr/bin/env bash
# 4,000 steps on all of data/eagle2 (the features made by `train features`); resumes.
set -euo pipefail
cd "$(dirname "$0")/.."
T=${TARGET:-/tmp/sjcache/smollm2-135m-instruct}
exec nice -n 10 .venv/bin/python -m specjax train eagle3 --target "$T" --data runs/eagle2 \
    --features runs/eagle2-features --taps 2,15,27 --features-dtype float16 \
    --out runs/eagle3-4k --work runs/eagle3-4k.work --unroll 3 --batch 4 \
    --learning-rate 1e-3 --draft-vocab 8192 --steps 4000 --held-out 8 \
    --checkpoint-every 100 --eval-every 1000 >> runs/eagle3-4k.log 2>&1
