#!/usr/bin/env bash
# llama.cpp's sampling and speculation judged by the lossless check: 4 modes x 3 settings,
# 50,000 samples each (docs/conformance.md). Writes verdicts.txt beside this script.
set -euo pipefail
cd "$(dirname "$0")/../.."
python -m specjax check --llama-cpp --only 'llama.cpp plain t1' 'llama.cpp plain t0.7-top-p' 'llama.cpp plain t0.8-top-k-min-p' 'llama.cpp draft-greedy t1' 'llama.cpp draft-greedy t0.7-top-p' 'llama.cpp draft-greedy t0.8-top-k-min-p' 'llama.cpp draft-probabilistic t1' 'llama.cpp draft-probabilistic t0.7-top-p' 'llama.cpp draft-probabilistic t0.8-top-k-min-p' 'llama.cpp ngram-simple t1' 'llama.cpp ngram-simple t0.7-top-p' 'llama.cpp ngram-simple t0.8-top-k-min-p' 2>/dev/null | tee bench/conformance-llamacpp/verdicts.txt
