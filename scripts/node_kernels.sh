#!/bin/bash
# Issue 23 on a GPU node, from the repository root: the GPU tests of chunked_logprobs and varlen_attention, then
# the kernel benchmark (python -m rlkit.experiments.kernels, profile h200: Qwen3-4B bf16 on one GPU, ~3-4 min).
# Needs only the node's torch + transformers (no verl, vllm, flash-attn); nothing to install.
# usage: scripts/node_kernels.sh [<results root>]   (default: $OUT)
# Writes <root>/gpu_tests.log, <root>/kernels.console.log, <root>/kernels/h200/{params.yaml,env.json,metrics.json},
# progress lines in <root>/progress.txt. Exit status: the tests' if they failed, else the benchmark's.
set -u
root=${1:-${OUT:?give a results root or set OUT}}
mkdir -p "$root"
cd "$(dirname "$0")/.." || exit 1
source scripts/node_lib.sh
log "gpu tests start"
python3 -m pytest -m gpu tests/test_chunked_logprobs.py tests/test_varlen_attention.py -v -rA -p no:cacheprovider \
    > "$root/gpu_tests.log" 2>&1
tests=$?
log "gpu tests exit $tests"
run_in_session kernels python3 -m rlkit.experiments.kernels --profile h200 --out "$root"
bench=$(grep -c '^results: ' "$root/kernels.console.log")
[ "$tests" -ne 0 ] && exit "$tests"
[ "$bench" -eq 1 ] || exit 1
