#!/bin/bash
# specjax on a GPU, in one call: SmolLM2 (the Q4_1 GGUF `fetch smollm2` converts, carried in two
# halves) benched beside transformers on the same card, then the training stages timed.
# Each stage has its own time limit inside DEADLINE; results are packed into $OUT after each.
set -u
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_MEM_FRACTION=0.5
START=$(date +%s)
DEADLINE=${DEADLINE:-560}
PY=${PY:-python3}
QUICK=${QUICK:-}
R=${R:-/tmp/gpu-results}; W=${W:-/tmp/gpu-work}
mkdir -p "$R" "$W"
elapsed() { echo $(( $(date +%s) - START )); }
left() { echo $(( DEADLINE - $(elapsed) )); }
log() { echo "[$(elapsed)s] $*" | tee -a "$R/stages.log"; }
pack() { tar -czf "$OUT/results.tgz" -C "$R" . 2>/dev/null; }
# stage NAME MAX_SECONDS COMMAND...: runs for at most min(MAX, time left - reserve)
stage() {
    local name=$1 max=$2; shift 2
    local t=$(( $(left) - 15 )); [ "$t" -gt "$max" ] && t=$max
    if [ "$t" -lt 20 ]; then log "$name: skipped, ${t}s left"; return; fi
    log "$name: start (limit ${t}s)"
    local s=$(date +%s)
    timeout "$t" "$@" > "$R/$name.log" 2>&1
    log "$name: rc $? in $(( $(date +%s) - s ))s"
    pack
}

$PY -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .gpu/b/gguf-*.whl
export PYTHONPATH=/tmp/site:$PWD
export SPECJAX_CACHE=$W/cache
mkdir -p "$SPECJAX_CACHE/downloads"
cat .gpu/a/part-a .gpu/b/part-b > "$SPECJAX_CACHE/downloads/SmolLM2-135M-Instruct.Q4_1.gguf"
{ sha256sum "$SPECJAX_CACHE/downloads/SmolLM2-135M-Instruct.Q4_1.gguf"; nvidia-smi; lscpu | head -20
  $PY -m pip list 2>/dev/null | grep -iE "^(jax|jaxlib|jax-cuda13-plugin|torch|transformers|numpy|tokenizers|safetensors|optax|gguf) "
  $PY -c "import jax; print(jax.devices())"; } > "$R/env.txt" 2>&1
pack
stage fetch 200 $PY -m specjax fetch smollm2
T=$SPECJAX_CACHE/smollm2-135m-instruct

if [ -n "$QUICK" ]; then SUITE=(--quick --peers --max-new-tokens 8); CTX=(--contexts none)
else SUITE=(--ks 4 --reps 2 --warmup 1 --max-new-tokens 64); CTX=(--contexts 50,500,1500); fi
# float32 with every product in full float32, as transformers runs it (no TF32)
stage bench-float32 260 env JAX_DEFAULT_MATMUL_PRECISION=highest $PY -m specjax bench \
    --preset smollm2 --methods speculative,ngram,eagle "${SUITE[@]}" "${CTX[@]}" \
    --out "$R/gpu-smollm2-float32"
stage bench-bfloat16 120 $PY -m specjax bench --preset smollm2 --dtype bfloat16 \
    --methods eagle "${SUITE[@]}" --contexts none --out "$R/gpu-smollm2-bfloat16"

# The training stages of docs/training.md on this card (their logs carry the rates).
if [ -n "$QUICK" ]; then N=(--max-new-tokens 8); STEPS=4; else N=(--max-new-tokens 256); STEPS=300; fi
stage train-data 90 $PY -m specjax train data --target "$T" --prompts builtin:chat \
    --out "$W/data" "${N[@]}" --temperature 1 --top-p 0.9 --held-out 10 --batch 64
stage train-features 40 $PY -m specjax train features --target "$T" --data "$W/data" \
    --out "$W/features" --taps 2,15,27 --features-dtype float16
stage train-eagle3 120 $PY -m specjax train eagle3 --target "$T" --data "$W/data" \
    --features "$W/features" --features-dtype float16 --taps 2,15,27 --out "$W/eagle3" \
    --steps $STEPS --batch 4 --unroll 3 --draft-vocab 8192 --held-out 8 --checkpoint-every 1000
cp "$W/eagle3/train_log.json" "$R/train-eagle3-log.json" 2>/dev/null
log done
pack
