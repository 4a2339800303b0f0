"""Phase-budget planner for colocated verl + vLLM GRPO: device and host GiB per phase, before booking a GPU.

Pure arithmetic: this module never imports torch, CUDA or verl. All memory figures are GiB (2**30 bytes).

Two planners live here:

1. :func:`seed_table` reproduces the script of source document 003 exactly (same cases, constants and
   formula). The table the document *printed* does not match its own script in every row; it is kept
   verbatim in :data:`PRINTED_SEED_TABLE` and :func:`seed_table_diff` shows where and by how much. The
   formula is never adjusted to match the printed table.
2. :func:`plan` derives every byte from a model config (a transformers ``config.json`` dict or a preset)
   and the run settings, for FSDP1 with ``NO_SHARD`` (each rank holds the whole model: verl's
   ``fsdp_size=1``, or one GPU), bf16 mixed precision and a colocated vLLM rollout. Its assumptions
   are stated where each term is computed (see :func:`phase_components`).

Also: the document's cost metric (:func:`cost_per_million_samples`), the frozen :class:`Config` of
notebook ``00_phase_budget`` and its :func:`run`, and the ``rlkit budget`` command line (:func:`main`).
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Any

from rlkit.params import ParamError

GIB = 1024**3
NOTEBOOK = "00_phase_budget"

# ---------------------------------------------------------------------------------------------------
# 1. The document's script, reproduced exactly
# ---------------------------------------------------------------------------------------------------

# Constants and cases exactly as in the script of seeds/003 ("Phase budget for colocated verl GRPO").
SEED_TOTAL = 80.0  # H100 80GB, usable fraction
SEED_SEQ = 512  # max_prompt_length 256 + max_response_length 256
SEED_UTILS = (0.40, 0.60, 0.70)
SEED_CASES: dict[str, dict[str, float]] = {
    "qwen2.5-0.5b-lora": {"layers": 24, "kv_heads": 2, "head_dim": 64, "weights": 0.99, "cudagraph": 3.0, "update_peak": 6.5},
    "qwen2.5-7b-lora": {"layers": 28, "kv_heads": 4, "head_dim": 128, "weights": 15.2, "cudagraph": 6.0, "update_peak": 22.0},
    "qwen2.5-7b-fullft": {"layers": 28, "kv_heads": 4, "head_dim": 128, "weights": 15.2, "cudagraph": 6.0, "update_peak": 121.6},
}
SEED_HEADER = f"{'case':22} {'util':>5} {'kv_pool':>9} {'max_seqs':>9} {'update':>8}  verdict"

# TRANSCRIBED FROM THE DOCUMENT (seeds/003, "Output on our workstation interpreter"), verbatim.
# This is what the document printed, NOT what its script computes; kept only to show the differences.
PRINTED_SEED_TABLE: tuple[tuple[str, float, float, int, float, str], ...] = (
    ("qwen2.5-0.5b-lora", 0.40, 28.0, 4778, 9.5, "fits"),
    ("qwen2.5-0.5b-lora", 0.60, 44.0, 7509, 9.5, "fits"),
    ("qwen2.5-0.5b-lora", 0.70, 52.0, 8874, 9.5, "fits"),
    ("qwen2.5-7b-lora", 0.40, 10.8, 395, 28.0, "fits"),
    ("qwen2.5-7b-lora", 0.60, 26.8, 980, 28.0, "fits"),
    ("qwen2.5-7b-lora", 0.70, 34.8, 1272, 28.0, "fits"),
    ("qwen2.5-7b-fullft", 0.40, 10.8, 395, 127.6, "OOM in update"),
    ("qwen2.5-7b-fullft", 0.60, 26.8, 980, 127.6, "OOM in update"),
    ("qwen2.5-7b-fullft", 0.70, 34.8, 1272, 127.6, "OOM in update"),
)
SEED_COLUMNS = ("case", "util", "kv_pool", "max_seqs", "update", "verdict")


def seed_kv_per_seq(layers, kv_heads, head_dim, seq, dtype_bytes=2) -> float:
    """The script's ``kv_per_seq``: K and V of every layer for one sequence, GiB."""
    return 2 * layers * kv_heads * head_dim * dtype_bytes * seq / GIB


