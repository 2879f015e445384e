#!/bin/bash
# specjax on a GPU, the second try: SmolLM2 (the Q4_1 GGUF `fetch smollm2` converts, carried in
# two halves; the first half and the draft were stashed in /tmp by the call before) benched beside
# transformers on the same card, one short table at a time, each packed into $OUT as it ends.
set -u
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_MEM_FRACTION=0.5
START=$(date +%s)
DEADLINE=${DEADLINE:-500}
PY=${PY:-python3}
R=/tmp/gpu-results; W=/tmp/gpu-work
mkdir -p "$R" "$W"
elapsed() { echo $(( $(date +%s) - START )); }
left() { echo $(( DEADLINE - $(elapsed) )); }
log() { echo "[$(elapsed)s] $*" | tee -a "$R/stages.log"; }
pack() { tar -czf "$OUT/results.tgz" -C "$R" . 2>/dev/null; }
stage() {
    local name=$1 max=$2; shift 2
    local t=$(( $(left) - 10 )); [ "$t" -gt "$max" ] && t=$max
    if [ "$t" -lt 20 ]; then log "$name: skipped, ${t}s left"; return; fi
    log "$name: start (limit ${t}s)"
    local s=$(date +%s)
    timeout "$t" "$@" > "$R/$name.log" 2>&1
    log "$name: rc $? in $(( $(date +%s) - s ))s"
    pack
}
$PY -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .gpu/b/gguf-*.whl
export PYTHONPATH=/tmp/site:$PWD SPECJAX_CACHE=$W/cache
mkdir -p "$SPECJAX_CACHE/downloads" weights
cp -r /tmp/stash/smollm2-draft weights/
cat /tmp/stash/part-a .gpu/b/part-b > "$SPECJAX_CACHE/downloads/SmolLM2-135M-Instruct.Q4_1.gguf"
{ sha256sum "$SPECJAX_CACHE/downloads/SmolLM2-135M-Instruct.Q4_1.gguf"; du -sh weights/*; nvidia-smi; lscpu | head -20
  $PY -m pip list 2>/dev/null | grep -iE "^(jax|jaxlib|jax-cuda13-plugin|jax-cuda12-plugin|torch|transformers|numpy|tokenizers|safetensors|optax|gguf|xllamacpp) "
  $PY -c "import jax; print(jax.devices())"; } > "$R/env.txt" 2>&1
pack
stage fetch 60 $PY -m specjax fetch smollm2
# float32 with every product in full float32, as transformers runs it (torch leaves TF32 off)
F32=(env JAX_DEFAULT_MATMUL_PRECISION=highest $PY -m specjax bench --preset smollm2 --quick --peers)
stage eagle-float32 200 "${F32[@]}" --methods eagle --max-new-tokens 64 --contexts 50,1500 \
    --out "$R/gpu-smollm2-eagle-float32"
stage speculative-ngram-float32 150 "${F32[@]}" --methods speculative,ngram --max-new-tokens 64 \
    --contexts none --out "$R/gpu-smollm2-speculative-ngram-float32"
stage eagle-bfloat16 120 $PY -m specjax bench --preset smollm2 --quick --peers --dtype bfloat16 \
    --methods eagle --max-new-tokens 64 --contexts none --out "$R/gpu-smollm2-eagle-bfloat16"
log done
pack
