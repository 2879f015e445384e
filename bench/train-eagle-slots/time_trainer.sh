#!/usr/bin/env bash
# Steady-state speed of `train eagle` (eagle1-scratch.sh's settings, from scratch) with the given batch
# options: run it alone, log each checkpoint's (step, time), stop after $STOP steps.
set -uo pipefail
cd "$(dirname "$0")/../.."
name=$1; shift; STOP=${STOP:-60}
rm -rf runs/time-$name runs/time-$name.work
OUT=runs/time-$name bench/train-eagle-slots/eagle1-scratch.sh --steps 2400 "$@" > runs/time-$name.log 2>&1 &
pid=$!
last=""
while kill -0 $pid 2>/dev/null; do
    s=$(cat runs/time-$name.work/checkpoint/state.json 2>/dev/null)
    if [ -n "$s" ] && [ "$s" != "$last" ]; then echo "$s" >> runs/time-$name.steps; last=$s; fi
    step=$(echo "$s" | python3 -c "import json,sys; print(json.load(sys.stdin)['step'])" 2>/dev/null)
    if [ -n "$step" ] && [ "$step" -ge "$STOP" ]; then pkill -P $pid; kill $pid; break; fi
    sleep 1
done
wait