def seed_table() -> list[dict[str, Any]]:
    """The nine rows the document's script computes (unrounded values; :func:`format_seed_table` prints)."""
    rows = []
    for name, c in SEED_CASES.items():
        per_seq = seed_kv_per_seq(c["layers"], c["kv_heads"], c["head_dim"], SEED_SEQ)
        update = c["update_peak"] + c["cudagraph"]  # cudagraphs never offload
        for u in SEED_UTILS:
            kv_pool = u * SEED_TOTAL - c["weights"] - c["cudagraph"]
            max_seqs = int(kv_pool / per_seq) if kv_pool > 0 else -1
            verdict = "OOM in update" if update > SEED_TOTAL else "fits"
            rows.append({"case": name, "util": u, "kv_pool": kv_pool, "max_seqs": max_seqs, "update": update, "verdict": verdict})
    return rows


def format_seed_row(r: Mapping[str, Any]) -> str:
    return f"{r['case']:22} {r['util']:5.2f} {r['kv_pool']:9.1f} {r['max_seqs']:9d} {r['update']:8.1f}  {r['verdict']}"


def format_seed_table(rows: list[Mapping[str, Any]] | None = None) -> str:
    """Exactly the script's output: its header line and its f-string per row."""
    rows = seed_table() if rows is None else rows
    return "\n".join([SEED_HEADER] + [format_seed_row(r) for r in rows])


def seed_table_diff() -> list[dict[str, Any]]:
    """Row by row: script vs printed table, per column, compared at the printed precision.

    Each row has ``case``, ``util``, then for each numeric column ``<col>_script`` (as the script prints
    it), ``<col>_printed`` and ``<col>_delta`` (printed - script), the verdicts, and ``differs``.
    """
    out = []
    for script, printed in zip(seed_table(), PRINTED_SEED_TABLE):
        p = dict(zip(SEED_COLUMNS, printed))
        assert (script["case"], script["util"]) == (p["case"], p["util"]), "row order differs from the document"
        row: dict[str, Any] = {"case": p["case"], "util": p["util"]}
        shown = {"kv_pool": round(script["kv_pool"], 1), "max_seqs": script["max_seqs"], "update": round(script["update"], 1)}
        differs = []
        for col in ("kv_pool", "max_seqs", "update"):
            delta = p[col] - shown[col]
            row[f"{col}_script"], row[f"{col}_printed"] = shown[col], p[col]
            row[f"{col}_delta"] = round(delta, 1) if isinstance(delta, float) else delta
            if abs(delta) > 1e-9:
                differs.append(col)
        row["verdict_script"], row["verdict_printed"] = script["verdict"], p["verdict"]
        if script["verdict"] != p["verdict"]:
            differs.append("verdict")
        row["differs"] = differs
        out.append(row)
    return out


# ---------------------------------------------------------------------------------------------------
# 2. Model shapes and parameter counts
# ---------------------------------------------------------------------------------------------------

def presets() -> dict[str, dict[str, Any]]:
    """Every model preset the planner knows: rlkit.models' Qwen2.5 and Qwen3 presets."""
    from rlkit.models import PRESETS

    return PRESETS


def preset_name(model: str) -> str | None:
    """``"Qwen/Qwen2.5-7B-Instruct"`` or ``"qwen2.5-7b"`` -> ``"qwen2.5-7b"``; None when no preset matches."""
    name = model.rstrip("/").rsplit("/", 1)[-1].lower()
    for suffix in ("-instruct", "-base"):
        name = name.removesuffix(suffix)
    return name if name in presets() else None


