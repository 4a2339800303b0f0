#!/bin/bash
# Issue 24 item 2 on a GPU node, from the repository root: one profiled update of the seed's workload
# (python -m rlkit.experiments.update_profile, profile h200: Qwen3-4B bf16 on one GPU, ~2 min), then the tests behind
# it: the update profiler's (the trace analysis on hand-made events, and the tiny model on the GPU: the CUDA trace's
# kernels, launches and syncs), HostAdamW's overlapped copies against its serial step (bit-identical, on the GPU) and
# the compiled RMSNorm, rotary and SwiGLU against eager (tests/test_compiled_patches.py, on the node's torch). The
# profile goes first so that a lease ending during the tests (session 9's did) still brings it back; it checks
# itself where it can (compiled_pointwise refuses at its first call if it is not eager's bit for bit), and its
# results count only with the tests' exit status, which this script returns.
# Needs only the node's torch + transformers (no verl, vllm, flash-attn); nothing to install.
# usage: scripts/node_update_profile.sh [<results root> [-p key=value ... --tag TAG]]   (default root: $OUT; the
# arguments after the root go to the experiment, e.g. -p optimizer=none --tag h200-fwd-bwd)
# Writes <root>/gpu_tests.log, <root>/update_profile.console.log,
# <root>/update_profile/<tag>/{params.yaml,env.json,metrics.json,trace.json.gz,SUMMARY.md} (tag: h200 unless given),
# progress lines in <root>/progress.txt.
# Exit status: the tests' if they failed, else the profile's. RLKIT_PROFILE_ONLY=1 takes the profile alone (a second
# profile in the same lease: the tests do not depend on the profile's parameters, so one run of them is enough).
set -u
root=${1:-${OUT:?give a results root or set OUT}}
[ $# -gt 0 ] && shift
mkdir -p "$root"
cd "$(dirname "$0")/.." || exit 1
source scripts/node_lib.sh
run_in_session update_profile python3 -m rlkit.experiments.update_profile --profile h200 --out "$root" "$@"
profiled=$(grep -c '^results: ' "$root/update_profile.console.log")
[ "${RLKIT_PROFILE_ONLY:-0}" = 1 ] && { [ "$profiled" -eq 1 ]; exit $?; }
log "gpu tests start"
python3 -m pytest tests/test_trace_summary.py tests/test_update_profile.py::test_tiny_model_on_the_gpu -v -rA \
    tests/test_host_adamw.py::test_overlapped_copies_are_bit_identical_to_the_serial_step_on_the_gpu \
    tests/test_compiled_patches.py \
    -p no:cacheprovider > "$root/gpu_tests.log" 2>&1
tests=$?
log "gpu tests exit $tests"
[ "$tests" -ne 0 ] && exit "$tests"
[ "$profiled" -eq 1 ] || exit 1
