"""Each phase of a GRPO step against the limit the hardware sets for it: FLOP/s, bandwidth, or a measured ceiling.

Pure arithmetic from the model's shape (:mod:`rlkit.models.shape`) and the machine; no torch import.

- **Compute phases** (``update_actor``, ``old_log_prob``): model FLOPs from the shape. Per token, the linear
  layers cost 2 FLOPs per weight (q, k, v, o, gate, up, down of every layer and the lm_head; the embedding is
  a lookup, not a matmul, so it is not counted, unlike verl's own estimate in verl/utils/flops_counter.py).
  Causal attention costs 2 x L^2 x q_dim per layer for a sequence of L tokens (QK^T and AV, each half of the
  L x L square). The backward pass costs twice the forward. *Model* FLOPs count the real tokens once
  forward and once backward (MFU, the usual definition); *hardware* FLOPs add what the run also computes:
  the forward recomputed by gradient checkpointing and, without remove-padding, the padding tokens.
- **gen**: the run's generated tokens per vLLM replica against the output tokens/s of a standalone vLLM
  measurement on the same GPU model (:func:`vllm_ceiling`: the newest committed
  ``outputs/_node/vllm_standalone/<tag>/metrics.json`` whose ``shape`` equals the run's, keys
  :data:`CEILING_MATCH_KEYS`; written by :mod:`rlkit.experiments.vllm_ceiling`). ``limit_s`` = generated
  tokens / ceiling tokens/s, ``fraction`` = ``limit_s`` / measured gen seconds; both None, with a ``reason``,
  where no committed ceiling matches. The ceiling is ``LLM.generate`` of the same requests on an engine that
  is awake, its weights loaded and warmed up: prefill (with prefix caching), decode, sampling with the sampled
  token's log-prob, detokenisation, with verl 0.9.1's engine and sampling settings. verl's ``timing_s/gen``
  (verl/trainer/ppo/ray_trainer.py, the ``gen`` timer) holds more: the agent loop (Ray dispatch to its workers,
  the chat template, one async request per sequence through the server manager, padding the batch back) and
  ``checkpoint_manager.sleep_replicas()``, putting vLLM to sleep; waking it up and the weight sync are timed
  as ``update_weights`` in verl 0.9.1. So ``fraction`` < 1 also charges that overhead to gen.
- **gen against the memory bandwidth** (:func:`decode_bound`, beside the measured ceiling): decoding reads every
  weight once per step and each running sequence's KV cache at its context, over the run's length distribution
  (the synthetic length model's, or the measured mean), against the GPU's HBM bandwidth (:data:`HBM_BYTES_PER_S`,
  data sheets). It says how far standalone vLLM itself is from the hardware.
- **Host and PCIe phases** (the host optimizer step, the weight sync of an offloaded actor): bytes moved
  against the node's measured pinned copy bandwidth (``outputs/02_host_adamw/h200``'s copy bench).
- **Between phases**: the step time not inside any named phase.

Peak dense bf16 tensor FLOP/s per GPU (no sparsity), from the vendors' data sheets:
:data:`PEAK_BF16_FLOPS` names each source.
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from rlkit.models.shape import ModelShape

# GPU name (as torch.cuda.get_device_name reports it, matched by substring, longest first) ->
# (dense bf16 tensor FLOP/s, source). Data-sheet numbers "with sparsity" are twice these.
PEAK_BF16_FLOPS: dict[str, tuple[float, str]] = {
    "H200": (989.4e12, "NVIDIA H200 Tensor Core GPU data sheet: BF16 Tensor Core 1,979 TFLOPS with sparsity (SXM)"),
    "H100 PCIe": (756.0e12, "NVIDIA H100 data sheet: BF16 Tensor Core 1,513 TFLOPS with sparsity (PCIe)"),
    "H100": (989.4e12, "NVIDIA H100 data sheet: BF16 Tensor Core 1,979 TFLOPS with sparsity (SXM)"),
    "A100": (312.0e12, "NVIDIA A100 data sheet: BF16 Tensor Core 312 TFLOPS (624 with sparsity)"),
    "L40S": (362.05e12, "NVIDIA L40S data sheet: BF16 Tensor Core 733 TFLOPS with sparsity"),
    "RTX A6000": (154.8e12, "NVIDIA RTX A6000 data sheet: Tensor performance 309.7 TFLOPS with sparsity (BF16)"),
}


# GPU name (matched as PEAK_BF16_FLOPS is) -> (HBM bytes/s, source): what bounds decoding, which reads every weight
# and the KV cache once per step and does little arithmetic per byte.
HBM_BYTES_PER_S: dict[str, tuple[float, str]] = {
    "H200": (4.8e12, "NVIDIA H200 Tensor Core GPU data sheet: GPU memory bandwidth 4.8 TB/s"),
    "H100 PCIe": (2.0e12, "NVIDIA H100 data sheet: GPU memory bandwidth 2 TB/s (PCIe)"),
    "H100": (3.35e12, "NVIDIA H100 data sheet: GPU memory bandwidth 3.35 TB/s (SXM)"),
    "A100": (2.039e12, "NVIDIA A100 data sheet: GPU memory bandwidth 2,039 GB/s (80GB SXM)"),
    "L40S": (864e9, "NVIDIA L40S data sheet: GPU memory bandwidth 864 GB/s"),
    "RTX A6000": (768e9, "NVIDIA RTX A6000 data sheet: GPU memory bandwidth 768 GB/s"),
}


def _by_gpu(table: Mapping[str, tuple[float, str]], gpu_name: str) -> tuple[float, str] | None:
    for key in sorted(table, key=len, reverse=True):  # longest first: "H100 PCIe" before "H100"
        if key in gpu_name:
            return table[key]
    return None


def peak_bf16_flops(gpu_name: str) -> tuple[float, str] | None:
    """The dense bf16 peak of ``gpu_name`` and its source; None for a GPU the table lacks."""
    return _by_gpu(PEAK_BF16_FLOPS, gpu_name)


def hbm_bytes_per_s(gpu_name: str) -> tuple[float, str] | None:
    """The device memory bandwidth of ``gpu_name`` and its source; None for a GPU the table lacks."""
    return _by_gpu(HBM_BYTES_PER_S, gpu_name)


def linear_params(shape: ModelShape) -> int:
    """Weights that multiply every token: the decoder layers' projections and the lm_head."""
    h, q, kv = shape.hidden, shape.q_dim, shape.kv_dim
    per_layer = h * q + 2 * h * kv + q * h + 3 * h * shape.intermediate
    return shape.layers * per_layer + shape.vocab * h