@dataclass(frozen=True)
class ModelShape:
    """The shapes that decide memory: a Llama-style decoder (Qwen2 / Qwen3)."""

    name: str
    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    tied: bool  # tie_word_embeddings: lm_head shares the embedding matrix (counted once)
    qkv_bias: bool  # Qwen2: q/k/v projections have biases
    qk_norm: bool  # Qwen3: RMSNorm of head_dim on q and k in every layer

    @property
    def q_dim(self) -> int:
        return self.heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.kv_heads * self.head_dim

    @property
    def layer_params(self) -> int:
        h, q, kv = self.hidden, self.q_dim, self.kv_dim
        attn = h * q + 2 * h * kv + q * h + (q + 2 * kv if self.qkv_bias else 0)
        mlp = 3 * h * self.intermediate
        norms = 2 * h + (2 * self.head_dim if self.qk_norm else 0)
        return attn + mlp + norms

    @property
    def root_params(self) -> int:
        """Embedding, final norm and (untied) lm_head: verl's root FSDP unit."""
        return self.vocab * self.hidden * (1 if self.tied else 2) + self.hidden

    @property
    def params(self) -> int:
        return self.layers * self.layer_params + self.root_params

    @property
    def largest_flat_param(self) -> int:
        """verl wraps every decoder layer in its own FSDP unit; the root unit holds the rest."""
        return max(self.layer_params, self.root_params)

    @property
    def flat_params(self) -> int:
        return self.layers + 1

    def lora_params(self, rank: int) -> int:
        """LoRA A and B on every linear layer of every decoder layer (verl's ``target_modules: all-linear``)."""
        h, q, kv, i = self.hidden, self.q_dim, self.kv_dim, self.intermediate
        in_plus_out = (h + q) + 2 * (h + kv) + (q + h) + 2 * (h + i) + (i + h)
        return self.layers * rank * in_plus_out


_REQUIRED_CONFIG_FIELDS = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "vocab_size")
_SUPPORTED_TYPES = ("qwen2", "qwen3", "llama", "mistral")


def shape_from_config(config: Mapping[str, Any], name: str = "config") -> ModelShape:
    """A :class:`ModelShape` from a transformers ``config.json`` dict.

    Required: hidden_size, intermediate_size, num_hidden_layers, num_attention_heads, vocab_size and a
    supported model_type. As in transformers, num_key_value_heads defaults to num_attention_heads,
    head_dim to hidden_size // num_attention_heads and tie_word_embeddings to False.
    """
    model_type = config.get("model_type")
    if model_type not in _SUPPORTED_TYPES:
        raise ParamError(
            f"{name}: model_type {model_type!r} is not supported; supported: {list(_SUPPORTED_TYPES)}. "
            f"Fix: pass the config.json of a Llama-style decoder or a preset ({sorted(presets())})."
        )
    missing = [k for k in _REQUIRED_CONFIG_FIELDS if k not in config]
    if missing:
        raise ParamError(f"{name}: config is missing {missing}. Fix: pass the model's complete config.json.")
    for key in _REQUIRED_CONFIG_FIELDS:
        if not isinstance(config[key], int) or config[key] <= 0:
            raise ParamError(f"{name}: {key} must be a positive integer, got {config[key]!r}")
    heads = config["num_attention_heads"]
    return ModelShape(
        name=name,
        hidden=config["hidden_size"],
        intermediate=config["intermediate_size"],
        layers=config["num_hidden_layers"],
        heads=heads,
        kv_heads=config.get("num_key_value_heads") or heads,
        head_dim=config.get("head_dim") or config["hidden_size"] // heads,
        vocab=config["vocab_size"],
        tied=bool(config.get("tie_word_embeddings", False)),
        qkv_bias=model_type == "qwen2" or bool(config.get("attention_bias", False)),
        qk_norm=model_type == "qwen3",
    )


def resolve_model(model: str | Mapping[str, Any]) -> ModelShape:
    """A preset name (or HF id matching one), a path to config.json (or its folder), or a config dict."""
    if isinstance(model, Mapping):
        return shape_from_config(model, str(model.get("_name_or_path", "config")))
    name = preset_name(model)
    if name is not None:
        return shape_from_config(presets()[name], name)
    path = Path(model)
    if path.is_dir():
        path = path / "config.json"
    if path.is_file():
        return shape_from_config(json.loads(path.read_text()), str(path))
    raise ParamError(
        f"model: {model!r} is neither a preset ({sorted(presets())}) nor a config.json path. "
        f"Fix: use a preset name or the path of the model's config.json."
    )


