#!/usr/bin/env bash
set -uo pipefail
cd "$(dirname "$0")/.."
echo "[$(date +%T)] tree search, whole steps timed"
bash bench/train-smollm2-medusa/train.sh --out runs/smollm2-medusa-steps --work runs/smollm2-medusa.work --tree-nodes 8
echo "[$(date +%T)] done"
