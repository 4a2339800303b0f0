"""Does a phase budget fit the card: :func:`plan` runs the phase-budget model (:mod:`rlkit.planning.budget`) for a
:class:`~rlkit.planning.budget.PlanSpec` and names its peak phase, the KV pool's concurrency, the binding constraint
and the verdict (:class:`Plan`); :func:`format_plan` is its text table. Two questions about other settings of one
spec: :func:`most_selective_layers`, the most layers that fit checkpointed selectively, and :func:`update_logits_gib`,
the update's log-prob GiB on other logits paths.

Pure arithmetic, like :mod:`rlkit.planning.budget`: no torch, CUDA or verl import. All memory values are GiB.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace
from typing import Any

from rlkit.models.shape import ModelShape, kv_bytes_per_seq, resolve_model
from rlkit.planning.budget import (
    DEVICE_COMPONENTS,
    GIB,
    RLKIT_OPTIONS,
    PlanSpec,
    logits_bytes,
    micro_batch_positions,
    phase_components,
)


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
    host_rank0, host_other, node_peak = _host_gib(spec, host)
    kv_pool = d["kv_pool_raw"]
    per_seq, max_seqs, seqs_per_gpu, waves = _rollout_waves(spec, s, kv_pool)

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


def _host_gib(spec: PlanSpec, host: dict[str, dict[str, float]]) -> tuple[dict[str, float], dict[str, float], float]:
    """Host GiB per phase of rank 0 and of every other rank, and the node's peak over the phases."""
    gib = lambda b: b / GIB
    host_rank0 = {p: gib(sum(c.values())) for p, c in host.items()}
    rank0_only = ("adam_moments", "staging_pinned") if spec.rank0_owner else ()  # other ranks never step
    host_other = {p: gib(sum(v for k, v in c.items() if k not in rank0_only)) for p, c in host.items()}
    # per node: the node with rank 0 (or, with owners per node, every node: each has its owner)
    node_peak = max(host_rank0[p] + (spec.n_gpus // spec.nodes - 1) * host_other[p] for p in host)
    return host_rank0, host_other, node_peak


def _rollout_waves(spec: PlanSpec, s: ModelShape, kv_pool: float) -> tuple[float, int, int, int]:
    """KV bytes per full-length sequence, the sequences the KV pool holds at once, the sequences per GPU of a step
    and the rollout waves they take."""
    per_seq = kv_bytes_per_seq(s, spec.max_prompt_length + spec.max_response_length)
    max_seqs = int(kv_pool / per_seq) if kv_pool > 0 else 0
    seqs_per_gpu = math.ceil(spec.train_batch_size * spec.group_size / spec.n_gpus)
    waves = math.ceil(seqs_per_gpu / max_seqs) if max_seqs > 0 else 0
    return per_seq, max_seqs, seqs_per_gpu, waves


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