def kv_bytes_per_seq(shape: ModelShape, seq_len: int, dtype_bytes: int = 2) -> int:
    """K and V of every layer for one sequence of ``seq_len`` tokens (the document's formula, in bytes)."""
    return 2 * shape.layers * shape.kv_heads * shape.head_dim * dtype_bytes * seq_len


# ---------------------------------------------------------------------------------------------------
# 3. The derived planner
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
RLKIT_OPTIONS = ("offload_views", "cpu_optimizer_step", "rank0_owner", "master_on_host", "cast_once", "skip_old_logprob")

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
LOGITS_BYTES = {"torch_rowwise": {"train": 8, "forward": 8}, "torch_fp32": {"train": 10, "forward": 10},
                "flash_ce": {"train": 4, "forward": 2}}
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
    n_gpus: int = 2  # data-parallel ranks (NO_SHARD replicas), one vLLM engine per GPU (TP=1)
    gpu_memory_utilization: float = 0.85  # vLLM: fraction of TOTAL device memory for weights+KV+graphs
    max_prompt_length: int = 2048
    max_response_length: int = 10240
    train_batch_size: int = 32  # prompts per step
    group_size: int = 8  # responses per prompt (rollout.n)
    micro_batch_tokens: int = 24576  # tokens per update micro-batch per GPU (ppo_max_token_len_per_gpu)
    log_prob_micro_batch_tokens: int = 24576  # tokens per forward-only micro-batch per GPU
    lora_rank: int = 0  # 0 = full fine-tune
    gradient_checkpointing: bool = True
    param_offload: bool = True  # verl fsdp_config.param_offload
    optimizer_offload: bool = True  # verl fsdp_config.optimizer_offload
    cudagraph_gib: float = 1.0  # vLLM's captured CUDA graphs (it logs the size); 0 with enforce_eager
    non_torch_gib: float = 0.5  # per process on the card (vLLM's worker, the actor's): CUDA context, NCCL, workspaces
    logits_path: str = "torch_rowwise"  # see LOGITS_BYTES
    update_entropy: str = "none"  # see UPDATE_ENTROPY_BYTES
    host_gib: float = 0.0  # host memory per node; 0 = do not check
    # rlkit options
    offload_views: bool = False  # patch: param offload really frees the device copy (FSDP1 NO_SHARD)
    cpu_optimizer_step: bool = False  # HostAdamW: Adam moments and the fp32 step on the host
    rank0_owner: bool = False  # only rank 0 holds host Adam state and broadcasts the fp32 master
    master_on_host: bool = False  # fp32 master parked on the host during fwd/bwd
    cast_once: bool = False  # one resident bf16 compute copy per step instead of a cast per micro-batch
    skip_old_logprob: bool = False  # fully on-policy: the old-log-prob pass is skipped

    def __post_init__(self) -> None:
        def bad(key, msg, fix):
            raise ParamError(f"{key}: {msg}. Fix: {fix}")

        if not (self.gpu_gib > 0):
            bad("gpu_gib", f"device memory must be positive, got {self.gpu_gib!r}", "set the GPU's memory in GiB")
        if not (0 < self.gpu_memory_utilization <= 1):
            bad("gpu_memory_utilization", f"must be in (0, 1], got {self.gpu_memory_utilization!r}",
                "use a fraction such as 0.6")
        for key in ("n_gpus", "max_prompt_length", "max_response_length", "train_batch_size", "group_size",
                    "micro_batch_tokens", "log_prob_micro_batch_tokens"):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                bad(key, f"must be a positive integer, got {value!r}", "set a positive integer")
        if isinstance(self.lora_rank, bool) or not isinstance(self.lora_rank, int) or self.lora_rank < 0:
            bad("lora_rank", f"must be an integer >= 0, got {self.lora_rank!r}", "0 for full fine-tune, else the rank")
        for key in ("cudagraph_gib", "non_torch_gib", "host_gib"):
            if getattr(self, key) < 0:
                bad(key, f"must be >= 0 GiB, got {getattr(self, key)!r}", "set a non-negative size in GiB")
        if self.logits_path not in LOGITS_BYTES:
            bad("logits_path", f"{self.logits_path!r} is not one of {sorted(LOGITS_BYTES)}", "pick one of them")
        if self.update_entropy not in UPDATE_ENTROPY_BYTES:
            bad("update_entropy", f"{self.update_entropy!r} is not one of {list(UPDATE_ENTROPY_BYTES)}", "pick one of them")
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