def forward_flops(shape: ModelShape, seq_lens: Iterable[int]) -> dict[str, float]:
    """Forward FLOPs of a micro-batch of sequences ``seq_lens`` (tokens each): linear layers and attention."""
    lens = [int(n) for n in seq_lens]
    linear = 2.0 * linear_params(shape) * sum(lens)
    attention = 2.0 * shape.layers * shape.q_dim * sum(n * n for n in lens)
    return {"linear": linear, "attention": attention, "total": linear + attention}


@dataclass(frozen=True)
class StepShape:
    """What one GPU computes in one GRPO step: its sequences' real lengths, and the padded length each is
    computed at (equal to the real one with remove-padding)."""

    real_lens: tuple[int, ...]
    padded_lens: tuple[int, ...]
    gradient_checkpointing: bool


def step_shape(recipe: Mapping[str, Any], step: Mapping[str, Any]) -> StepShape:
    """A GPU's sequences in a step from verl's metrics: sequences per GPU = batch x group / GPUs, each of the
    step's mean prompt + response length (verl logs means, not every length; the attention term is then a
    lower bound by Jensen). Without remove-padding verl computes every sequence at max prompt + max response."""
    per_gpu = recipe["train_batch_size"] * recipe["rollout_n"] // recipe["n_gpus"]
    real = round(step["prompt_length/mean"] + step["response_length/mean"])
    padded = real if recipe.get("use_remove_padding") else recipe["max_prompt_length"] + recipe["max_response_length"]
    return StepShape((real,) * per_gpu, (padded,) * per_gpu, bool(recipe.get("gradient_checkpointing", True)))


