#!/usr/bin/env bash
# A SmolLM2 draft model of the shipped one's shape (weights/smollm2-draft: 4 Llama layers of
# width 128, 4 heads, MLP 384, tied embeddings), trained by the product (`train draft`) on all
# of data/eagle2 against the target's soft labels (the final states of the EAGLE-3 features
# pass, runs/eagle2-features, so the target never runs), in batches of like lengths. The
# shipped draft was trained by scripts/train.py on the standard library's source and 174k
# tokens of the target's own text, with hard labels. Resumable: run it again with the same
# arguments.
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=.venv/bin/python
T=${TARGET:-/tmp/sjcache/smollm2-135m-instruct}
OUT=${OUT:-runs/smollm2-draft-product}
[ -d runs/eagle2 ] || $PY -m specjax train data --target "$T" --import data/eagle2/smollm2 \
    --out runs/eagle2
[ -f runs/eagle2-features/features.json ] || $PY -m specjax train features --target "$T" \
    --data runs/eagle2 --out runs/eagle2-features --taps 2,15,27 --features-dtype float16
exec nice -n 10 $PY -m specjax train draft --target "$T" --data runs/eagle2 \
    --features runs/eagle2-features --features-dtype float16 \
    --layers 4 --d-model 128 --heads 4 --d-ff 384 \
    --out "$OUT" --work "$OUT.work" --slots 4096 --learning-rate 0.002 --warmup 50 \
    --clip 1.0 --seed 0 --held-out 8 --checkpoint-every 25 --eval-every 0 "$@"