def _activation_elems_per_token_layer(s: ModelShape) -> int:
    """bf16 elements one decoder layer saves per token for backward (flash-attention, no N^2 scores).

    Inputs of both RMSNorms and of the q/k/v, gate/up projections (4 x hidden); q and k before and after
    norm/RoPE, v and the attention output (3 x q_dim + 3 x kv_dim); gate, silu(gate), up and their
    product (4 x intermediate). fp32 norm statistics and the flash-attention log-sum-exp are ignored.
    """
    return 4 * s.hidden + 3 * s.q_dim + 3 * s.kv_dim + 4 * s.intermediate


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
      forward-only pass holds one layer's working set.
    * Logits: micro-batch tokens x vocabulary x :data:`LOGITS_BYTES` (log-softmax included), plus
      :data:`UPDATE_ENTROPY_BYTES` in the update when backward recomputes an entropy.
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

    N, Nlp = spec.micro_batch_tokens, spec.log_prob_micro_batch_tokens
    layer_work = _activation_elems_per_token_layer(s) * 2
    if spec.gradient_checkpointing:
        train_act = s.layers * N * s.hidden * 2 + N * layer_work
    else:
        train_act = s.layers * N * layer_work
    logits_b = LOGITS_BYTES[spec.logits_path]

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
            "logits": Nlp * s.vocab * logits_b["forward"], "staging": h2d_staging,
        }
    device["update_fwd_bwd"] = {
        **actor_ctx,
        "cuda_graphs": graphs, "non_torch": non_torch, "master_fp32": master_dev, "stale_offload_copy": stale,
        "compute_copy_bf16": compute_copy, "grads_fp32": 4.0 * T, "adam_moments": adam_dev_idle, "activations": train_act,
        "logits": N * s.vocab * (logits_b["train"] + UPDATE_ENTROPY_BYTES[spec.update_entropy]), "staging": h2d_staging,
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

    tokens_per_gpu = spec.train_batch_size * spec.group_size * (spec.max_prompt_length + spec.max_response_length) / spec.n_gpus
    micro_batches = math.ceil(tokens_per_gpu / N)
    casts = s.flat_params * (1 if spec.cast_once else micro_batches)
    derived = {
        "params": P, "trainable_params": T, "largest_flat_param": largest, "flat_params": s.flat_params,
        "micro_batches_per_step": micro_batches, "bf16_casts_per_step": casts,
        "cast_read_gib": (casts / s.flat_params) * 4.0 * P / GIB,
        "kv_pool_raw": kv_pool,
    }
    return device, host, derived


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
    node_peak = max(host_rank0[p] + (spec.n_gpus - 1) * host_other[p] for p in host)

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
        micro_batches_per_step=d["micro_batches_per_step"], bf16_casts_per_step=d["bf16_casts_per_step"],
        cast_read_gib=d["cast_read_gib"], peak_phase=peak_phase, peak_gib=peak, headroom_gib=gpu - peak,
        binding=binding, fits=fits, verdict=verdict, reason=reason,
    )


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
        f"binding: {p.binding}",
        f"verdict: {p.verdict} ({p.reason})",
    ]
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------------
# 4. Cost metric
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


