"""Phase-budget model for colocated verl + vLLM GRPO: device and host bytes per phase and component, before booking a GPU.

Pure arithmetic: this module never imports torch, CUDA or verl. All memory figures are GiB (2**30 bytes).

:func:`phase_components` derives every byte from a model config (a transformers ``config.json`` dict or a preset)
   and the run settings (:class:`PlanSpec`), for FSDP1 with ``NO_SHARD`` (each rank holds the whole model: verl's
   ``fsdp_size=1``, or one GPU), bf16 mixed precision and a colocated vLLM rollout. Its assumptions
   are stated where each term is computed (see :func:`phase_components`). Two choices of verl change the
   micro-batch terms most: the logits path (:data:`LOGITS_BYTES`: full logits, or log-probs from the hidden
   states in chunks, :data:`CHUNKED_LOGITS`) and remove-padding (:func:`micro_batch_positions`).

Whether a spec fits, and what binds, is :func:`rlkit.planning.verdict.plan`. HostAdamW's host bytes per node are
:mod:`rlkit.planning.host_memory`, the document's cost metric :mod:`rlkit.planning.cost`. Source document 003's own
table, notebook 00's option sets and the ``rlkit budget`` command line are :mod:`rlkit.experiments.phase_budget`.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

from rlkit.core.params import ParamError
from rlkit.models.shape import ModelShape

GIB = 1024**3

PHASES = ("rollout", "log_prob", "update_fwd_bwd", "optimizer_step", "weight_sync")
DEVICE_COMPONENTS = (
    "vllm_weights_bf16", "kv_pool", "cuda_graphs", "non_torch", "vllm_asleep_rest", "actor_non_torch", "master_fp32",
    "stale_offload_copy", "compute_copy_bf16", "grads_fp32", "adam_moments", "activations", "logits", "staging",
)
HOST_COMPONENTS = ("master_fp32", "adam_moments", "staging_pinned")
# The actor's own allocations (what torch.cuda.max_memory_allocated of the actor counts); the other device
# components are vLLM's and the two processes' memory outside torch's allocator.
ACTOR_ALLOCATED_COMPONENTS = ("master_fp32", "stale_offload_copy", "compute_copy_bf16", "grads_fp32", "adam_moments",
                              "activations", "logits", "staging")
RLKIT_OPTIONS = ("offload_views", "cpu_optimizer_step", "rank0_owner", "master_on_host", "cast_once", "skip_old_logprob",
                 "compiled_pointwise")

# Bytes held per logit element (micro-batch tokens x vocabulary) while log-probs are computed.
# torch_rowwise / torch_fp32: verl 0.9.1's engine without flash-attn (logprobs_from_logits_v2, bf16 branch).
#           Training: the bf16 lm_head output (2) + the copy of its valid-token rows (2, torch.cat in
#           prepare_model_outputs) + the per-row log-softmax outputs autograd keeps (2) + their gradient (2) = 8
#           (torch_fp32 keeps its conservative 10). Forward-only (old_log_prob): verl always computes the entropy
#           there (calculate_entropy=True) under CUDA autocast, which peaks inside its logsumexp: the bf16 logits (2),
#           the softmax in fp32 (4), logsumexp's fp32 copy (4) and its fp32 x - max (4) = 14 per element of the
#           (padded) logits, measured on verl's own functions by rlkit.measure.logits_memory
#           (tests/test_logits_memory.py); a temperature other than 1 adds 2. An entropy in the update: see
#           UPDATE_ENTROPY_BYTES.
# flash_ce: verl's path when flash-attn is installed: bf16 logits (2) + their bf16 gradient (2) in training,
#           the bf16 logits alone in a forward-only pass; the fused cross-entropy keeps no fp32 copy.
# The chunked paths (CHUNKED_LOGITS) never hold the micro-batch's logits: their bytes are per element of ONE chunk.
# chunked_logprobs: rlkit's patch of that name (rlkit.patches.kernels.chunked_logprobs, under verl's use_fused_kernels):
#           fp32 logits of the chunk (4) + one fp32 temporary (4, logsumexp's or exp's); 2 more when backward
#           also differentiates the entropy.
# verl_fused: verl 0.9.1's use_fused_kernels=True, torch backend (verl.utils.experimental.torch_functional.
#           FusedLinearForPPOFunction, 512 rows): forward the fp32 logits, softmax and two temporaries (12);
#           backward recomputes them beside a one-hot, (one-hot - p) and the fp32/bf16 logit gradients (24),
#           4 more with an entropy gradient.
LOGITS_BYTES = {"torch_rowwise": {"train": 8, "forward": 14}, "torch_fp32": {"train": 10, "forward": 14},
                "flash_ce": {"train": 4, "forward": 2},
                "chunked_logprobs": {"train": 8, "forward": 8}, "verl_fused": {"train": 24, "forward": 12}}
# Per chunked path: rows per chunk (rlkit.patches.kernels.chunked_logprobs.CHUNK_ROWS; verl's FusedLinearForPPO
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
    actor_non_torch_gib: float = 0.0  # the actor's process outside torch's allocator; 0 = non_torch_gib
    vllm_asleep_gib: float = 0.0  # vLLM's worker while asleep, all of it; 0 = cudagraph_gib + non_torch_gib
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
        for key, fix in (("lora_rank", "0 for full fine-tune, else the rank"), ("logits_chunk_rows", "0 for the path's chunk"),
                         ("selective_layers", "0 (full checkpointing) or a number of layers")):
            if isinstance(getattr(self, key), bool) or not isinstance(getattr(self, key), int) or getattr(self, key) < 0:
                bad(key, f"must be an integer >= 0, got {getattr(self, key)!r}", fix)
        for key in ("cudagraph_gib", "non_torch_gib", "actor_non_torch_gib", "vllm_asleep_gib", "host_gib"):
            if getattr(self, key) < 0:
                bad(key, f"must be >= 0 GiB, got {getattr(self, key)!r}", "set a non-negative size in GiB")
        if self.logits_path not in LOGITS_BYTES:
            bad("logits_path", f"{self.logits_path!r} is not one of {sorted(LOGITS_BYTES)}", "pick one of them")
        if self.logits_chunk_rows and self.logits_path not in CHUNKED_LOGITS:
            bad("logits_chunk_rows", f"{self.logits_path!r} does not work in chunks", f"0, or a path of {list(CHUNKED_LOGITS)}")
        if not 0 <= self.mean_response_tokens <= self.max_response_length:
            bad("mean_response_tokens", f"must be in [0, max_response_length={self.max_response_length}], got "
                f"{self.mean_response_tokens!r}", "the expected response tokens, or 0 for max_response_length")
        if self.update_entropy not in UPDATE_ENTROPY_BYTES:
            bad("update_entropy", f"{self.update_entropy!r} is not one of {list(UPDATE_ENTROPY_BYTES)}", "pick one of them")
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
    * Two processes share each card, vLLM's worker and the actor's, each holding ``non_torch_gib`` outside torch's tensors
      (CUDA context, NCCL/cuBLAS workspaces) in every phase, vLLM's inside its ``util x total``; ``actor_non_torch_gib``
      and, while vLLM sleeps, ``vllm_asleep_gib`` (its excess: ``vllm_asleep_rest``) where measured (:mod:`.run_terms`).
    * Weight sync: vLLM weights are awake, the actor master is loaded and FSDP1's FULL_STATE_DICT
      under NO_SHARD makes a full fp32 clone on the device (staging). With ``master_on_host`` the sync
      streams from the host master one flat parameter at a time.
    """
    t = _terms(spec, s)
    device = _device_phases(spec, s, t)
    host = _host_phases(spec, t, device)
    micro_batches = math.ceil(step_tokens_per_gpu(spec) / spec.micro_batch_tokens)
    casts = s.flat_params * (1 if spec.cast_once else micro_batches)
    derived = {
        "params": t.P, "trainable_params": t.T, "largest_flat_param": t.largest, "flat_params": s.flat_params,
        "micro_batches_per_step": micro_batches, "bf16_casts_per_step": casts,
        "cast_read_gib": (casts / s.flat_params) * 4.0 * t.P / GIB,
        "kv_pool_raw": t.kv_pool, "update_positions": t.N, "log_prob_positions": t.Nlp,
    }
    return device, host, derived