def compute_limits(shape: ModelShape, work: StepShape, peak_flops: float, update_s: float | None,
                   log_prob_s: float | None) -> dict[str, dict[str, Any]]:
    """update_actor and old_log_prob against the peak: model FLOPs (MFU), hardware FLOPs (with recompute and
    padding) and the seconds the model FLOPs would take at the peak."""
    real, padded = forward_flops(shape, work.real_lens)["total"], forward_flops(shape, work.padded_lens)["total"]
    phases = {
        "update_actor": (update_s, 3 * real, 3 * padded + (padded if work.gradient_checkpointing else 0.0)),
        "old_log_prob": (log_prob_s, real, padded),
    }
    out = {}
    for phase, (seconds, model, hardware) in phases.items():
        entry = {"basis": "bf16 FLOP/s", "model_flops": model, "hardware_flops": hardware,
                 "limit_s": model / peak_flops, "seconds": seconds, "fraction": None, "hardware_fraction": None}
        if seconds:
            entry["fraction"] = model / seconds / peak_flops
            entry["hardware_fraction"] = hardware / seconds / peak_flops
        out[phase] = entry
    return out


def kv_bytes_per_token(shape: ModelShape, dtype_bytes: int) -> int:
    """The KV cache of one token: a key and a value of kv_dim in every layer."""
    return 2 * shape.layers * shape.kv_dim * dtype_bytes


def expected_max(pmf: Mapping[int, float], n: int) -> float:
    """E[max of n independent draws] of a distribution on 1, 2, ...: the sum over k of P(max >= k) = 1 - F(k-1)^n."""
    cdf, total = 0.0, 0.0
    for k in range(1, max(pmf) + 1):
        total += 1.0 - min(cdf, 1.0) ** n
        cdf += pmf.get(k, 0.0)
    return total


def decode_bound(shape: ModelShape, *, sequences: int, prompt_tokens: float, response_pmf: Mapping[int, float],
                 hbm_bytes_per_s: float, dtype_bytes: int = 2, max_num_seqs: int | None = None,
                 kv_pool_tokens: int | None = None) -> dict[str, Any]:
    """The least time one engine can take to decode ``sequences`` responses, from memory bandwidth alone.

    Each decode step reads every weight that multiplies a token once (:func:`linear_params`, the lm_head included)
    and, per running sequence, the KV cache of its context. Prefill samples a response's first token, so a response
    of r tokens takes r - 1 decode steps, the j-th reading the KV of prompt + j positions: in expectation over the
    lengths ``response_pmf`` ({tokens: probability}) p(E[r] - 1) + (E[r^2] - E[r]) / 2 tokens per sequence. The KV
    bytes are the same however the engine batches; the weight reads are once per step, and the steps are at least
    each of: the longest response's (E[max] - 1), all decode tokens over ``max_num_seqs`` running at once, and all
    KV token reads over the ``kv_pool_tokens`` the pool holds at once (each term left out where None). The largest
    sets the bound (``steps_set_by``). Prefill, sampling and scheduling are not counted: a lower bound."""
    mean_r = sum(k * p for k, p in response_pmf.items())
    mean_r2 = sum(k * k * p for k, p in response_pmf.items())
    context = prompt_tokens * (mean_r - 1) + (mean_r2 - mean_r) / 2  # KV tokens one sequence's decode steps read
    steps = {"the longest response": expected_max(response_pmf, sequences) - 1,
             "max_num_seqs": sequences * (mean_r - 1) / max_num_seqs if max_num_seqs else 0.0,
             "the KV pool": sequences * context / kv_pool_tokens if kv_pool_tokens else 0.0}
    set_by = max(steps, key=steps.get)
    weight_bytes = steps[set_by] * linear_params(shape) * dtype_bytes
    kv_bytes = sequences * context * kv_bytes_per_token(shape, dtype_bytes)
    return {"basis": "HBM bandwidth: weights once per decode step + each sequence's KV cache at its context",
            "decode_steps": steps[set_by], "steps_set_by": set_by, "weight_bytes": weight_bytes, "kv_bytes": kv_bytes,
            "limit_s": (weight_bytes + kv_bytes) / hbm_bytes_per_s}


def bandwidth_limit(seconds: float | None, bytes_moved: float, bytes_per_s: float, what: str) -> dict[str, Any]:
    """A phase that moves ``bytes_moved`` over a link of ``bytes_per_s``."""
    return {"basis": what, "bytes": bytes_moved, "limit_s": bytes_moved / bytes_per_s, "seconds": seconds,
            "fraction": (bytes_moved / bytes_per_s) / seconds if seconds else None}


def throughput_limit(seconds: float | None, tokens: float, ceiling_tok_s: float | None, what: str) -> dict[str, Any]:
    """A phase whose ceiling is a measured throughput (vLLM alone on the same node)."""
    if not ceiling_tok_s:
        return {"basis": what, "tokens": tokens, "limit_s": None, "seconds": seconds, "fraction": None}
    return {"basis": what, "tokens": tokens, "limit_s": tokens / ceiling_tok_s, "seconds": seconds,
            "fraction": (tokens / ceiling_tok_s) / seconds if seconds else None}


