#!/bin/bash
# SmolLM2's shapes with random weights (the real ones cannot travel in one call): the decode
# step and the prefill of specjax against transformers on the same card; timings only.
set -u
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_MEM_FRACTION=0.5 PYTHONPATH=$PWD
PY=${PY:-python3}; R=${R:-/tmp/gpu-results}; mkdir -p "$R"
START=$(date +%s)
$PY - <<'PYEOF'
import shutil, torch, transformers
config = transformers.AutoConfig.from_pretrained(".gpu/c")
torch.manual_seed(0)
transformers.LlamaForCausalLM(config).save_pretrained("/tmp/rand-smollm2")
for f in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "generation_config.json"):
    shutil.copy(f".gpu/c/{f}", "/tmp/rand-smollm2/")
PYEOF
echo "[$(( $(date +%s) - START ))s] made"
for dtype in float32 bfloat16; do
  timeout $([ $dtype = float32 ] && echo 110 || echo 70) env JAX_DEFAULT_MATMUL_PRECISION=highest $PY -m specjax bench --target /tmp/rand-smollm2 \
      --dtype $dtype --quick --peers --methods autoregressive --contexts ${CTX:-50,1500} --reps 3 --out "$R/gpu-random-$dtype" > "$R/$dtype.log" 2>&1
  echo "[$(( $(date +%s) - START ))s] $dtype rc $?"
  tar -czf "$OUT/results.tgz" -C "$R" .
done
