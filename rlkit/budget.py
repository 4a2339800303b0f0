"""Phase-budget planner for colocated verl + vLLM GRPO: device and host GiB per phase, before booking a GPU.

Pure arithmetic: this module never imports torch, CUDA or verl. All memory figures are GiB (2**30 bytes).

:func:`plan` derives every byte from a model config (a transformers ``config.json`` dict or a preset)
   and the run settings, for FSDP1 with ``NO_SHARD`` (each rank holds the whole model: verl's
   ``fsdp_size=1``, or one GPU), bf16 mixed precision and a colocated vLLM rollout. Its assumptions
   are stated where each term is computed (see :func:`phase_components`). Two choices of verl change the
   micro-batch terms most: the logits path (:data:`LOGITS_BYTES`: full logits, or log-probs from the hidden
   states in chunks, :data:`CHUNKED_LOGITS`) and remove-padding (:func:`micro_batch_positions`).

Also: the document's cost metric (:func:`cost_per_million_samples`). Source document 003's own table,
notebook 00's option sets and the ``rlkit budget`` command line are :mod:`rlkit.experiments.phase_budget`.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace
from typing import Any

from rlkit.model_shape import ModelShape, kv_bytes_per_seq, resolve_model
from rlkit.params import ParamError

GIB = 1024**3












# ---------------------------------------------------------------------------------------------------
# 1. The derived planner
# ---------------------------------------------------------------------------------------------------

PHASES = ("rollout", "log_prob", "update_fwd_bwd", "optimizer_step", "weight_sync")
DEVICE_COMPONENTS = (
    "vllm_weights_bf16", "kv_pool", "cuda_graphs", "non_torch", "actor_non_torch", "master_fp32", "stale_offload_copy",
    "compute_copy_bf16", "grads_fp32", "adam_moments", "activations", "logits", "staging",
)
HOST_COMPONENTS = ("master_fp32", "adam_moments", "staging_pinned")
# The actor's own allocations (what torch.cuda.max_memory_allocated of the actor counts); the other device
# components are vLLM's and the two processes' memory outside torch's allocator.
ACTOR_ALLOCATED_COMPONENTS = ("master_fp32", "stale_offload_copy", "compute_copy_bf16", "grads_fp32", "adam_moments",
                              "activations", "logits", "staging")
RLKIT_OPTIONS = ("offload_views", "cpu_optimizer_step", "rank0_owner", "master_on_host", "cast_once", "skip_old_logprob",
                 "compiled_pointwise")

# Bytes held per logit element (micro-batch tokens x vocabulary) while log-probs are computed.
# torch_rowwise: verl 0.9.1's engine without flash-attn (verl.utils.torch_functional.logprobs_from_logits_v2,
#           bf16 branch): the bf16 lm_head output (2) + the copy of its valid-token rows (2, torch.cat in
#           prepare_model_outputs) + the per-row log-softmax outputs autograd keeps (2) + their gradient in
#           backward (2) = 8 in training. Forward-only passes keep 4, but verl computes the entropy there
#           (entropy_from_logits: an fp32 temporary (4) and the bf16 softmax (2) next to the logits (2)),
#           which peaks at 8 before the log-prob temporaries exist. Checked against the 2 x H200 arms of
#           outputs/05_grpo_qwen3_4b/ (tests/test_budget.py). An entropy in the update: see UPDATE_ENTROPY_BYTES.
# torch_fp32: an fp32 upcast of the logits (4) + fp32 log-softmax (4) next to the bf16 output (2); a
#           conservative bound, the planner's default before it was checked against verl 0.9.1.
# flash_ce: verl's path when flash-attn is installed: bf16 logits (2) + their bf16 gradient (2) in training,
#           the bf16 logits alone in a forward-only pass; the fused cross-entropy keeps no fp32 copy.
# The chunked paths (CHUNKED_LOGITS) never hold the micro-batch's logits: their bytes are per element of ONE chunk.
# chunked_logprobs: rlkit's patch of that name (rlkit.patches.chunked_logprobs, under verl's use_fused_kernels):
#           fp32 logits of the chunk (4) + one fp32 temporary (4, logsumexp's or exp's); 2 more when backward
#           also differentiates the entropy.
# verl_fused: verl 0.9.1's use_fused_kernels=True, torch backend (verl.utils.experimental.torch_functional.
#           FusedLinearForPPOFunction, 512 rows): forward the fp32 logits, softmax and two temporaries (12);
#           backward recomputes them beside a one-hot, (one-hot - p) and the fp32/bf16 logit gradients (24),
#           4 more with an entropy gradient.
LOGITS_BYTES = {"torch_rowwise": {"train": 8, "forward": 8}, "torch_fp32": {"train": 10, "forward": 10},
                "flash_ce": {"train": 4, "forward": 2},
                "chunked_logprobs": {"train": 8, "forward": 8}, "verl_fused": {"train": 24, "forward": 12}}
# Per chunked path: rows per chunk (rlkit.patches.chunked_logprobs.CHUNK_ROWS; verl's FusedLinearForPPO
# chunk_size), extra bytes per chunk element when the entropy is backpropagated, and bytes per lm_head weight
# element (vocab x hidden) the update's backward holds beside the chunk: chunked_logprobs sums the weight
# gradient in fp32 (4); verl_fused sums it in the weight's bf16 (2) plus each chunk's bf16 partial (2).
# Measured on one H200 (torch 2.11, bf16 hidden states and weight of Qwen3-4B's lm_head, 8192 and 16384 rows,
# peak allocated above the inputs; tests/test_budget.py::test_chunked_logits_paths_match_the_measured_peak
# re-measures it): chunked_logprobs at 4096-row chunks 4.64 GiB forward, 6.19 training, 7.29 with the entropy
# gradient; verl_fused 0.87, 3.23, 3.52; each within 0.05 GiB of these bytes (+ the hidden states' gradient),
# the same at both row counts.
CHUNKED_LOGITS = {"chunked_logprobs": {"chunk_rows": 2048, "entropy_backprop": 2, "lm_head_grad": 4},
                  "verl_fused": {"chunk_rows": 512, "entropy_backprop": 4, "lm_head_grad": 4}}
# Extra bytes per logit element in the update when it computes the entropy (calculate_entropy, or
# entropy_coeff != 0; the on-policy skip turns it on for the actor/entropy metric):
# none:     no entropy in the update.
# detached: computed in the forward only (checkpointed, and kept out of backward: entropy_coeff 0 with the
#           metric_entropy patch), which also runs it in 1024-row chunks, so its forward temporaries (softmax
#           and product, fp32 under autocast) are one chunk, inside the training peak above. Before the
#           chunks, the skip arms at 55ddd39 peaked 6.36 GiB above 1-fixes-hostadamw (outputs/05_grpo_qwen3_4b/,
#           ~5.5 bytes per logit element of their 8192-token micro-batches; the planner is x0.92 on them).
# backprop: backward recomputes entropy_from_logits (verl 0.9.1 adds -0 x entropy to the loss, or a real
#           entropy bonus): the bf16 softmax (2) and an fp32 temporary (4) on top of the log-prob backward's
#           buffers. outputs/05_grpo_qwen3_4b/2-skip-old-logprob-entropy-backprop ran out of the card in that recompute.
UPDATE_ENTROPY_BYTES = {"none": 0, "detached": 0, "backprop": 6}


@dataclass(frozen=True)
class PlanSpec:
    """Inputs of :func:`plan`. Memory in GiB; lengths and micro-batches in tokens; per-GPU where named."""

    model: str = "qwen3-4b"  # preset name, HF id matching a preset, or path to config.json
    gpu_gib: float = 47.4  # device memory as torch reports it (an RTX A6000 48 GB: 47.4 GiB)
    n_gpus: int = 2  # data-parallel ranks (NO_SHARD replicas) on all nodes together, one vLLM engine per GPU (TP=1)
    nodes: int = 1  # nodes the n_gpus ranks are spread over evenly (verl trainer.nnodes); host memory is per node
    gpu_memory_utilization: float = 0.85  # vLLM: fraction of TOTAL device memory for weights+KV+graphs
    max_prompt_length: int = 2048
    max_response_length: int = 10240
    train_batch_size: int = 32  # prompts per step
    group_size: int = 8  # responses per prompt (rollout.n)
    micro_batch_tokens: int = 24576  # actual tokens per update micro-batch per GPU (ppo_max_token_len_per_gpu)
    log_prob_micro_batch_tokens: int = 24576  # actual tokens per forward-only micro-batch per GPU
    lora_rank: int = 0  # 0 = full fine-tune
    gradient_checkpointing: bool = True
    # layers checkpointed selectively (the selective_checkpoint patch): each keeps its matmul and attention outputs
    # through the update (see _selective_elems_per_token_layer); 0 = every layer fully checkpointed
    selective_layers: int = 0
    param_offload: bool = True  # verl fsdp_config.param_offload
    optimizer_offload: bool = True  # verl fsdp_config.optimizer_offload
    cudagraph_gib: float = 1.0  # vLLM's captured CUDA graphs (it logs the size); 0 with enforce_eager
    non_torch_gib: float = 0.5  # per process on the card (vLLM's worker, the actor's): CUDA context, NCCL, workspaces
    logits_path: str = "torch_rowwise"  # see LOGITS_BYTES
    logits_chunk_rows: int = 0  # rows per chunk on a chunked logits path; 0 = the path's own (CHUNKED_LOGITS)
    update_entropy: str = "none"  # see UPDATE_ENTROPY_BYTES
    # verl model.use_remove_padding: a micro-batch is packed into its actual tokens; False (the node without
    # flash-attn, verl's default is True) pads every sequence to the micro-batch's longest (see micro_batch_positions)
    remove_padding: bool = False
    mean_response_tokens: float = 0  # expected response length (verl's response_length/mean); 0 = max_response_length
    host_gib: float = 0.0  # host memory per node; 0 = do not check
    # rlkit options
    offload_views: bool = False  # patch: param offload really frees the device copy (FSDP1 NO_SHARD)
    cpu_optimizer_step: bool = False  # HostAdamW: Adam moments and the fp32 step on the host
    rank0_owner: bool = False  # only rank 0 holds host Adam state and broadcasts the fp32 master
    master_on_host: bool = False  # fp32 master parked on the host during fwd/bwd
    cast_once: bool = False  # one resident bf16 compute copy per step instead of a cast per micro-batch
    skip_old_logprob: bool = False  # fully on-policy: the old-log-prob pass is skipped
    compiled_pointwise: bool = False  # patch: rotary + SwiGLU through torch.compile; silu(gate) is not kept for backward

    def __post_init__(self) -> None:
        def bad(key, msg, fix):
            raise ParamError(f"{key}: {msg}. Fix: {fix}")

        if not (self.gpu_gib > 0):
            bad("gpu_gib", f"device memory must be positive, got {self.gpu_gib!r}", "set the GPU's memory in GiB")
        if not (0 < self.gpu_memory_utilization <= 1):
            bad("gpu_memory_utilization", f"must be in (0, 1], got {self.gpu_memory_utilization!r}",
                "use a fraction such as 0.6")
        for key in ("n_gpus", "nodes", "max_prompt_length", "max_response_length", "train_batch_size", "group_size",
                    "micro_batch_tokens", "log_prob_micro_batch_tokens"):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                bad(key, f"must be a positive integer, got {value!r}", "set a positive integer")
        if self.n_gpus % self.nodes:
            bad("nodes", f"{self.n_gpus} GPUs (n_gpus) do not split evenly over {self.nodes} nodes",
                "set n_gpus to the GPUs of all nodes together, a multiple of nodes")
        if isinstance(self.lora_rank, bool) or not isinstance(self.lora_rank, int) or self.lora_rank < 0:
            bad("lora_rank", f"must be an integer >= 0, got {self.lora_rank!r}", "0 for full fine-tune, else the rank")
        for key in ("cudagraph_gib", "non_torch_gib", "host_gib"):
            if getattr(self, key) < 0:
                bad(key, f"must be >= 0 GiB, got {getattr(self, key)!r}", "set a non-negative size in GiB")
        if self.logits_path not in LOGITS_BYTES:
            bad("logits_path", f"{self.logits_path!r} is not one of {sorted(LOGITS_BYTES)}", "pick one of them")
        if isinstance(self.logits_chunk_rows, bool) or not isinstance(self.logits_chunk_rows, int) or self.logits_chunk_rows < 0:
            bad("logits_chunk_rows", f"must be an integer >= 0, got {self.logits_chunk_rows!r}", "0 for the path's own chunk")
        if self.logits_chunk_rows and self.logits_path not in CHUNKED_LOGITS:
            bad("logits_chunk_rows", f"{self.logits_path!r} does not work in chunks", f"0, or a path of {list(CHUNKED_LOGITS)}")
        if not 0 <= self.mean_response_tokens <= self.max_response_length:
            bad("mean_response_tokens", f"must be in [0, max_response_length={self.max_response_length}], got "
                f"{self.mean_response_tokens!r}", "the expected response tokens, or 0 for max_response_length")
        if self.update_entropy not in UPDATE_ENTROPY_BYTES:
            bad("update_entropy", f"{self.update_entropy!r} is not one of {list(UPDATE_ENTROPY_BYTES)}", "pick one of them")
        if isinstance(self.selective_layers, bool) or not isinstance(self.selective_layers, int) or self.selective_layers < 0:
            bad("selective_layers", f"must be an integer >= 0, got {self.selective_layers!r}", "0 (full checkpointing) "
                "or a number of layers")
        if self.selective_layers and not self.gradient_checkpointing:
            bad("selective_layers", "selective checkpointing is a mode of gradient checkpointing",
                "set gradient_checkpointing, or selective_layers: 0")
        if self.rank0_owner and not self.cpu_optimizer_step:
            bad("rank0_owner", "rank-0 ownership is a mode of the host optimizer step", "also set cpu_optimizer_step")
        if self.master_on_host and not self.cpu_optimizer_step:
            bad("master_on_host", "the host master is stepped on the host", "also set cpu_optimizer_step")

    @property
    def options(self) -> list[str]:
        return [o for o in RLKIT_OPTIONS if getattr(self, o)]


def with_options(spec: PlanSpec, options: str | list[str] | tuple[str, ...]) -> PlanSpec:
    """``spec`` with exactly the rlkit options named (a comma-separated string or a list; "" = none)."""
    names = [o.strip() for o in (options.split(",") if isinstance(options, str) else options) if o.strip()]
    unknown = sorted(set(names) - set(RLKIT_OPTIONS))
    if unknown:
        raise ParamError(f"options: unknown rlkit option(s) {unknown}; known: {list(RLKIT_OPTIONS)}")
    return replace(spec, **{o: o in names for o in RLKIT_OPTIONS})


def _activation_elems_per_token_layer(s: ModelShape, compiled_pointwise: bool = False) -> int:
    """bf16 elements one decoder layer saves per token for backward (flash-attention, no N^2 scores).

    Inputs of both RMSNorms and of the q/k/v, gate/up projections (4 x hidden); q and k before and after
    norm/RoPE, v and the attention output (3 x q_dim + 3 x kv_dim); gate, silu(gate), up and their
    product (4 x intermediate). With ``compiled_pointwise`` the SwiGLU is one compiled function whose backward
    recomputes silu(gate) from gate, so only gate, up and the product stay (3 x intermediate). fp32 norm statistics
    and the flash-attention log-sum-exp are ignored.
    """
    return 4 * s.hidden + 3 * s.q_dim + 3 * s.kv_dim + (3 if compiled_pointwise else 4) * s.intermediate


def _selective_elems_per_token_layer(s: ModelShape) -> int:
    """bf16 elements a selectively checkpointed layer keeps per token besides its input (rlkit.patches.
    selective_checkpoint's policy keeps every matmul and attention output): q, k, v and the attention output
    (2 x q_dim + 2 x kv_dim), o_proj and down_proj (2 x hidden), gate and up (2 x intermediate). down_proj's is held
    although full checkpointing never recomputes it (the patch's docstring says why). The attention's log-sum-exp
    (fp32, one per head) is ignored."""
    return 2 * s.q_dim + 2 * s.kv_dim + 2 * s.hidden + 2 * s.intermediate


def step_tokens_per_gpu(spec: PlanSpec) -> float:
    """Actual (unpadded) tokens of one step per GPU: prompts at max_prompt_length, responses at their expected
    length (:attr:`PlanSpec.mean_response_tokens`, or max_response_length)."""
    response = spec.mean_response_tokens or spec.max_response_length
    return spec.train_batch_size * spec.group_size * (spec.max_prompt_length + response) / spec.n_gpus


def micro_batch_positions(spec: PlanSpec, tokens: int) -> float:
    """Token positions the tensors of a micro-batch of ``tokens`` actual tokens hold (its activations and logits).

    Actual tokens are ``tokens`` (verl's dynamic-bsz budget counts a sequence's own length), at most a step's
    tokens per GPU. ``remove_padding``: verl packs them into one row, so that is all. Without it verl pads every
    sequence to the micro-batch's longest (``prepare_model_inputs``: ``to_padded_tensor`` at ``max_seq_len``);
    the planner takes the longest as a full sequence (max_prompt_length + max_response_length) and the others at
    the expected length (prompts counted at max_prompt_length), i.e. actual x full / expected positions. With
    every response at max_response_length (mean_response_tokens 0) both are the actual tokens.
    """
    actual = min(float(tokens), step_tokens_per_gpu(spec))
    if spec.remove_padding:
        return actual
    response = spec.mean_response_tokens or spec.max_response_length
    return actual * (spec.max_prompt_length + spec.max_response_length) / (spec.max_prompt_length + response)


def logits_bytes(spec: PlanSpec, s: ModelShape, positions: float, *, train: bool) -> float:
    """Bytes of the log-prob computation for a micro-batch of ``positions`` rows (update if ``train``, else a
    forward-only pass): rows x vocabulary x :data:`LOGITS_BYTES`, or on a chunked path (:data:`CHUNKED_LOGITS`)
    one chunk's rows instead, plus in the update the lm_head gradient's accumulator (not with LoRA: the
    lm_head is frozen). The entropy: :data:`UPDATE_ENTROPY_BYTES`, per chunk element on a chunked path."""
    per = LOGITS_BYTES[spec.logits_path]["train" if train else "forward"]
    backprop = train and spec.update_entropy == "backprop"
    chunked = CHUNKED_LOGITS.get(spec.logits_path)
    if chunked is None:
        return positions * s.vocab * (per + (UPDATE_ENTROPY_BYTES[spec.update_entropy] if train else 0))
    rows = min(positions, spec.logits_chunk_rows or chunked["chunk_rows"])
    weight = chunked["lm_head_grad"] * s.vocab * s.hidden if train and not spec.lora_rank else 0.0
    return rows * s.vocab * (per + (chunked["entropy_backprop"] if backprop else 0)) + weight


def phase_components(spec: PlanSpec, s: ModelShape) -> tuple[dict[str, dict[str, float]], dict[str, dict[str, float]], dict[str, Any]]:
    """Device and host bytes per phase and component for one rank (rank 0 for host), plus derived counts.

    Model (FSDP1 NO_SHARD, bf16 mixed precision, verl defaults ``model_dtype=fp32``):

    * Actor: fp32 flat parameters (the master, 4 B/param) and, during compute, FSDP's bf16 copies.
      NO_SHARD with bf16 MixedPrecision frees each unit's copy at every reshard (after its forward and its
      backward; rlkit's cast counter sees 2 casts per unit per micro-batch): the root unit's copy lives
      through the forward, one layer computes while the next is prefetched, so the root and two layers are
      resident (2 B/param each); ``cast_once`` keeps every unit's copy resident (2 B/param). Gradients
      are fp32 (4 B/trainable param) and accumulate over micro-batches until the optimizer step. Adam
      holds exp_avg and exp_avg_sq (8 B/trainable param). A device optimizer step needs master, grad
      and both moments co-resident (the document's four full-size fp32 tensors); foreach temporaries
      are ignored. LoRA keeps the frozen base in the fp32 flat params; only adapters get grads and Adam.
    * ``param_offload`` moves the master to the host outside compute phases. Under NO_SHARD with
      ``use_orig_params=False`` the stale module views keep the device storage alive and the reload
      allocates a second copy (verl #7596): without ``offload_views`` that is ``stale_offload_copy``.
    * ``optimizer_offload`` parks Adam on the host between steps but loads it back for the step.
      ``cpu_optimizer_step`` (HostAdamW) keeps Adam on the host and steps there one flat parameter at a
      time through a pinned staging buffer (param + grad of the largest flat parameter, fp32);
      ``rank0_owner`` keeps that Adam state on rank 0 only. ``master_on_host`` keeps the fp32 master on
      the host for every phase; the bf16 copy is cast from it (device staging: one fp32 flat parameter).
      ``cast_once`` keeps that bf16 copy resident from the first forward until the optimizer step.
    * Activations: with gradient checkpointing every layer saves its bf16 input plus one layer's
      working set is live during recompute; without it every layer saves its full working set. A
      forward-only pass holds one layer's working set. ``selective_layers`` layers also keep their matmul
      and attention outputs (:func:`_selective_elems_per_token_layer`) from their forward to their backward.
    * Token positions per micro-batch (activations, logits): :func:`micro_batch_positions`, i.e. the actual
      tokens with ``remove_padding``, padded to the longest sequence without it.
    * Logits (:func:`logits_bytes`): positions x vocabulary x :data:`LOGITS_BYTES` (log-softmax included), plus
      :data:`UPDATE_ENTROPY_BYTES` in the update when backward recomputes an entropy; on a chunked path
      (log-probs from the hidden states, each chunk recomputed in backward) one chunk of rows instead of the
      positions, and the lm_head gradient's accumulator in the update.
    * vLLM: weights bf16, KV pool = util x total - weights - CUDA graphs - non-torch overhead. Captured
      CUDA graphs cannot be offloaded and stay resident in every phase; vLLM's own profiling
      activations are not modelled. While sleeping, vLLM frees KV and discards weights (sleep level 2).
    * Two processes share each card: vLLM's worker and the actor's. Each holds ``non_torch_gib`` outside
      torch's tensors (CUDA context, cuBLAS/NCCL workspaces) in every phase. vLLM's is inside its
      ``util x total``; the actor's (``actor_non_torch``) is not. Measured on the H200 node as device used
      minus torch reserved after verl's FSDP init, minus the idle baseline: 0.55 GiB for both models of
      outputs/06_util_sweep/ (verl.log "After FSDP" lines).
    * Weight sync: vLLM weights are awake, the actor master is loaded and FSDP1's FULL_STATE_DICT
      under NO_SHARD makes a full fp32 clone on the device (staging). With ``master_on_host`` the sync
      streams from the host master one flat parameter at a time.
    """
    P, T = s.params, (s.lora_params(spec.lora_rank) if spec.lora_rank else s.params)
    gpu = spec.gpu_gib * GIB
    graphs, non_torch = spec.cudagraph_gib * GIB, spec.non_torch_gib * GIB
    actor_ctx = {"actor_non_torch": non_torch}
    largest = s.largest_flat_param

    master_dev = 0.0 if spec.master_on_host else 4.0 * P
    stale = 4.0 * P if spec.param_offload and not spec.offload_views else 0.0
    adam_on_device_always = not spec.optimizer_offload and not spec.cpu_optimizer_step
    adam_dev_idle = 8.0 * T if adam_on_device_always else 0.0
    adam_dev_step = 0.0 if spec.cpu_optimizer_step else 8.0 * T
    h2d_staging = 4.0 * largest if spec.master_on_host else 0.0

    compute_copy = 2.0 * P if spec.cast_once else 2.0 * min(P, s.root_params + 2 * s.layer_params)

    N, Nlp = micro_batch_positions(spec, spec.micro_batch_tokens), micro_batch_positions(spec, spec.log_prob_micro_batch_tokens)
    layer_work = _activation_elems_per_token_layer(s, spec.compiled_pointwise) * 2
    if spec.selective_layers > s.layers:
        raise ParamError(f"selective_layers: {spec.selective_layers} is more than {s.name}'s {s.layers} layers. "
                         f"Fix: at most {s.layers}")
    if spec.gradient_checkpointing:
        kept = spec.selective_layers * N * _selective_elems_per_token_layer(s) * 2
        train_act = s.layers * N * s.hidden * 2 + kept + N * layer_work
    else:
        train_act = s.layers * N * layer_work

    vllm_weights = 2.0 * P + (2.0 * T if spec.lora_rank else 0.0)
    kv_pool = spec.gpu_memory_utilization * gpu - vllm_weights - graphs - non_torch

    device: dict[str, dict[str, float]] = {}  # phases in PHASES order; a skipped phase is absent
    device["rollout"] = {
        **actor_ctx,
        "vllm_weights_bf16": vllm_weights, "kv_pool": max(kv_pool, 0.0), "cuda_graphs": graphs, "non_torch": non_torch,
        "master_fp32": 0.0 if spec.param_offload else master_dev, "stale_offload_copy": stale, "adam_moments": adam_dev_idle,
    }
    if not spec.skip_old_logprob:
        device["log_prob"] = {
            **actor_ctx,
            "cuda_graphs": graphs, "non_torch": non_torch, "master_fp32": master_dev, "stale_offload_copy": stale,
            "compute_copy_bf16": compute_copy, "adam_moments": adam_dev_idle, "activations": Nlp * layer_work,
            "logits": logits_bytes(spec, s, Nlp, train=False), "staging": h2d_staging,
        }
    device["update_fwd_bwd"] = {
        **actor_ctx,
        "cuda_graphs": graphs, "non_torch": non_torch, "master_fp32": master_dev, "stale_offload_copy": stale,
        "compute_copy_bf16": compute_copy, "grads_fp32": 4.0 * T, "adam_moments": adam_dev_idle, "activations": train_act,
        "logits": logits_bytes(spec, s, N, train=True), "staging": h2d_staging,
    }
    device["optimizer_step"] = {
        **actor_ctx,
        "cuda_graphs": graphs, "non_torch": non_torch, "master_fp32": master_dev, "stale_offload_copy": stale,
        "compute_copy_bf16": 2.0 * P if spec.cast_once else 0.0, "grads_fp32": 4.0 * T, "adam_moments": adam_dev_step,
    }
    device["weight_sync"] = {
        **actor_ctx,
        "vllm_weights_bf16": vllm_weights, "cuda_graphs": graphs, "non_torch": non_torch, "master_fp32": master_dev,
        "stale_offload_copy": stale, "adam_moments": adam_dev_idle,
        "staging": 4.0 * largest if spec.master_on_host else 4.0 * P,
    }

    adam_host_rank0 = 8.0 * T if (spec.cpu_optimizer_step or spec.optimizer_offload) else 0.0
    pinned = 8.0 * largest if spec.cpu_optimizer_step else 0.0
    host: dict[str, dict[str, float]] = {}
    for phase in device:
        master_host = 4.0 * P if (spec.master_on_host or (spec.param_offload and phase == "rollout")) else 0.0
        adam_host = adam_host_rank0
        if spec.optimizer_offload and not spec.cpu_optimizer_step and phase == "optimizer_step":
            adam_host = 0.0  # loaded onto the device for the step
        host[phase] = {"master_fp32": master_host, "adam_moments": adam_host, "staging_pinned": pinned}

    micro_batches = math.ceil(step_tokens_per_gpu(spec) / spec.micro_batch_tokens)
    casts = s.flat_params * (1 if spec.cast_once else micro_batches)
    derived = {
        "params": P, "trainable_params": T, "largest_flat_param": largest, "flat_params": s.flat_params,
        "micro_batches_per_step": micro_batches, "bf16_casts_per_step": casts,
        "cast_read_gib": (casts / s.flat_params) * 4.0 * P / GIB,
        "kv_pool_raw": kv_pool, "update_positions": N, "log_prob_positions": Nlp,
    }
    return device, host, derived


def host_adamw_bytes(shape: ModelShape, *, ranks: int, rank0_owner: bool = False, master_on_host: bool = False,
                     param_offload: bool = False, lora_rank: int = 0, overlap_copies: bool = False) -> dict[str, float]:
    """Host bytes per node that HostAdamW (:mod:`rlkit.optim`) holds for ``ranks`` ranks on the node, by component.

    What :class:`rlkit.optim.HostAdamW` allocates: on every stepping rank (rank 0 alone with ``rank0_owner``)
    ``exp_avg`` + ``exp_avg_sq`` (8 B per trainable parameter) and the fp32 master of each fp32 device parameter
    (4 B); with the ``master_on_host`` patch the parameter is host-resident on every rank and is its own master.
    The pinned staging buffers are sized to the largest flat parameter (4 B per element): "grad" on the stepping
    ranks, "param" on every rank unless the parameter is host-resident; ``overlap_copies`` keeps two of each (the
    copies of one parameter run beside the host step of the next). verl's ``param_offload`` parks every
    rank's fp32 parameters on the host during rollout, next to all of that (already there with master_on_host).
    Other processes of the job (vLLM, Ray, the trainer) come on top: on the committed 2 x H200 Qwen3-4B arms
    (outputs/05_grpo_qwen3_4b/*/metrics.json, launch.host_memory) the node's peak above idle was 32-35 GiB more
    than this sum (tests/test_faults.py checks it).
    """
    if isinstance(ranks, bool) or not isinstance(ranks, int) or ranks < 1:
        raise ParamError(f"ranks: must be a positive integer, got {ranks!r}. Fix: pass the GPUs per node")
    P, L = float(shape.params), float(shape.largest_flat_param)
    T = float(shape.lora_params(lora_rank)) if lora_rank else P
    steppers = 1 if rank0_owner else ranks
    buffers = 2.0 if overlap_copies else 1.0
    return {
        "adam_moments": 8.0 * T * steppers,
        "master_fp32": 4.0 * P * ranks if master_on_host else 4.0 * T * steppers,
        "staging_pinned": buffers * (4.0 * L * steppers + (0.0 if master_on_host else 4.0 * L * ranks)),
        "param_offload_fp32": 4.0 * P * ranks if param_offload and not master_on_host else 0.0,
    }


def update_logits_gib(spec: PlanSpec, paths: tuple[str, ...] | list[str] | None = None,
                      shape: ModelShape | None = None) -> dict[str, float]:
    """GiB of the update micro-batch's log-prob computation on each logits path (default: this spec's), the rest
    of ``spec`` unchanged (a chunked path at its own chunk rows unless it is the spec's path)."""
    s = shape or resolve_model(spec.model)
    positions = micro_batch_positions(spec, spec.micro_batch_tokens)
    out = {}
    for path in paths or (spec.logits_path,):
        rows = spec.logits_chunk_rows if path == spec.logits_path else 0
        out[path] = logits_bytes(replace(spec, logits_path=path, logits_chunk_rows=rows), s, positions, train=True) / GIB
    return out


@dataclass
class Plan:
    """Result of :func:`plan`. All memory values are GiB."""

    spec: dict[str, Any]
    model: str
    params: int
    trainable_params: int
    device_gib: dict[str, dict[str, float]]  # phase -> component -> GiB on each GPU
    device_total_gib: dict[str, float]
    host_rank0_gib: dict[str, float]  # phase -> GiB of host memory for rank 0
    host_other_rank_gib: dict[str, float]  # phase -> GiB for every other rank
    host_node_peak_gib: float
    kv_pool_gib: float
    kv_gib_per_seq: float
    max_concurrent_seqs: int
    seqs_per_gpu: int
    rollout_waves: int
    micro_batches_per_step: int
    update_positions: float  # token positions of an update micro-batch's tensors (micro_batch_positions)
    log_prob_positions: float
    bf16_casts_per_step: int
    cast_read_gib: float
    peak_phase: str
    peak_gib: float
    headroom_gib: float
    binding: str
    fits: bool
    verdict: str
    reason: str
    units: str = "GiB"

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def plan(spec: PlanSpec, shape: ModelShape | None = None) -> Plan:
    """Device/host GiB per phase and component, KV pool, concurrency, binding constraint and verdict."""
    s = shape or resolve_model(spec.model)
    device, host, d = phase_components(spec, s)
    gib = lambda b: b / GIB
    device_gib = {p: {c: gib(v) for c, v in comps.items() if v} for p, comps in device.items()}
    totals = {p: sum(c.values()) for p, c in device_gib.items()}
    host_rank0 = {p: gib(sum(c.values())) for p, c in host.items()}
    rank0_only = ("adam_moments", "staging_pinned") if spec.rank0_owner else ()  # other ranks never step
    host_other = {p: gib(sum(v for k, v in c.items() if k not in rank0_only)) for p, c in host.items()}
    # per node: the node with rank 0 (or, with owners per node, every node: each has its owner)
    node_peak = max(host_rank0[p] + (spec.n_gpus // spec.nodes - 1) * host_other[p] for p in host)

    per_seq = kv_bytes_per_seq(s, spec.max_prompt_length + spec.max_response_length)
    kv_pool = d["kv_pool_raw"]
    max_seqs = int(kv_pool / per_seq) if kv_pool > 0 else 0
    seqs_per_gpu = math.ceil(spec.train_batch_size * spec.group_size / spec.n_gpus)
    waves = math.ceil(seqs_per_gpu / max_seqs) if max_seqs > 0 else 0

    gpu = spec.gpu_gib
    peak_phase = max(totals, key=totals.get)
    peak = totals[peak_phase]
    vllm_parts = ("vllm_weights_bf16", "kv_pool", "cuda_graphs", "non_torch")
    actor_in_rollout = {c: v for c, v in device_gib["rollout"].items() if c not in vllm_parts}
    rollout_residue = sum(actor_in_rollout.values())
    binding_component = lambda p: max(device_gib[p], key=device_gib[p].get)

    if kv_pool <= 0:
        fits, verdict = False, "no KV cache"
        reason = (f"util x total = {spec.gpu_memory_utilization * gpu:.2f} GiB does not cover vLLM weights + CUDA graphs "
                  f"+ non-torch ({gib(2 * s.params) + spec.cudagraph_gib + spec.non_torch_gib:.2f} GiB)")
        binding = "kv_pool"
    elif rollout_residue > (1 - spec.gpu_memory_utilization) * gpu + 1e-9:
        fits, verdict = False, "vLLM refuses to start"
        top = max(actor_in_rollout, key=actor_in_rollout.get)
        reason = (f"actor memory left on the device during rollout ({rollout_residue:.2f} GiB, mostly {top}) exceeds "
                  f"the {(1 - spec.gpu_memory_utilization) * gpu:.2f} GiB that util={spec.gpu_memory_utilization} leaves free")
        binding = f"rollout:{top}"
    elif peak > gpu:
        fits, verdict = False, f"OOM in {peak_phase}"
        reason = f"{peak_phase} needs {peak:.2f} GiB of {gpu:.2f} GiB (largest: {binding_component(peak_phase)})"
        binding = f"{peak_phase}:{binding_component(peak_phase)}"
    elif spec.host_gib and node_peak > spec.host_gib:
        fits, verdict = False, "host OOM"
        reason = f"host needs {node_peak:.2f} GiB per node of {spec.host_gib:.2f} GiB"
        binding = "host"
    else:
        fits, verdict = True, "fits"
        binding = f"{peak_phase}:{binding_component(peak_phase)}"
        reason = f"peak {peak_phase} {peak:.2f} of {gpu:.2f} GiB (headroom {gpu - peak:.2f} GiB)"
        if waves > 1:
            binding = "kv_pool"
            reason += f"; KV pool holds {max_seqs} of {seqs_per_gpu} sequences per GPU, rollout runs in {waves} waves"
        else:
            reason += f"; KV pool holds all {seqs_per_gpu} sequences per GPU ({max_seqs} max)"

    return Plan(
        spec=asdict(spec), model=s.name, params=s.params, trainable_params=d["trainable_params"],
        device_gib=device_gib, device_total_gib=totals, host_rank0_gib=host_rank0, host_other_rank_gib=host_other,
        host_node_peak_gib=node_peak, kv_pool_gib=gib(kv_pool), kv_gib_per_seq=gib(per_seq),
        max_concurrent_seqs=max_seqs, seqs_per_gpu=seqs_per_gpu, rollout_waves=waves,
        micro_batches_per_step=d["micro_batches_per_step"], update_positions=d["update_positions"],
        log_prob_positions=d["log_prob_positions"], bf16_casts_per_step=d["bf16_casts_per_step"],
        cast_read_gib=d["cast_read_gib"], peak_phase=peak_phase, peak_gib=peak, headroom_gib=gpu - peak,
        binding=binding, fits=fits, verdict=verdict, reason=reason,
    )


def most_selective_layers(spec: PlanSpec, shape: ModelShape | None = None) -> int:
    """The most layers ``spec`` can checkpoint selectively and still fit (0 when none fit, or the plan does not fit
    with full checkpointing either); pre-flight's choice for ``selective_layers: 0`` in a recipe. The activations
    grow with every layer, so the count that fits is the largest before the first that does not."""
    s = shape or resolve_model(spec.model)
    if not spec.gradient_checkpointing:
        return 0
    fits = [n for n in range(s.layers + 1) if plan(replace(spec, selective_layers=n), s).fits]
    return max(fits, default=0)


def format_plan(p: Plan) -> str:
    """A text table: GiB per phase (rows) and component (columns), then the verdict."""
    comps = [c for c in DEVICE_COMPONENTS if any(c in p.device_gib[ph] for ph in p.device_gib)]
    short = {c: c.replace("_bf16", "").replace("_fp32", "").replace("_moments", "")[:10] for c in comps}
    lines = [(f"model {p.model}: {p.params:,} params ({p.trainable_params:,} trainable); "
             f"options: {', '.join(o for o in RLKIT_OPTIONS if p.spec[o]) or 'none'}"),
             "device memory per GPU, GiB:",
             f"{'phase':15}" + "".join(f"{short[c]:>11}" for c in comps) + f"{'total':>9}{'host r0':>9}"]
    for ph, comp in p.device_gib.items():
        lines.append(f"{ph:15}" + "".join(f"{comp.get(c, 0.0):11.2f}" for c in comps)
                     + f"{p.device_total_gib[ph]:9.2f}{p.host_rank0_gib[ph]:9.2f}")
    lines += [
        (f"KV pool {p.kv_pool_gib:.2f} GiB, {p.kv_gib_per_seq:.4f} GiB per sequence -> {p.max_concurrent_seqs} concurrent "
        f"sequences ({p.seqs_per_gpu} needed per GPU)"),
        (f"host per node (peak phase) {p.host_node_peak_gib:.2f} GiB; bf16 casts per step {p.bf16_casts_per_step} "
        f"({p.micro_batches_per_step} micro-batches)"),
        (f"logits path {p.spec['logits_path']}; update micro-batch {p.spec['micro_batch_tokens']:,} tokens -> "
         f"{p.update_positions:,.0f} positions ({'unpadded' if p.spec['remove_padding'] else 'padded'})"),
        f"binding: {p.binding}",
        f"verdict: {p.verdict} ({p.reason})",
    ]
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------------
# 2. Cost metric
# ---------------------------------------------------------------------------------------------------

def run_cost(n_gpus: int, price_per_gpu_hour: float, wallclock_hours: float) -> float:
    """Dollars for a run: GPUs x price per GPU-hour x wall-clock hours."""
    for key, v in (("n_gpus", n_gpus), ("price_per_gpu_hour", price_per_gpu_hour), ("wallclock_hours", wallclock_hours)):
        if v < 0:
            raise ParamError(f"{key}: must be >= 0, got {v!r}")
    return n_gpus * price_per_gpu_hour * wallclock_hours


def cost_per_million_samples(n_gpus: int, price_per_gpu_hour: float, wallclock_hours: float, samples: float) -> float:
    """The document's metric: (n_gpus x price_per_gpu_hour x wallclock_hours) / samples_millions."""
    if not samples > 0:
        raise ParamError(f"samples: must be > 0 rollout samples, got {samples!r}")
    return run_cost(n_gpus, price_per_gpu_hour, wallclock_hours) / (samples / 1e6)