def step_cut_needs(step_s: float, update_s: float, update_mfu: float, gen_s: float, cut: float,
                   mfu_target: float) -> dict[str, Any]:
    """What shortening a step by ``cut`` (a fraction of ``step_s``) asks of update_actor and gen, each phase's work
    (FLOPs, bytes) and every other phase unchanged: MFU scales as 1 / seconds at fixed FLOPs.

    ``update_alone_*``: update_actor's seconds and MFU if it alone gave the whole cut (``None`` where the cut is
    longer than the phase); ``update_at_target_s``: update_actor at ``mfu_target``; ``gen_then_s``: what gen must
    take for the rest of the cut once update_actor is at ``mfu_target``; ``gen_alone_s``: gen's seconds if it alone
    gave the cut (negative: impossible)."""
    need = cut * step_s
    update_alone_s = update_s - need
    update_at_target_s = update_s * update_mfu / mfu_target
    return {"step_s": step_s, "target_step_s": step_s - need, "cut_s": need,
            "update_alone_s": update_alone_s if update_alone_s > 0 else None,
            "update_alone_mfu": update_mfu * update_s / update_alone_s if update_alone_s > 0 else None,
            "update_at_target_s": update_at_target_s,
            "gen_then_s": gen_s - max(0.0, need - (update_s - update_at_target_s)),
            "gen_alone_s": gen_s - need}


def between_phases(step_s: float | None, phase_s: Iterable[float | None]) -> dict[str, Any]:
    """The step time no named phase accounts for, and its share of the step."""
    known = sum(s for s in phase_s if s)
    rest = max(step_s - known, 0.0) if step_s else None
    return {"basis": "step time minus the named phases", "seconds": rest, "limit_s": 0.0,
            "share_of_step": rest / step_s if step_s else None}


# ---------------------------------------------------------------------------------------------------
# one GRPO run's steps 2.. against their limits

GIB_BYTES = 2**30
PINNED_BENCH = "outputs/02_host_adamw/h200/metrics.json"  # the node's pinned copy bench (bench_copy.gbps)
HOST_STEP_BYTES_PER_PARAM = 8  # fp32 gradient device -> host, updated fp32 master host -> device
WEIGHT_SYNC_BYTES_PER_PARAM = 2  # the bf16 weights vLLM receives, from the host when the actor is offloaded


def pinned_bench_gbps() -> float | None:
    """The node's pinned host->device copy rate in GB/s from the committed bench (:data:`PINNED_BENCH`); None
    where this checkout lacks it."""
    import json

    from rlkit.core.env import REPO_ROOT

    bench = REPO_ROOT / PINNED_BENCH
    return json.loads(bench.read_text())["bench_copy"]["gbps"]["h2d_pinned"] if bench.exists() else None


VLLM_CEILINGS = "outputs/_node/vllm_standalone"  # one folder per standalone vLLM measurement
# What a ceiling must share with a run to be its gen limit (recipe keys; plus the GPU's name): the checkpoint
# (preset and synthetic length model), the batch and group, the length caps, the sequences one vLLM replica
# serves (n_gpus / rollout_tp replicas) and the engine settings that size its KV cache and CUDA graphs.
CEILING_MATCH_KEYS = ("model", "response_length_mean", "train_batch_size", "rollout_n", "max_prompt_length",
                      "max_response_length", "n_gpus", "rollout_tp", "gpu_memory_utilization", "emulate_gpu_gib",
                      "enforce_eager")


def ceiling_shape(recipe: Mapping[str, Any], gpu_name: str | None) -> dict[str, Any]:
    """The keys a standalone vLLM ceiling is matched on, from a run's recipe and its GPU."""
    defaults = {"response_length_mean": 0, "rollout_tp": 1, "emulate_gpu_gib": 0.0, "enforce_eager": False}
    return {**{k: recipe.get(k, defaults.get(k)) for k in CEILING_MATCH_KEYS}, "gpu": gpu_name}


