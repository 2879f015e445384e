#!/bin/bash
# specjax on a GPU, the third try: SmolLM2 in bfloat16, EAGLE with the drafter in the target's
# dtype (the default since issue 62), beside transformers in bfloat16 on the same card. The
# Q4_1 GGUF that `fetch smollm2` converts travels in two halves (the first stashed in /tmp by the
# call before), with the shipped drafter; each stage runs under its own limit and is packed
# into $OUT as it ends.
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
cp -r .gpu/b/smollm2-eagle weights/
cat /tmp/stash/part-a .gpu/b/part-b > "$SPECJAX_CACHE/downloads/SmolLM2-135M-Instruct.Q4_1.gguf"
{ sha256sum "$SPECJAX_CACHE/downloads/SmolLM2-135M-Instruct.Q4_1.gguf"; nvidia-smi; lscpu | head -20
  $PY -m pip list 2>/dev/null | grep -iE "^(jax|jaxlib|jax-cuda13-plugin|torch|transformers|numpy|tokenizers|safetensors|gguf) "
  $PY -c "import jax; print(jax.devices())"; git log -1 --format=%H 2>/dev/null; } > "$R/env.txt" 2>&1
pack
stage fetch 60 $PY -m specjax fetch smollm2
stage eagle-bfloat16 420 $PY -m specjax bench --preset smollm2 --quick --peers --dtype bfloat16 \
    --methods eagle --max-new-tokens 64 --contexts none --out "$R/gpu-smollm2-eagle-bfloat16"
log done
pack
