#!/bin/bash
# Runs points of the gpu_memory_utilization sweep (notebook 06) on a GPU node, each a fresh verl job on one
# GPU's emulated card; results in <root>/06_util_sweep/<case>-u<util>/.
# usage: scripts/node_util_sweep.sh <results root> <case> <util> [<util> ...]   (cases: util_sweep.CASES)
# RLKIT_GPU_LANES=N (default 1): the points are dealt round-robin to GPUs 0..N-1 and each GPU runs its points
# one after the other, the GPUs side by side (a point uses one GPU; each job and its memory sampler see only
# their GPU through CUDA_VISIBLE_DEVICES, and every job starts its own Ray instance; lanes that both build
# the random-init checkpoint or data write them atomically, and the first finished copy is used).
# Progress lines go to <root>/progress.txt, each point's console to <root>/<case>-u<util>.console.log.
# Each point waits for its GPU to drain (util_sweep waits for the release before returning).
set -u
root=$1; case=$2; shift 2
lanes=${RLKIT_GPU_LANES:-1}
# Side-by-side jobs share the host's CPUs: each HostAdamW step gets its lane's share (a job counts only its own ranks).
[ "$lanes" -gt 1 ] && export RLKIT_HOST_THREADS=${RLKIT_HOST_THREADS:-$(( $(nproc) / lanes ))}
mkdir -p "$root"
source "$(dirname "$0")/node_lib.sh"
lane() {
  local gpu=$1; shift
  for util in "$@"; do
    CUDA_VISIBLE_DEVICES=$gpu run_in_session "$case-u$util" python3 -m rlkit.experiments.util_sweep --profile h200 \
        -p "case=$case" -p "gpu_memory_utilization=$util" --out "$root"
  done
}
utils=("$@")
for ((gpu = 0; gpu < lanes; gpu++)); do
  mine=()
  for ((i = gpu; i < ${#utils[@]}; i += lanes)); do mine+=("${utils[$i]}"); done
  [ ${#mine[@]} -gt 0 ] && lane "$gpu" "${mine[@]}" &
done
wait
log "all points done"