# ---------------------------------------------------------------------------------------------------
# 5. Notebook 00: frozen Config and run()
# ---------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Config:
    """Parameters of notebook 00_phase_budget: the run settings of :class:`PlanSpec` minus the rlkit
    options, plus the option sets to compare (each a comma-separated list of rlkit options)."""

    model: str
    gpu_gib: float
    n_gpus: int
    gpu_memory_utilization: float
    max_prompt_length: int
    max_response_length: int
    train_batch_size: int
    group_size: int
    micro_batch_tokens: int
    log_prob_micro_batch_tokens: int
    lora_rank: int
    gradient_checkpointing: bool
    param_offload: bool
    optimizer_offload: bool
    cudagraph_gib: float
    non_torch_gib: float
    logits_path: str
    host_gib: float
    option_sets: tuple[str, ...]

    def __post_init__(self) -> None:
        if not self.option_sets:
            raise ParamError("option_sets: empty. Fix: list at least one set, e.g. [''] for no rlkit options")
        for opts in self.option_sets:
            with_options(self.spec(), opts)  # raises on unknown option names or invalid combinations

    def spec(self, options: str = "") -> PlanSpec:
        base = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "option_sets"}
        return with_options(PlanSpec(**base), options)


def leave_one_out(options: str) -> dict[str, str]:
    """``"a,b,c"`` -> ``{"-a": "b,c", "-b": "a,c", "-c": "a,b"}``, dropping sets made invalid."""
    names = [o for o in options.split(",") if o]
    out = {}
    for drop in names:
        rest = [o for o in names if o != drop]
        if drop == "cpu_optimizer_step":  # rank0_owner and master_on_host are modes of the host step
            rest = [o for o in rest if o not in ("rank0_owner", "master_on_host")]
        out[f"-{drop}"] = ",".join(rest)
    return out


def run(cfg: Config) -> dict[str, Any]:
    """Notebook 00's metrics: the script's table, its diff with the printed table, and the derived plans."""
    plans = {opts or "none": plan(cfg.spec(opts)).as_dict() for opts in cfg.option_sets}
    full = max(cfg.option_sets, key=lambda o: len([x for x in o.split(",") if x]))
    ablations = {label: plan(cfg.spec(opts)).as_dict() for label, opts in leave_one_out(full).items()}
    logits_paths = {path: plan(replace(cfg.spec(full), logits_path=path)).as_dict() for path in LOGITS_BYTES}
    return {
        "units": "GiB",
        "seed_table": seed_table(),
        "seed_table_text": format_seed_table(),
        "seed_diff": seed_table_diff(),
        "plans": plans,
        "ablations": {"all": full, "plans": ablations},
        "logits_paths": logits_paths,
        "cost_examples": [
            {"n_gpus": n, "price_per_gpu_hour": 2.5, "wallclock_hours": 120, "run_cost": run_cost(n, 2.5, 120)}
            for n in (1, 2, 4)
        ],
    }


def plans_frame(plans: Mapping[str, Mapping[str, Any]]):
    """One row per option set: verdict, binding, peak, GiB per phase, host and KV (a pandas DataFrame)."""
    import pandas as pd

    rows = []
    for label, p in plans.items():
        row = {"options": label, "verdict": p["verdict"], "binding": p["binding"], "peak_phase": p["peak_phase"],
               "peak_gib": p["peak_gib"], "headroom_gib": p["headroom_gib"]}
        row.update({f"{ph}_gib": p["device_total_gib"].get(ph) for ph in PHASES})
        row.update({"host_node_peak_gib": p["host_node_peak_gib"], "kv_pool_gib": p["kv_pool_gib"],
                    "max_concurrent_seqs": p["max_concurrent_seqs"], "bf16_casts_per_step": p["bf16_casts_per_step"]})
        rows.append(row)
    return pd.DataFrame(rows).set_index("options")


def phase_bar_figure(plans: Mapping[str, Mapping[str, Any]], gpu_gib: float, title: str = ""):
    """Plotly stacked bars: device GiB per component, grouped by option set and phase, with the GPU line."""
    import plotly.graph_objects as go

    labels = [(label, ph) for label, p in plans.items() for ph in p["device_gib"]]
    x = [[label for label, _ in labels], [ph for _, ph in labels]]
    fig = go.Figure()
    for comp in DEVICE_COMPONENTS:
        y = [plans[label]["device_gib"][ph].get(comp, 0.0) for label, ph in labels]
        if any(y):
            fig.add_bar(name=comp, x=x, y=y)
    fig.add_hline(y=gpu_gib, line_dash="dash", annotation_text=f"GPU {gpu_gib} GiB")
    fig.update_layout(barmode="stack", title=title or "device memory per GPU by phase (GiB)",
                      yaxis_title="GiB per GPU", height=520, legend_title="component")
    return fig


