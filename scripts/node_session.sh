#!/bin/bash
# One device session's GPU work on the node, job after job, from the repository root. Start it detached and poll for
# ROOT/DONE, which it writes last (a file test always matches; a process pattern may not):
#   setsid nohup scripts/node_session.sh /tmp/s resume-test learning profile-overlap > /tmp/s.log 2>&1 &
#   ... later calls: cat /tmp/s/progress.txt; test -e /tmp/s/DONE
# Needs the bundle on PYTHONPATH for every job but the profile-* ones (docs/offline-node.md); set RLKIT_GIT_SHA when the
# tree is a copy without .git. Each job writes ROOT/<job>/ (its own progress.txt and consoles); ROOT/progress.txt has
# each job's start and exit status. RLKIT_DRY_RUN=1 prints each job's command instead of running it.
# Jobs (issue in brackets):
#   resume-test       checkpoint and resume through verl with every patch, on the GPU (25)
#   learning          notebook 07's runs, one of each side per lease (launch_limit 2), runs in ROOT/learning/runs after
#                     a copy of the committed ones (outputs/07_does_it_learn/h200-fast-runs: read back, not launched
#                     again); results tagged h200-fast, as the h200 profile's comment renders them. Nothing else on the
#                     card: session 29's two runs stopped beside the parity reruns (25, 46)
#   learning-2gpu     the same on two ranks (profile h200-2gpu; a node with two GPUs), committed runs in
#                     outputs/07_does_it_learn/h200-2gpu-runs (46)
#   profile-base      one update profiled with neither lever, the same commit's base for the two below (24)
#   profile-overlap   one update profiled with HostAdamW's overlapped copies (24)
#   profile-compiled  one update profiled with the compiled RMSNorm, rotary and SwiGLU, then the GPU tests of both
#                     levers and of the profiler (24)
#   profile-levers    one update profiled with both levers (24)
#   profile-sac       one update profiled with selective checkpointing of all 36 layers (the profile has the whole
#                     H200; 18 with RLKIT_PROFILE_GPU=h100, where 36 ran out of memory): the recompute it removes at
#                     most, against profile-base of the same lease (42)
#   profile-prefetch  one update profiled with HostAdamW's gradient prefetch: the optimizer's share of the update
#                     against profile-base of the same lease (42)
#   profile-best      profile-levers with the gradient prefetch: the prefetch on top of the other levers (42)
#   prefetch-test     the gradient prefetch on CUDA streams and pinned buffers, in verl's optimizer_step sequence, against
#                     the serial step, bit for bit, in deterministic mode (no verl needed) (42)
#   gqa-test          rlkit_varlen's flash kernel with its own grouped-query mapping against repeated K/V heads, bit for
#                     bit, and both timed (24)
#   kernels-liger     Qwen3's RMSNorm, rotary and SwiGLU at the seed's 24,576 tokens: eager, rlkit's compiled patches and
#                     liger-kernel (bundle --with-kernels, or its wheel alone unzipped onto PYTHONPATH: the job
#                     needs no verl or vLLM), fwd+bwd time and exactness against eager (42)
#   vllm-ceiling      standalone vLLM at the seed profile's batch and lengths (24)
#   vllm-ceiling-1gpu  standalone vLLM at the h200-1gpu profile's batch and lengths (24)
#   seed-arms         arms 1 and 5 at the seed's workload (23)
#   seed-arm0         arm 0 (stock) at the seed's workload; its failure is the result the planner predicts (41)
#   seed-arm1         arm 1 alone at the seed's workload: the arc's arm, and the base of seed-padded and seed-unfused
#                     at the same lr (23, 41)
#   seed-arm2         arm 2 (the old-log-prob skip) at the seed's workload (41)
#   seed-arm3         arm 3 (pinned host buffers) at the seed's workload (41)
#   seed-arm4         arm 4 at the seed's workload: its rank-0 owner is a no-op on one GPU, so it runs arm 3's work (41)
#   seed-padded       arm 1 at the seed's workload with padded SDPA at 12,288 tokens per micro-batch, the largest the
#                     planner fits on the 47.4 GiB card padded (24,576: 56.6 GiB), for the 1.3x update tokens/s target (23)
#   seed-unfused      arm 1 at the seed's workload with verl's unfused full logits; an OOM is the result (23)
#   seed-overlap      arm 5 at the seed's workload with the overlapped copies, no rank-0 owner on one GPU (24)
#   seed-prefetch     seed-overlap with HostAdamW's gradient prefetch: the optimizer share of update_actor against
#                     seed-overlap of the same commit (42)
#   seed-poll         arm 5 at the seed's workload with verl's replay-buffer poll at 0.2 s (24)
#   seed-compiled     arm 5 at the seed's workload with the compiled RMSNorm, rotary and SwiGLU (24)
#   seed-arm5         arm 5 alone at the seed's workload: the arc's arm, and the base of seed-levers at the same
#                     commit (24, 41)
#   seed-levers       arm 5 at the seed's workload with every lever: the overlapped copies (no rank-0 owner on one
#                     GPU), the compiled RMSNorm, rotary and SwiGLU, and the replay-buffer poll at 0.2 s (24)
#   seed-sac          arm 5 at the seed's workload with selective checkpointing of as many layers as pre-flight's
#                     planner fits on the 47.4 GiB card (the run records the count): update_actor, MFU, peak against
#                     seed-arm5 of the same commit (42)
#   seed-util         arm 5 at the seed's workload with vLLM's gpu_memory_utilization at 0.95 instead of 0.85: the KV pool
#                     from the memory arm 5 frees (the planner says vLLM still starts: tests/test_budget.py), gen against
#                     seed-arm5 of the same commit (42)
#   seed-best         seed-levers with vLLM's gpu_memory_utilization at 0.95: every lever that keeps the numbers
#                     bit-identical or the sampled distribution unchanged and made its phase faster, against seed-arm5 of
#                     the same commit and lease (42; the gradient prefetch made the profiled update slower in session
#                     26, so seed-prefetch measures it alone)
#   h200-1gpu-arm5    arm 5 at the h200 profile's shape on one GPU: the base of h200-1gpu-fast at the same commit (24)
#   h200-1gpu-fast    arm 5 at that shape with the workload levers (remove-padding with rlkit_varlen, chunked log-probs,
#                     24,576 tokens per micro-batch) and every lever of seed-levers (24)
# usage: scripts/node_session.sh ROOT JOB...   (RLKIT_PROFILE_GPU=h100 names the profile-* folders h100-*, not h200-*)
set -u
root=${1:?give a results root}; shift
[ $# -gt 0 ] || { echo "give one or more jobs (see the header of $0)" >&2; exit 2; }
cd "$(dirname "$0")/.." || exit 1

arm_of() {  # the arm (rlkit.recipes.grpo.ARMS) a seed-arm<N> job runs
  local arms=(0-stock 1-fixes-hostadamw 2-skip-old-logprob 3-pinned 4-rank0-owner 5-master-on-host-cast-once)
  echo "${arms[$1]}"
}

set_job() {  # cmd=(the command of job $2), its results under $1; reads_back: committed runs the job reads back
  reads_back=""
  local dir=$1 job=$2 seed=(env RLKIT_PROFILE=h200-seed) one_gpu=(env RLKIT_PROFILE=h200-1gpu) padded workload
  local overlap="-p host_rank0_owner=false -p host_overlap_copies=true" levers gpu=${RLKIT_PROFILE_GPU:-h200}
  local profile_levers=(-p overlap_copies=true -p rmsnorm=compiled -p pointwise=compiled)  # the update profile's fields
  local sac_layers=36  # all layers fit the H200's 141 GB; on the H100's 79.2 GiB 36 ran out of memory, 18 fit
  if [ "$gpu" = h100 ]; then sac_layers=18; fi
  levers="$overlap -p rmsnorm=compiled -p pointwise=compiled"
  levers+=" -p replay_poll_s=0.2"
  case $job in
    resume-test) cmd=(python3 -m pytest -m gpu -v -rA -p no:cacheprovider tests/test_checkpoint_resume.py) ;;
    learning) cmd=(python3 -m rlkit.experiments.learning --profile h200 --tag h200-fast --out "$dir" -p "runs_dir=$dir/runs"
                   -p launch_limit=2)
              reads_back=outputs/07_does_it_learn/h200-fast-runs ;;
    learning-2gpu) cmd=(python3 -m rlkit.experiments.learning --profile h200-2gpu --tag h200-2gpu --out "$dir"
                        -p "runs_dir=$dir/runs" -p launch_limit=2)
                   reads_back=outputs/07_does_it_learn/h200-2gpu-runs ;;
    profile-base) cmd=(env RLKIT_PROFILE_ONLY=1 scripts/node_update_profile.sh "$dir" --tag "$gpu-base") ;;
    profile-overlap) cmd=(env RLKIT_PROFILE_ONLY=1 scripts/node_update_profile.sh "$dir" -p overlap_copies=true
                          --tag "$gpu-overlap") ;;
    profile-levers) cmd=(env RLKIT_PROFILE_ONLY=1 scripts/node_update_profile.sh "$dir" "${profile_levers[@]}"
                         --tag "$gpu-levers") ;;
    profile-sac) cmd=(env RLKIT_PROFILE_ONLY=1 scripts/node_update_profile.sh "$dir" -p "selective_layers=$sac_layers"
                      --tag "$gpu-sac$sac_layers") ;;
    profile-compiled) cmd=(scripts/node_update_profile.sh "$dir" -p rmsnorm=compiled -p pointwise=compiled
                           --tag "$gpu-compiled") ;;
    profile-prefetch) cmd=(env RLKIT_PROFILE_ONLY=1 scripts/node_update_profile.sh "$dir" -p prefetch_grads=true
                           --tag "$gpu-prefetch") ;;
    profile-best) cmd=(env RLKIT_PROFILE_ONLY=1 scripts/node_update_profile.sh "$dir" "${profile_levers[@]}"
                       -p prefetch_grads=true --tag "$gpu-best") ;;
    prefetch-test) cmd=(env CUBLAS_WORKSPACE_CONFIG=:4096:8 python3 -m pytest -m gpu -v -rA -p no:cacheprovider
                        tests/test_grad_prefetch_gpu.py) ;;
    gqa-test) cmd=(python3 -m pytest -m gpu -v -rA -s -p no:cacheprovider tests/test_varlen_attention.py -k gqa) ;;
    kernels-liger) cmd=(python3 -m rlkit.experiments.elementwise_kernels --profile h200 --out "$dir") ;;
    vllm-ceiling) cmd=(scripts/node_vllm_ceiling.sh "$dir" h200-seed) ;;
    vllm-ceiling-1gpu) cmd=(scripts/node_vllm_ceiling.sh "$dir" h200-1gpu) ;;
    seed-arms) cmd=("${seed[@]}" scripts/node_grpo_arms.sh "$dir" 1-fixes-hostadamw 5-master-on-host-cast-once) ;;
    seed-arm[0-5]) cmd=("${seed[@]}" scripts/node_grpo_arms.sh "$dir" "$(arm_of "${job#seed-arm}")") ;;
    seed-padded) padded="-p attn_implementation=sdpa -p use_remove_padding=false -p ppo_max_token_len_per_gpu=12288"
                 cmd=("${seed[@]}" "RLKIT_GRPO_ARGS=$padded" RLKIT_TAG_SUFFIX=-padded-tok12288 scripts/node_grpo_arms.sh "$dir" 1-fixes-hostadamw) ;;
    seed-unfused) cmd=("${seed[@]}" "RLKIT_GRPO_ARGS=-p logits=full -p expect_failure=true" RLKIT_TAG_SUFFIX=-unfused
                       scripts/node_grpo_arms.sh "$dir" 1-fixes-hostadamw) ;;
    seed-overlap) cmd=("${seed[@]}" "RLKIT_GRPO_ARGS=$overlap" RLKIT_TAG_SUFFIX=-overlap scripts/node_grpo_arms.sh "$dir" 5-master-on-host-cast-once) ;;
    seed-prefetch) cmd=("${seed[@]}" "RLKIT_GRPO_ARGS=$overlap -p host_prefetch_grads=true" RLKIT_TAG_SUFFIX=-prefetch
                        scripts/node_grpo_arms.sh "$dir" 5-master-on-host-cast-once) ;;
    seed-poll) cmd=("${seed[@]}" "RLKIT_GRPO_ARGS=-p replay_poll_s=0.2" RLKIT_TAG_SUFFIX=-poll0.2
                    scripts/node_grpo_arms.sh "$dir" 5-master-on-host-cast-once) ;;
    seed-compiled) cmd=("${seed[@]}" "RLKIT_GRPO_ARGS=-p rmsnorm=compiled -p pointwise=compiled"
                        RLKIT_TAG_SUFFIX=-compiled scripts/node_grpo_arms.sh "$dir" 5-master-on-host-cast-once) ;;
    seed-levers) cmd=("${seed[@]}" "RLKIT_GRPO_ARGS=$levers" RLKIT_TAG_SUFFIX=-levers
                      scripts/node_grpo_arms.sh "$dir" 5-master-on-host-cast-once) ;;
    seed-sac) cmd=("${seed[@]}" "RLKIT_GRPO_ARGS=-p activation_checkpointing=selective" RLKIT_TAG_SUFFIX=-sac
                   scripts/node_grpo_arms.sh "$dir" 5-master-on-host-cast-once) ;;
    seed-util) cmd=("${seed[@]}" "RLKIT_GRPO_ARGS=-p gpu_memory_utilization=0.95" RLKIT_TAG_SUFFIX=-util0.95
                    scripts/node_grpo_arms.sh "$dir" 5-master-on-host-cast-once) ;;
    seed-best) cmd=("${seed[@]}" "RLKIT_GRPO_ARGS=$levers -p gpu_memory_utilization=0.95"
                    RLKIT_TAG_SUFFIX=-best scripts/node_grpo_arms.sh "$dir" 5-master-on-host-cast-once) ;;
    h200-1gpu-arm5) cmd=("${one_gpu[@]}" scripts/node_grpo_arms.sh "$dir" 5-master-on-host-cast-once) ;;
    h200-1gpu-fast) workload="-p attn_implementation=rlkit_varlen -p use_remove_padding=true -p logits=chunked"
                    workload+=" -p ppo_max_token_len_per_gpu=24576"
                    cmd=("${one_gpu[@]}" "RLKIT_GRPO_ARGS=$workload $levers" RLKIT_TAG_SUFFIX=-fast
                         scripts/node_grpo_arms.sh "$dir" 5-master-on-host-cast-once) ;;
    *) return 1 ;;
  esac
}

for job in "$@"; do  # every name first, so that a typo does not surface an hour in
  set_job "$root/$job" "$job" || { echo "unknown job '$job' (see the header of $0)" >&2; exit 2; }
done
if [ "${RLKIT_DRY_RUN:-0}" = 1 ]; then
  for job in "$@"; do
    set_job "$root/$job" "$job"; echo "$job: $(printf '%q ' "${cmd[@]}")"
    [ -z "$reads_back" ] || echo "$job reads back the runs in $reads_back" >&2
  done
  exit 0
fi
mkdir -p "$root"
rm -f "$root/DONE"
source scripts/node_lib.sh
status=0
for job in "$@"; do
  mkdir -p "$root/$job"
  set_job "$root/$job" "$job"
  if [ -n "$reads_back" ] && [ -d "$reads_back" ]; then  # earlier leases' runs, committed: read back, not launched again
    mkdir -p "$root/$job/runs" && cp -r "$reads_back"/. "$root/$job/runs"/
  fi
  run_in_session "$job/$job" "${cmd[@]}"
  code=$(tail -1 "$root/progress.txt" | awk '{print $NF}')
  [ "$code" = 0 ] || status=1
done
log "all jobs done (status $status)"
echo "$status" > "$root/DONE"
exit "$status"