def vllm_ceiling(recipe: Mapping[str, Any], gpu_name: str | None, *, root=None, committed: bool = True) -> dict[str, Any]:
    """The newest standalone vLLM measurement matching a run (:func:`ceiling_shape`): ``output_tok_s`` (None
    where none matches), ``source`` (its folder, relative to the repository where it lies inside it) and
    ``reason`` (what was found, or why nothing). ``root``: the repository (default: this checkout);
    ``committed``: only folders whose ``metrics.json`` git tracks (a local run is not a committed result)."""
    import json
    from pathlib import Path

    from rlkit.core.env import REPO_ROOT
    from rlkit.core.results import NotACheckout, committed_runs, run_folders

    root = Path(root).resolve() if root else REPO_ROOT
    folder = root / VLLM_CEILINGS
    want = ceiling_shape(recipe, gpu_name)
    none = {"output_tok_s": None, "source": None}
    try:
        runs = committed_runs(folder) if committed else run_folders(folder)
    except NotACheckout as err:
        return {**none, "reason": f"no committed ceiling can be read: {err}"}
    if not runs:
        return {**none, "reason": f"no standalone vLLM measurement {'committed ' if committed else ''}under "
                                  f"{VLLM_CEILINGS}/ (python -m rlkit.experiments.vllm_ceiling on the node)"}
    found, misses = [], []
    for run in runs:
        metrics = json.loads((run / "metrics.json").read_text())
        have = metrics.get("shape") or {}
        diff = [f"{k} {have.get(k)!r} (run: {v!r})" for k, v in want.items() if have.get(k) != v]
        if diff:
            misses.append(f"{run.name}: {', '.join(diff)}")
        elif metrics.get("output_tok_s"):
            found.append((metrics.get("measured_utc") or "", run.name, run, metrics["output_tok_s"]))
    if not found:
        return {**none, "reason": "no standalone vLLM measurement matches this run: " + "; ".join(misses)}
    when, _, run, tok_s = max(found)
    source = str(run.relative_to(root)) if run.is_relative_to(root) else str(run)
    return {"output_tok_s": tok_s, "source": source,
            "reason": f"standalone vLLM output tokens/s on this GPU, {source} (measured {when or 'at an unrecorded time'})"}


DECODE_DTYPE_BYTES = 2  # verl 0.9.1's rollout runs vLLM in bf16 with its KV cache in the model's dtype (kv_cache_dtype auto)
VERL_MAX_NUM_SEQS = 256  # verl 0.9.1's rollout default (verl/trainer/config/rollout/rollout.yaml max_num_seqs), which the recipe keeps


def decode_inputs(recipe: Mapping[str, Any], mean: Mapping[str, float | None]) -> dict[str, Any] | None:
    """What one vLLM replica decodes in a GRPO step: its share of the batch (``sequences``), the steps' mean prompt
    (``prompt_tokens``), the response lengths (``response_pmf``: the synthetic length model's distribution where the
    recipe has one, ``response_length_mean``, else every response at the steps' measured mean; verl logs no more, and
    E[r^2] >= E[r]^2 keeps a bound from it a lower one) and ``max_num_seqs``. None for steps without lengths."""
    from rlkit.models.lengths import response_length_pmf

    if None in mean.values():
        return None
    pmf = (response_length_pmf(recipe["response_length_mean"], recipe["max_response_length"])
           if recipe.get("response_length_mean") else {max(round(mean["response_length/mean"]), 1): 1.0})
    return {"sequences": recipe["train_batch_size"] * recipe["rollout_n"] * recipe.get("rollout_tp", 1) // recipe["n_gpus"],
            "prompt_tokens": mean["prompt_length/mean"], "response_pmf": pmf,
            "max_num_seqs": recipe.get("max_num_seqs", VERL_MAX_NUM_SEQS)}


def gen_hbm_bound(recipe: Mapping[str, Any], mean: Mapping[str, float | None], shape: ModelShape, gpu_name: str,
                  gen_s: float | None) -> dict[str, Any] | None:
    """gen against :func:`decode_bound` for one vLLM replica's share of the batch (:func:`decode_inputs`). None for a
    GPU :data:`HBM_BYTES_PER_S` lacks or steps without lengths."""
    hbm, work = hbm_bytes_per_s(gpu_name), decode_inputs(recipe, mean)
    if hbm is None or work is None:
        return None
    bound = decode_bound(shape, **work, hbm_bytes_per_s=hbm[0], dtype_bytes=DECODE_DTYPE_BYTES)
    return {**bound, "hbm_source": hbm[1], "seconds": gen_s, "fraction": bound["limit_s"] / gen_s if gen_s else None}