def planner_form(cfg: Config):
    """An ipywidgets form over the planner, starting from ``cfg``: change a value, read the new plan."""
    import ipywidgets as W

    base = cfg.spec("")
    controls = {
        "model": W.Dropdown(options=sorted(presets()), value=preset_name(base.model) or base.model, description="model"),
        "gpu_gib": W.FloatText(value=base.gpu_gib, description="GPU GiB"),
        "n_gpus": W.IntText(value=base.n_gpus, description="GPUs"),
        "gpu_memory_utilization": W.FloatSlider(value=base.gpu_memory_utilization, min=0.05, max=1.0, step=0.05,
                                                description="util"),
        "micro_batch_tokens": W.IntText(value=base.micro_batch_tokens, description="µbatch tok"),
        "lora_rank": W.IntText(value=base.lora_rank, description="LoRA rank"),
        "logits_path": W.Dropdown(options=sorted(LOGITS_BYTES), value=base.logits_path, description="logits"),
    }
    toggles = {o: W.Checkbox(value=False, description=o) for o in RLKIT_OPTIONS}
    out = W.Output()

    def update(_=None):
        out.clear_output()
        with out:
            try:
                values = {k: w.value for k, w in controls.items()}
                spec = replace(base, **values, log_prob_micro_batch_tokens=values["micro_batch_tokens"])
                print(format_plan(plan(with_options(spec, [o for o, w in toggles.items() if w.value]))))
            except ParamError as err:
                print(f"error: {err}")

    for w in [*controls.values(), *toggles.values()]:
        w.observe(update, names="value")
    update()
    return W.VBox([W.HBox([W.VBox(list(controls.values())), W.VBox(list(toggles.values()))]), out])


# ---------------------------------------------------------------------------------------------------
# 6. Command line: ``rlkit budget``
# ---------------------------------------------------------------------------------------------------

def _parser() -> argparse.ArgumentParser:
    d = PlanSpec()
    p = argparse.ArgumentParser(
        prog="rlkit budget",
        description="Phase-budget planner for colocated verl + vLLM (all memory in GiB).",
    )
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--seed-table", action="store_true", help="print the document's script table exactly")
    mode.add_argument("--seed-diff", action="store_true", help="script table vs the document's printed table")
    mode.add_argument("--cost", action="store_true", help="cost per million rollout samples")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    g = p.add_argument_group("derived planner")
    g.add_argument("--model", default=d.model, help=f"preset ({', '.join(sorted(presets()))}), HF id or config.json")
    g.add_argument("--gpu-gib", type=float, default=d.gpu_gib)
    g.add_argument("--n-gpus", type=int, default=d.n_gpus)
    g.add_argument("--util", type=float, default=d.gpu_memory_utilization, help="vLLM gpu_memory_utilization")
    g.add_argument("--prompt-len", type=int, default=d.max_prompt_length)
    g.add_argument("--response-len", type=int, default=d.max_response_length)
    g.add_argument("--batch", type=int, default=d.train_batch_size, help="prompts per step")
    g.add_argument("--group", type=int, default=d.group_size, help="responses per prompt")
    g.add_argument("--micro-batch-tokens", type=int, default=d.micro_batch_tokens)
    g.add_argument("--log-prob-micro-batch-tokens", type=int, default=None, help="default: --micro-batch-tokens")
    g.add_argument("--lora-rank", type=int, default=d.lora_rank, help="0 = full fine-tune")
    g.add_argument("--no-grad-ckpt", action="store_true", help="gradient checkpointing off")
    g.add_argument("--no-param-offload", action="store_true")
    g.add_argument("--no-optimizer-offload", action="store_true")
    g.add_argument("--cudagraph-gib", type=float, default=d.cudagraph_gib)
    g.add_argument("--non-torch-gib", type=float, default=d.non_torch_gib)
    g.add_argument("--logits-path", default=d.logits_path, choices=sorted(LOGITS_BYTES))
    g.add_argument("--update-entropy", default=d.update_entropy, choices=list(UPDATE_ENTROPY_BYTES),
                   help="entropy in the update: none, detached (forward only), backprop (recomputed in backward)")
    g.add_argument("--host-gib", type=float, default=d.host_gib, help="host memory per node (0 = unchecked)")
    g.add_argument("--options", default="", help=f"comma-separated rlkit options: {','.join(RLKIT_OPTIONS)}")
    c = p.add_argument_group("cost (--cost)")
    c.add_argument("--price-per-gpu-hour", type=float, default=2.5)
    c.add_argument("--hours", type=float, default=None, help="wall-clock hours")
    c.add_argument("--samples", type=float, default=None, help="rollout samples (omit for the run cost only)")
    return p