@dataclass(frozen=True)
class _Terms:
    """The byte terms (and token positions) that several phases of :func:`phase_components` share, for one rank."""
    P: float  # parameters
    T: float  # trainable parameters (the adapters with LoRA)
    largest: float  # the largest flat parameter
    graphs: float
    non_torch: float
    master_dev: float
    stale: float
    adam_dev_idle: float
    adam_dev_step: float
    h2d_staging: float
    compute_copy: float
    N: int  # token positions per update micro-batch
    Nlp: int  # per log-prob micro-batch
    layer_work: float
    train_act: float
    vllm_weights: float
    kv_pool: float


def _terms(spec: PlanSpec, s: ModelShape) -> _Terms:
    P, T = s.params, (s.lora_params(spec.lora_rank) if spec.lora_rank else s.params)
    graphs, non_torch = spec.cudagraph_gib * GIB, spec.non_torch_gib * GIB
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
    adam_on_device_always = not spec.optimizer_offload and not spec.cpu_optimizer_step
    return _Terms(
        P=P, T=T, largest=s.largest_flat_param, graphs=graphs, non_torch=non_torch,
        master_dev=0.0 if spec.master_on_host else 4.0 * P,
        stale=4.0 * P if spec.param_offload and not spec.offload_views else 0.0,
        adam_dev_idle=8.0 * T if adam_on_device_always else 0.0,
        adam_dev_step=0.0 if spec.cpu_optimizer_step else 8.0 * T,
        h2d_staging=4.0 * s.largest_flat_param if spec.master_on_host else 0.0,
        compute_copy=2.0 * P if spec.cast_once else 2.0 * min(P, s.root_params + 2 * s.layer_params),
        N=N, Nlp=Nlp, layer_work=layer_work, train_act=train_act, vllm_weights=vllm_weights,
        kv_pool=spec.gpu_memory_utilization * spec.gpu_gib * GIB - vllm_weights - graphs - non_torch,
    )