def _mean(steps: list[Mapping[str, Any]], key: str) -> float | None:
    values = [s[key] for s in steps if isinstance(s.get(key), (int, float))]
    return sum(values) / len(values) if values else None


def grpo_step_limits(recipe: Mapping[str, Any], steps: list[Mapping[str, Any]], shape: ModelShape, gpu_name: str,
                     *, pinned_gbps: float | None, gen_ceiling: Mapping[str, Any] | None = None,
                     optimizer_step_s: float | None = None) -> dict[str, Any]:
    """Every phase of a GRPO run's averaged steps (``steps``: verl's metrics of steps 2..) against its limit.

    ``pinned_gbps``: the node's pinned host<->device copy rate (GB/s) for the host optimizer step and the weight
    sync of an offloaded actor; ``gen_ceiling``: :func:`vllm_ceiling`'s answer for this run, standalone vLLM's
    output tokens/s per replica at the run's batch and lengths (None, or its ``output_tok_s`` None: gen's limit
    and fraction are then absent and its ``reason`` says why); ``optimizer_step_s``: the host optimizer step's
    seconds inside update_actor (rlkit's rank-identity records), for HostAdamW runs."""
    if not steps:
        return {}
    peak = peak_bf16_flops(gpu_name)
    mean = {k: _mean(steps, k) for k in ("prompt_length/mean", "response_length/mean")}
    phase_s = {p: _mean(steps, f"timing_s/{p}") for p in ("gen", "old_log_prob", "update_actor", "update_weights")}
    step_s = _mean(steps, "timing_s/step")
    out: dict[str, Any] = {"gpu": gpu_name, "peak_bf16_flops": peak[0] if peak else None,
                           "peak_source": peak[1] if peak else f"{gpu_name!r} is not in rlkit.planning.roofline.PEAK_BF16_FLOPS",
                           "model": shape.name, "phases": {}}
    if peak and None not in mean.values():
        work = step_shape(recipe, mean)
        out["sequences_per_gpu"] = len(work.real_lens)
        out["tokens_per_sequence"] = {"real": work.real_lens[0], "computed": work.padded_lens[0]}
        out["phases"].update(compute_limits(shape, work, peak[0], phase_s["update_actor"], phase_s["old_log_prob"]))
        if "skip_old_logprob" in recipe.get("patches", ()):  # on-policy: the pass only hands the rollout's log-probs on
            out["phases"]["old_log_prob"] = {"basis": "skipped (on-policy): no forward pass to compare",
                                             "seconds": phase_s["old_log_prob"], "limit_s": None, "fraction": None}
    replicas = recipe["n_gpus"] // recipe.get("rollout_tp", 1)  # each vLLM replica serves its share of the batch
    generated = recipe["train_batch_size"] * recipe["rollout_n"] / replicas * (mean["response_length/mean"] or 0)
    ceiling = gen_ceiling or {"output_tok_s": None, "source": None, "reason": "no standalone vLLM ceiling looked up"}
    out["phases"]["gen"] = {**throughput_limit(phase_s["gen"], generated, ceiling["output_tok_s"],
                                               "standalone vLLM output tokens/s per replica" if ceiling["output_tok_s"]
                                               else "no standalone vLLM measurement matches this run"),
                            "ceiling": ceiling["source"], "reason": ceiling["reason"],
                            "hbm_bound": gen_hbm_bound(recipe, mean, shape, gpu_name, phase_s["gen"])}
    if pinned_gbps:
        rate = pinned_gbps * 1e9
        if recipe.get("optimizer") == "HostAdamW":
            out["phases"]["optimizer_step"] = bandwidth_limit(optimizer_step_s, HOST_STEP_BYTES_PER_PARAM * shape.params, rate,
                                                              "pinned PCIe copies: fp32 grads D2H + fp32 master H2D")
        if recipe.get("param_offload"):
            out["phases"]["update_weights"] = bandwidth_limit(phase_s["update_weights"],
                                                              WEIGHT_SYNC_BYTES_PER_PARAM * shape.params, rate,
                                                              "pinned H2D of the bf16 weights (a lower bound)")
    out["phases"]["between_phases"] = between_phases(step_s, [*phase_s.values(), _mean(steps, "timing_s/adv"),
                                                              _mean(steps, "timing_s/reward"), _mean(steps, "timing_s/ref")])
    return out
