#!/bin/bash
# Issue 24 item 1 on a GPU node, from the repository root: the gen phase's ceiling, standalone vLLM at notebook 05's
# batch and lengths (python -m rlkit.experiments.vllm_ceiling), one profile after the other, each in a fresh process.
# Needs the rlkit bundle's vLLM 0.24.0 + verl 0.9.1 on PYTHONPATH (docs/offline-node.md); one GPU per profile
# (the h200 profile's two replicas are measured as one: 128 of its 256 sequences).
# usage: scripts/node_vllm_ceiling.sh <results root> [<profile> ...]   (default profile: h200-seed)
# Writes <root>/_node/vllm_standalone/<profile>/{params.yaml,env.json,metrics.json,plugin_records/}, each profile's
# console (vLLM's own lines too: its KV cache size) in <root>/vllm-<profile>.console.log, progress lines in
# <root>/progress.txt. Exit status: 1 if any profile wrote no results, else 0.
set -u
root=${1:?give a results root}; shift
[ $# -gt 0 ] || set -- h200-seed
mkdir -p "$root"
cd "$(dirname "$0")/.." || exit 1
source scripts/node_lib.sh
idle_gpu() {  # vLLM's start-up check reads device-wide free memory: the previous profile's engine must be gone
  for _ in $(seq 60); do
    used=$(nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits | head -1)
    [ "${used:-0}" -lt 1024 ] && return 0
    sleep 2
  done
  log "GPU still holds ${used} MiB after 120 s"
}
failed=0
for profile in "$@"; do
  idle_gpu
  run_in_session "vllm-$profile" python3 -m rlkit.experiments.vllm_ceiling --profile "$profile" --out "$root"
  grep -q '^results: ' "$root/vllm-$profile.console.log" || failed=1
done
log "all profiles done"
exit "$failed"
