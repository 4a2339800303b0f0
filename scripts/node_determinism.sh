#!/bin/bash
# Reruns the GPU parity checks of notebooks 03 (cast-once + master-on-host, arms A-D), 04 (served vs recomputed
# old log-probs, and the gradients) and 01 (the offload fix: logits after the reload, one train step) on one
# GPU in deterministic mode: every measuring child process runs rlkit.measure.determinism.enable (torch's raising
# torch.use_deterministic_algorithms(True), cuDNN deterministic, no cuDNN benchmark, fixed seeds) with
# CUBLAS_WORKSPACE_CONFIG=:4096:8 in its environment from the launcher. Each experiment records, per check, the
# max abs difference patched vs unpatched next to the unpatched run against itself (metrics.json "determinism"),
# and the name of any op torch refuses to run deterministically.
#
# usage (repo root of a copy of the tree; python3 with torch + transformers; verl, vllm, ray not needed):
#   RLKIT_GIT_SHA=<commit> scripts/node_determinism.sh [<results root>]        (default root: $OUT)
# Results: <root>/<notebook>/h200-deterministic/{params.yaml,env.json,metrics.json}; each experiment's console in
# <root>/<notebook>.console.log, progress lines in <root>/progress.txt. Through the device tool (at most 8 files
# come back): scripts/node_determinism.sh /tmp/res; tar -C /tmp/res -czf $OUT/node_determinism.tgz .
#
# Budget: the limits below add up to 455 s (485 s with timeout's 10 s kill grace each), inside 9 minutes. Measured
# on an H200 (torch 2.11.0+cu130, outputs/*/h200-deterministic): 03 221 s (arms 40-45 s, step 1 about 20 s of it:
# lazy init and the host Adam state's first touch), 04 29 s, 01 158 s with forward_first=[false, true] (rows of
# about 30 s, the 2-rank check about 40 s); expected total here about 5.5 minutes. Shrunk from the h200 profiles:
# - 03: steps=2 (the minimum: step 2 is the one that catches a stale bf16 copy), arm_timeout_s=70 (an arm that
#   hangs is recorded as a timeout and the others still fit the limit); 4 arms + the repeat of arm A.
# - 04: num_sequences=32 (4 micro-batches of 8; the h200 profile's 128 only repeats the same kernels 4x) and
#   timing_repeats=2 (the first and the last old pass are the unskipped run against itself).
# - 01: use_orig_params=[false] and forward_first=[false]: the rows the patch acts on, offloaded before any forward
#   as verl does (use_orig_params=True it leaves alone by construction; both are in outputs/01_offload_bug/h200);
#   2 rows of the 735M model, then the 2-rank gradient check, which on a 1-GPU node runs on CPU with gloo.
set -u
root=${1:-${OUT:?give a results root or set OUT}}
mkdir -p "$root"
source "$(dirname "$0")/node_lib.sh"

# run_experiment NOTEBOOK MODULE LIMIT_S [-p KEY=VALUE ...]: the h200 profile + deterministic=true + overrides.
run_experiment() {
  local notebook=$1 module=$2 limit=$3; shift 3
  run_in_session "$notebook" timeout -k 10 "$limit" python3 -m "rlkit.experiments.$module" --profile h200 \
      -p deterministic=true "$@" --tag h200-deterministic --out "$root"
}

run_experiment 03_cast_once cast_once 280 -p steps=2 -p arm_timeout_s=70
run_experiment 04_skip_old_logprob skip_old_logprob 45 -p num_sequences=32 -p timing_repeats=2
run_experiment 01_offload_bug offload_bug 130 -p 'use_orig_params=[false]' -p 'forward_first=[false]'
log "all experiments done"
