#!/bin/bash
# Runs the seed's arms of notebook 05 one after the other on a GPU node, each in a fresh verl launch.
# usage: scripts/node_grpo_arms.sh <results root> <arm> [<arm> ...]     (arms: rlkit.grpo.ARMS)
# Progress lines go to <root>/progress.txt; each arm's console to <root>/<arm>.console.log; results to
# <root>/05_grpo_qwen3_4b/<arm>/ (or <arm>.failed/). Between arms every Ray / vLLM process left behind
# is stopped and the GPUs are given time to drain: vLLM's start-up memory check and profiling read
# device-wide free memory, so the next arm must start on idle GPUs. The launcher stops verl's whole
# session (Ray, vLLM workers) itself; the launcher runs in a session of its own, which is stopped
# by id afterwards (a name pattern would also match any shell whose command line contains it).
set -u
root=$1; shift
mkdir -p "$root"
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
log() { echo "$(date +%T) $*" >> "$root/progress.txt"; }
idle_gpus() {
  for _ in $(seq 60); do
    used=$(nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits | sort -n | tail -1)
    [ "${used:-0}" -lt 1024 ] && return 0
    sleep 2
  done
  log "GPUs still hold ${used} MiB after 120 s"
}
for arm in "$@"; do
  log "arm $arm start"
  setsid python3 -m rlkit.grpo launch --profile h200 --arm "$arm" --out "$root" > "$root/$arm.console.log" 2>&1 &
  pid=$!
  wait $pid
  status=$?
  log "arm $arm exit $status"
  pkill -9 -s "$pid"   # the launch's session: verl, Ray, vLLM workers
  idle_gpus
done
log "all arms done"