def spec_from_args(ns: argparse.Namespace) -> PlanSpec:
    spec = PlanSpec(
        model=ns.model, gpu_gib=ns.gpu_gib, n_gpus=ns.n_gpus, gpu_memory_utilization=ns.util,
        max_prompt_length=ns.prompt_len, max_response_length=ns.response_len, train_batch_size=ns.batch,
        group_size=ns.group, micro_batch_tokens=ns.micro_batch_tokens,
        log_prob_micro_batch_tokens=ns.log_prob_micro_batch_tokens or ns.micro_batch_tokens,
        lora_rank=ns.lora_rank, gradient_checkpointing=not ns.no_grad_ckpt, param_offload=not ns.no_param_offload,
        optimizer_offload=not ns.no_optimizer_offload, cudagraph_gib=ns.cudagraph_gib,
        non_torch_gib=ns.non_torch_gib, logits_path=ns.logits_path, update_entropy=ns.update_entropy,
        host_gib=ns.host_gib,
    )
    return with_options(spec, ns.options)


def main(argv: list[str] | None = None) -> int:
    ns = _parser().parse_args(argv)
    try:
        if ns.seed_table:
            print(json.dumps(seed_table(), indent=1) if ns.json else format_seed_table())
        elif ns.seed_diff:
            rows = seed_table_diff()
            if ns.json:
                print(json.dumps(rows, indent=1))
            else:
                for r in rows:
                    what = ", ".join(f"{c} {r[c + '_script']} -> printed {r[c + '_printed']} ({r[c + '_delta']:+})"
                                     for c in r["differs"] if c != "verdict") or "same"
                    print(f"{r['case']:22} {r['util']:5.2f}  {what}")
        elif ns.cost:
            if ns.hours is None:
                raise ParamError("hours: --cost needs --hours (wall-clock hours of the run)")
            out = {"n_gpus": ns.n_gpus, "price_per_gpu_hour": ns.price_per_gpu_hour, "wallclock_hours": ns.hours,
                   "run_cost": run_cost(ns.n_gpus, ns.price_per_gpu_hour, ns.hours)}
            if ns.samples is not None:
                out["samples"] = ns.samples
                out["cost_per_million_samples"] = cost_per_million_samples(
                    ns.n_gpus, ns.price_per_gpu_hour, ns.hours, ns.samples)
            if ns.json:
                print(json.dumps(out))
            else:
                line = f"run cost ${out['run_cost']:,.2f} ({ns.n_gpus} GPU x ${ns.price_per_gpu_hour}/h x {ns.hours} h)"
                if "cost_per_million_samples" in out:
                    line += f"; ${out['cost_per_million_samples']:,.2f} per million rollout samples"
                print(line)
        else:
            result = plan(spec_from_args(ns))
            print(json.dumps(result.as_dict(), indent=1) if ns.json else format_plan(result))
            return 0 if result.fits else 1
    except ParamError as err:
        print(f"rlkit budget: error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
