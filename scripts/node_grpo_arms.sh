#!/bin/bash
# Runs the seed's arms of notebook 05 one after the other on a GPU node, each in a fresh verl launch.
# usage: scripts/node_grpo_arms.sh <results root> <arm> [<arm> ...]     (arms: rlkit.recipes.grpo.ARMS)
# RLKIT_PROFILE picks notebook 05's profile (default h200; h200-seed is the seed's workload, issue 23); each
# arm's results folder is "<profile>-<arm>" for any other profile, so runs of different shapes never share a name.
# RLKIT_GRPO_ARGS adds -p overrides to every arm's launch, and RLKIT_TAG_SUFFIX names those folders apart, e.g. the
# seed workload's arm 1 on padded SDPA (issue 23):
#   RLKIT_PROFILE=h200-seed RLKIT_GRPO_ARGS="-p attn_implementation=sdpa -p use_remove_padding=false" \
#       RLKIT_TAG_SUFFIX=-padded scripts/node_grpo_arms.sh /scratch/arms 1-fixes-hostadamw
# The pseudo-arm "gpu-tests" runs the GPU tests of the patches the arms use (pytest -m gpu) first, its
# console in <root>/gpu-tests.console.log: a few seconds that check the patches on this node before the arms.
# Progress lines go to <root>/progress.txt; each arm's console to <root>/<arm>.console.log; results to
# <root>/05_grpo_qwen3_4b/<arm>/. Between arms the GPUs are given time to drain: vLLM's start-up memory
# check and profiling read device-wide free memory, so the next arm must start on idle GPUs.
set -u
root=$1; shift
mkdir -p "$root"
profile=${RLKIT_PROFILE:-h200}
prefix=$([ "$profile" = h200 ] || echo "$profile-")
suffix=${RLKIT_TAG_SUFFIX:-}
read -r -a grpo_args <<< "${RLKIT_GRPO_ARGS:-}"
source "$(dirname "$0")/node_lib.sh"
idle_gpus() {
  for _ in $(seq 60); do
    used=$(nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits | sort -n | tail -1)
    [ "${used:-0}" -lt 1024 ] && return 0
    sleep 2
  done
  log "GPUs still hold ${used} MiB after 120 s"
}
for arm in "$@"; do
  if [ "$arm" = gpu-tests ]; then
    run_in_session gpu-tests python3 -m pytest -m gpu -v -rA -p no:cacheprovider tests/test_host_adamw.py \
        tests/test_metric_entropy.py tests/test_varlen_attention.py tests/test_chunked_logprobs.py \
        tests/test_compiled_patches.py
  else
    run_in_session "$prefix$arm$suffix" python3 -m rlkit.experiments.grpo launch --profile "$profile" --arm "$arm" \
        "${grpo_args[@]}" --tag "$prefix$arm$suffix" --out "$root"
  fi
  idle_gpus
done
log "all arms done"
