#!/usr/bin/env bash
# The SmolLM2 draft model by the product on a quarter of data/eagle2 (shards 0-4: 1,806
# documents, 302,357 generated tokens), the run of this directory's README: the shipped draft's
# shape (4 Llama layers of width 128, 4 heads, MLP 384, tied embeddings) and step count (600
# steps of about 4,096 positions), against the target's soft labels from a features pass
# through the cheapest tap (`--taps 0`: the final states are what a draft model reads).
# Resumable: run it again with the same arguments.
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PY:-.venv/bin/python}
T=${TARGET:-/tmp/sjcache/smollm2-135m-instruct}
OUT=${OUT:-runs/smollm2-draft-5}
mkdir -p runs/eagle2-5shards-src
for i in 000 001 002 003 004; do
    cp -n data/eagle2/smollm2/shard-$i.npz runs/eagle2-5shards-src/
done
[ -d runs/eagle2-5 ] || $PY -m specjax train data --target "$T" \
    --import runs/eagle2-5shards-src --out runs/eagle2-5
[ -f runs/eagle2-5-features/features.json ] || $PY -m specjax train features --target "$T" \
    --data runs/eagle2-5 --out runs/eagle2-5-features --taps 0 --features-dtype float16
exec $PY -m specjax train draft --target "$T" --data runs/eagle2-5 \
    --features runs/eagle2-5-features --features-dtype float16 \
    --layers 4 --d-model 128 --heads 4 --d-ff 384 \
    --out "$OUT" --work "$OUT.work" --slots 4096 --learning-rate 0.002 --warmup 50 \
    --clip 1.0 --seed 0 --held-out 8 --checkpoint-every 25 --eval-every 0 --steps 600 "$@"
