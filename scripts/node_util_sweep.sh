#!/bin/bash
# Runs points of the gpu_memory_utilization sweep (notebook 06) one after the other on a GPU node, each a
# fresh verl job on the case's emulated card; results in <root>/06_util_sweep/<case>-u<util>/.
# usage: scripts/node_util_sweep.sh <results root> <case> <util> [<util> ...]   (cases: util_sweep.CASES)
# Progress lines go to <root>/progress.txt, each point's console to <root>/<case>-u<util>.console.log.
# Each point waits for the device to drain itself (util_sweep waits for the release before returning).
set -u
root=$1; case=$2; shift 2
mkdir -p "$root"
source "$(dirname "$0")/node_lib.sh"
for util in "$@"; do
  run_in_session "$case-u$util" python3 -m rlkit.experiments.util_sweep --profile h200 -p "case=$case" \
      -p "gpu_memory_utilization=$util" --out "$root"
done
log "all points done"
