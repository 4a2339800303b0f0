#!/bin/bash
# Runs points of the gpu_memory_utilization sweep (notebook 06) one after the other on a GPU node, each a
# fresh verl job on the case's emulated card; results in <root>/06_util_sweep/<case>-u<util>/.
# usage: scripts/node_util_sweep.sh <results root> <case> <util> [<util> ...]   (cases: util_sweep.CASES)
# Progress lines go to <root>/progress.txt, each point's console to <root>/<case>-u<util>.console.log.
set -u
root=$1; case=$2; shift 2
mkdir -p "$root"
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
log() { echo "$(date +%T) $*" >> "$root/progress.txt"; }
for util in "$@"; do
  log "point $case u=$util start"
  setsid python3 -m rlkit.experiments.util_sweep --profile h200 -p "case=$case" -p "gpu_memory_utilization=$util" \
      --out "$root" > "$root/$case-u$util.console.log" 2>&1 &
  pid=$!
  wait $pid
  status=$?
  log "point $case u=$util exit $status"
  pkill -9 -s "$pid"   # the launcher's session; the launcher stops verl's own session itself
done
log "all points done"