def _device_phases(spec: PlanSpec, s: ModelShape, t: _Terms) -> dict[str, dict[str, float]]:
    """Device bytes per phase (in PHASES order; a skipped phase is absent) and component (the components keep one
    order per phase: the figures stack them in it)."""
    actor_nt = (spec.actor_non_torch_gib or spec.non_torch_gib) * GIB
    rest = max(spec.vllm_asleep_gib * GIB - t.graphs - t.non_torch, 0.0)  # what vLLM's sleeping worker keeps beyond
    shared = {"actor_non_torch": actor_nt, "cuda_graphs": t.graphs, "non_torch": t.non_torch,
              **({"vllm_asleep_rest": rest} if rest else {})}
    actor = {"master_fp32": t.master_dev, "stale_offload_copy": t.stale}
    device: dict[str, dict[str, float]] = {}
    device["rollout"] = {
        "actor_non_torch": actor_nt, "vllm_weights_bf16": t.vllm_weights, "kv_pool": max(t.kv_pool, 0.0),
        "cuda_graphs": t.graphs, "non_torch": t.non_torch, "master_fp32": 0.0 if spec.param_offload else t.master_dev,
        "stale_offload_copy": t.stale, "adam_moments": t.adam_dev_idle,
    }
    if not spec.skip_old_logprob:
        device["log_prob"] = {
            **shared, **actor, "compute_copy_bf16": t.compute_copy, "adam_moments": t.adam_dev_idle,
            "activations": t.Nlp * t.layer_work, "logits": logits_bytes(spec, s, t.Nlp, train=False),
            "staging": t.h2d_staging,
        }
    device["update_fwd_bwd"] = {
        **shared, **actor, "compute_copy_bf16": t.compute_copy, "grads_fp32": 4.0 * t.T, "adam_moments": t.adam_dev_idle,
        "activations": t.train_act, "logits": logits_bytes(spec, s, t.N, train=True), "staging": t.h2d_staging,
    }
    device["optimizer_step"] = {
        **shared, **actor, "compute_copy_bf16": 2.0 * t.P if spec.cast_once else 0.0, "grads_fp32": 4.0 * t.T,
        "adam_moments": t.adam_dev_step,
    }
    device["weight_sync"] = {
        "actor_non_torch": actor_nt, "vllm_weights_bf16": t.vllm_weights, "cuda_graphs": t.graphs,
        "non_torch": t.non_torch, **actor, "adam_moments": t.adam_dev_idle,
        "staging": 4.0 * t.largest if spec.master_on_host else 4.0 * t.P,
    }
    return device


def _host_phases(spec: PlanSpec, t: _Terms, phases) -> dict[str, dict[str, float]]:
    """Host bytes (rank 0) per phase and component."""
    adam_host_rank0 = 8.0 * t.T if (spec.cpu_optimizer_step or spec.optimizer_offload) else 0.0
    pinned = 8.0 * t.largest if spec.cpu_optimizer_step else 0.0
    host: dict[str, dict[str, float]] = {}
    for phase in phases:
        master_host = 4.0 * t.P if (spec.master_on_host or (spec.param_offload and phase == "rollout")) else 0.0
        adam_host = adam_host_rank0
        if spec.optimizer_offload and not spec.cpu_optimizer_step and phase == "optimizer_step":
            adam_host = 0.0  # loaded onto the device for the step
        host[phase] = {"master_fp32": master_host, "adam_moments": adam_host, "staging_pinned": pinned}
    return host
