"""The pre-flight's memory checks of a verl config, each ``(VerlConfig, Context) -> list[Finding]`` as in
:mod:`rlkit.planning.preflight`, which runs them with its other checks. :func:`check_planner` is the phase-budget planner's
verdict (:mod:`rlkit.planning.verdict`) on the inputs the config implies (:func:`planner_spec_for_overrides`: micro-batch tokens,
the update's entropy and logits path, the rlkit options of the active patches and of HostAdamW); :func:`check_logits_path`
names the logits path the actor takes (verl's unfused logits, verl's fused kernels, or rlkit's ``chunked_logprobs``
patch) with its GiB for the update micro-batch, padded or not, next to the alternative's; :func:`check_host_memory`
holds HostAdamW's host state per node (:func:`rlkit.planning.host_memory.host_adamw_bytes`) against the node's available host memory
(:func:`available_host_gib`: this machine's ``MemAvailable``).
"""
from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import replace

from rlkit.core.params import ParamError
from rlkit.planning.preflight_findings import ACTOR_FSDP, ROLLOUT, Context, Finding
from rlkit.planning.vllm_terms import cuda_graphs_term
from rlkit.verl.config import VerlConfig, parse_overrides

SELECTIVE_ENV = "RLKIT_SELECTIVE_LAYERS"  # rlkit.patches.verl.selective_checkpoint.ENV (not imported: it imports torch)
RANK0_OWNER_KEY = "actor_rollout_ref.actor.optim.override_optimizer_config.rank0_owner"
OWNERS_KEY = "actor_rollout_ref.actor.optim.override_optimizer_config.owners"
NNODES = "trainer.nnodes"
ENTROPY_COEFF = "actor_rollout_ref.actor.entropy_coeff"


def _entropy_coeff(c: VerlConfig) -> float:
    return float(c.get(ENTROPY_COEFF) or 0.0)


def _update_entropy(c: VerlConfig, active_patches: Iterable[str]) -> str:
    """How the update computes the entropy (budget.UPDATE_ENTROPY_BYTES), as verl 0.9.1's trainer decides it."""
    coeff = _entropy_coeff(c)
    if not (c.get("actor_rollout_ref.actor.calculate_entropy") or coeff != 0.0):
        return "none"
    return "detached" if coeff == 0.0 and "metric_entropy" in active_patches else "backprop"


MODEL = "actor_rollout_ref.model"
FUSED_KERNELS = f"{MODEL}.use_fused_kernels"
FUSED_BACKEND = f"{MODEL}.fused_kernel_options.impl_backend"
UNFUSED_PATH = "torch_rowwise"  # budget.LOGITS_BYTES: verl's unfused path without flash-attn (the planner's default)


def _logits_path(c: VerlConfig, active_patches: Iterable[str]) -> str:
    """How the actor turns hidden states into log-probs (a budget.LOGITS_BYTES path): rlkit's chunked_logprobs
    patch (it takes over verl's fused-kernel path), verl's own fused kernels, or verl's unfused logits."""
    if "chunked_logprobs" in active_patches:
        return "chunked_logprobs"
    return "verl_fused" if c.get(FUSED_KERNELS) else UNFUSED_PATH


def _mean_response_tokens(model: str, max_response_length: int) -> float:
    """Expected response tokens of a random-init model written by rlkit.models.offline with the synthetic length
    model (its marker's response_length_mean); 0 (= max_response_length) for any other model."""
    from rlkit.models import lengths as length_model
    from rlkit.models import offline as offline_model

    marker = offline_model.read_marker(model) if os.path.isdir(os.path.expanduser(str(model))) else None
    mean = int((marker or {}).get("response_length_mean") or 0)
    return length_model.expected_response_tokens(mean, max_response_length) if mean else 0


def _planner_spec(c: VerlConfig, ctx: Context):
    """A budget.PlanSpec from the config, or a reason why the planner cannot run."""
    from rlkit.models import shape as model_shape
    from rlkit.planning import budget

    model = c.get("actor_rollout_ref.model.path")
    if not model:
        return None, "actor_rollout_ref.model.path is not set"
    try:
        model_shape.resolve_model(model)
    except ParamError:
        return None, f"model {model!r} matches no planner preset and no local config.json"
    if ctx.gpu_gib is None:
        return None, "the GPU memory is unknown (pass --gpu-gib)"
    n = c.world_size
    mean_response = _mean_response_tokens(model, int(c.get("data.max_response_length")))
    # a micro-batch of a fixed number of sequences holds that many expected lengths of actual tokens
    expected_seq = int(c.get("data.max_prompt_length")) + (mean_response or int(c.get("data.max_response_length")))
    micro_batches = _micro_batch_tokens(c, expected_seq)
    if micro_batches is None:
        return None, "no actor micro-batch size is set (ppo_micro_batch_size_per_gpu)"
    tokens, lp_tokens = micro_batches
    values = {
        "model": model, "gpu_gib": ctx.gpu_gib, "n_gpus": n, "nodes": int(c.get(NNODES)),
        "gpu_memory_utilization": c.get(f"{ROLLOUT}.gpu_memory_utilization"),
        "max_prompt_length": int(c.get("data.max_prompt_length")), "max_response_length": int(c.get("data.max_response_length")),
        "train_batch_size": int(c.get("data.train_batch_size")), "group_size": int(c.get(f"{ROLLOUT}.n")),
        "micro_batch_tokens": tokens, "log_prob_micro_batch_tokens": lp_tokens,
        "lora_rank": int(c.get("actor_rollout_ref.model.lora_rank") or 0),
        "gradient_checkpointing": bool(c.get("actor_rollout_ref.model.enable_gradient_checkpointing")),
        "param_offload": bool(c.get(f"{ACTOR_FSDP}.param_offload")),
        "optimizer_offload": bool(c.get(f"{ACTOR_FSDP}.optimizer_offload")),
    }
    if c.get(f"{ROLLOUT}.enforce_eager"):
        values["cudagraph_gib"] = 0.0
    elif (graphs := cuda_graphs_term(model)["gib"]) is not None:  # what vLLM took for this model, not the default
        values["cudagraph_gib"] = graphs
    values["update_entropy"] = _update_entropy(c, ctx.active_patches)
    values["logits_path"] = _logits_path(c, ctx.active_patches)
    values["remove_padding"] = bool(c.get(f"{MODEL}.use_remove_padding"))
    values["mean_response_tokens"] = mean_response
    if "selective_checkpoint" in ctx.active_patches:  # the count the patch reads; unset: plan full checkpointing
        raw = ctx.env.get(SELECTIVE_ENV, "")
        values["selective_layers"] = model_shape.resolve_model(model).layers if raw == "all" else int(raw or 0)
    spec = budget.with_options(budget.PlanSpec(**values), sorted(_planner_options(c, ctx)))
    return spec, ""


def _micro_batch_tokens(c: VerlConfig, expected_seq: int) -> tuple[int, int] | None:
    """Actual tokens per GPU of an update and of a log-prob micro-batch: verl's dynamic-bsz token budget, or the
    micro-batch's sequences at ``expected_seq`` tokens each; None when no actor micro-batch size is set."""
    n = c.world_size
    if c.get("actor_rollout_ref.actor.use_dynamic_bsz"):
        tokens = int(c.get("actor_rollout_ref.actor.ppo_max_token_len_per_gpu"))
    else:
        per_gpu = c.get("actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu")
        glob = c.get("actor_rollout_ref.actor.ppo_micro_batch_size")
        mbs = per_gpu or (max(1, int(glob) // n) if glob else None)
        if not mbs:
            return None
        tokens = round(int(mbs) * expected_seq)
    if c.get(f"{ROLLOUT}.log_prob_use_dynamic_bsz"):
        lp_tokens = int(c.get(f"{ROLLOUT}.log_prob_max_token_len_per_gpu"))
    else:
        lp = c.get(f"{ROLLOUT}.log_prob_micro_batch_size_per_gpu")
        lp_tokens = round(int(lp) * expected_seq) if lp else tokens
    return tokens, lp_tokens


def _planner_options(c: VerlConfig, ctx: Context) -> set[str]:
    """The planner's rlkit options: the context's, the active patches that are options, and HostAdamW's."""
    from rlkit.planning import budget

    options = set(ctx.planner_options)
    options |= {p for p in ctx.active_patches if p in budget.RLKIT_OPTIONS}
    if "rlkit" in str(c.get("actor_rollout_ref.actor.optim.optimizer_impl")):  # HostAdamW (rlkit.optim)
        options.add("cpu_optimizer_step")
        # verl passes optim.override_optimizer_config as keyword arguments to the optimizer
        if c.is_set(RANK0_OWNER_KEY) and c.get(RANK0_OWNER_KEY):
            options.add("rank0_owner")
    return options


def selective_layers_that_fit(overrides: list[str], active_patches: Iterable[str], *, gpu_gib: float) -> int | None:
    """Pre-flight's choice of how many layers to checkpoint selectively: the most the planner fits for exactly this
    verl command (:func:`rlkit.planning.verdict.most_selective_layers`); None when the planner cannot run."""
    from rlkit.planning import verdict

    spec = planner_spec_for_overrides(overrides, active_patches, gpu_gib=gpu_gib)
    return None if spec is None else verdict.most_selective_layers(replace(spec, selective_layers=0))


def planner_spec_for_overrides(overrides: list[str], active_patches: Iterable[str] = (), *, gpu_gib: float):
    """The phase-budget planner's inputs for exactly this verl command (None when the planner cannot run)."""
    ctx = Context(active_patches=list(active_patches), env=os.environ, ray_version=None, gpu_gib=gpu_gib,
                  planner_options=[])
    spec, _ = _planner_spec(VerlConfig(parse_overrides(overrides)), ctx)
    return spec


# A padded plan that fits with less headroom than this fraction of the card is a warning. Measured: arm 1 padded at
# 12,288 tokens per micro-batch planned 46.71 of 47.40 GiB (headroom 1.5%), peaked at 46.76 GiB in steps 1-2 and ran
# out of the card at step 3 asking for 0.75 GiB more with 47.19 allocated, i.e. at least 2.6% over the plan
# (outputs/05_grpo_qwen3_4b/h200-seed-1-fixes-hostadamw-padded-tok12288/metrics.json).
PADDED_HEADROOM_FRACTION = 0.05


def check_planner(c: VerlConfig, ctx: Context) -> list[Finding]:
    from rlkit.planning import verdict

    key = f"{ROLLOUT}.gpu_memory_utilization"
    try:
        spec, why = _planner_spec(c, ctx)
    except ParamError as err:
        return [Finding("error", key, f"the phase-budget planner rejects this config: {err}", "fix the named key")]
    if spec is None:
        return [Finding("info", "actor_rollout_ref.model.path", f"phase-budget planner skipped: {why}",
                        "set actor_rollout_ref.model.path to a preset or a local model folder and pass --gpu-gib")]
    result = verdict.plan(spec)
    tp = c.get(f"{ROLLOUT}.tensor_model_parallel_size")
    caveat = f" (the planner assumes one vLLM engine per GPU, TP=1; this config has TP={tp})" if tp != 1 else ""
    message = (f"planner ({result.model}, {spec.gpu_gib} GiB x {spec.n_gpus}, options: "
               f"{', '.join(spec.options) or 'none'}): {result.verdict}: {result.reason}{caveat}")
    if result.fits and not spec.remove_padding and result.headroom_gib < PADDED_HEADROOM_FRACTION * spec.gpu_gib:
        return [Finding("warning", key, f"{message}; padded, the headroom is under {PADDED_HEADROOM_FRACTION:.0%} of the "
                        "card: a padded micro-batch holds its longest sequence's length times its sequence count, which "
                        "swings from one micro-batch to the next around the expected count the planner takes",
                        f"lower actor_rollout_ref.actor.ppo_max_token_len_per_gpu until the headroom is {PADDED_HEADROOM_FRACTION:.0%} of "
                        f"the card, or set {MODEL}.use_remove_padding=True (rlkit_varlen attention without flash-attn)")]
    if result.fits:
        return [Finding("info", key, message, "none needed")]
    fixes = {
        "vLLM refuses to start": "lower gpu_memory_utilization, or free the actor's rollout residue "
                                 "(offload_views patch, param/optimizer offload)",
        "no KV cache": "raise gpu_memory_utilization or reduce CUDA-graph capture sizes",
        "host OOM": "use rank-0 ownership of the host optimizer, or more host memory",
    }
    fix = fixes.get(result.verdict, f"reduce {result.binding.split(':')[-1]} in {result.peak_phase}: smaller "
                                    f"micro-batch tokens, the rlkit options (cpu_optimizer_step, master_on_host), "
                                    f"LoRA, or more GPU memory")
    return [Finding("error", key, message, fix)]


OPTIMIZER_IMPL = "actor_rollout_ref.actor.optim.optimizer_impl"
PIN_MEMORY_KEY = "actor_rollout_ref.actor.optim.override_optimizer_config.pin_memory"
OVERLAP_KEY = "actor_rollout_ref.actor.optim.override_optimizer_config.overlap_copies"
PREFETCH_KEY = "actor_rollout_ref.actor.optim.override_optimizer_config.prefetch_grads"


def available_host_gib(meminfo: str | os.PathLike | None = None) -> float | None:
    """This machine's ``MemAvailable`` in GiB (``meminfo``: a /proc/meminfo-format file; default this host's),
    None where it cannot be read."""
    from rlkit.measure import samplers as measure

    available = measure.host_available_bytes(meminfo or measure.MEMINFO)
    return None if available is None else available / 2**30


def _model_shape(c: VerlConfig):
    """(the config's model path, its planner shape or None where no preset or local config.json matches)."""
    from rlkit.models import shape as model_shape

    model = c.get(f"{MODEL}.path")
    try:
        return model, model_shape.resolve_model(model) if model else None
    except ParamError:
        return model, None


def check_host_memory(c: VerlConfig, ctx: Context) -> list[Finding]:
    """HostAdamW's host state per node against the node's available memory (a host OOM kills a Ray worker
    with SIGKILL mid-update; a pin larger than the host fails at allocation, rlkit.optim.staging)."""
    from rlkit.planning.host_memory import host_adamw_bytes

    if "rlkit" not in str(c.get(OPTIMIZER_IMPL)):
        return []
    model, shape = _model_shape(c)
    if shape is None:
        return [Finding("info", OPTIMIZER_IMPL, f"HostAdamW's host memory not checked: model {model!r} matches no "
                        "planner preset and no local config.json", "set actor_rollout_ref.model.path to a preset or "
                        "a local model folder")]
    ranks = int(c.get("trainer.n_gpus_per_node"))
    owner = bool(c.is_set(RANK0_OWNER_KEY) and c.get(RANK0_OWNER_KEY))
    on_host = "master_on_host" in ctx.active_patches
    options = {"ranks": ranks, "param_offload": bool(c.get(f"{ACTOR_FSDP}.param_offload")),
               "lora_rank": int(c.get(f"{MODEL}.lora_rank") or 0),
               "overlap_copies": bool(c.is_set(OVERLAP_KEY) and c.get(OVERLAP_KEY)),
               "prefetch_grads": bool(c.is_set(PREFETCH_KEY) and c.get(PREFETCH_KEY))}
    need = host_adamw_bytes(shape, rank0_owner=owner, master_on_host=on_host, **options)
    gib = {k: v / 2**30 for k, v in need.items()}
    total = sum(gib.values())
    pinned = not (c.is_set(PIN_MEMORY_KEY) and c.get(PIN_MEMORY_KEY) is False)  # HostAdamW pins where CUDA is
    parts = ", ".join(f"{k} {v:.2f}" for k, v in gib.items() if v)
    message = (f"HostAdamW holds {total:.2f} GiB of host memory per node for {shape.name} on {ranks} rank(s) "
               f"({parts} GiB; rank0_owner={owner}, master_on_host={on_host}; staging "
               f"{'pinned (page-locked)' if pinned else 'pageable'}); verl's other processes come on top "
               f"(32-35 GiB more on the committed 2 x H200 Qwen3-4B arms)")
    if ctx.host_available_gib is None:
        return [Finding("info", OPTIMIZER_IMPL, message + "; the node's host memory is unknown",
                        "pass --host-gib <GiB available on a node>, or --host-gib auto on the node")]
    if total <= ctx.host_available_gib:
        return [Finding("info", OPTIMIZER_IMPL, f"{message}; {ctx.host_available_gib:.2f} GiB available: fits "
                        f"({ctx.host_available_gib - total:.2f} GiB left for the rest)", "none needed")]
    alternatives = []
    if not owner:
        with_owner = sum(host_adamw_bytes(shape, rank0_owner=True, master_on_host=on_host, **options).values())
        alternatives.append(f"{RANK0_OWNER_KEY}=true ({with_owner / 2**30:.2f} GiB: Adam state on rank 0 only)")
    if not on_host:
        with_master = sum(host_adamw_bytes(shape, rank0_owner=owner, master_on_host=True, **options).values())
        alternatives.append(f"the master_on_host patch ({with_master / 2**30:.2f} GiB: no second fp32 copy)")
    alternatives.append("a node with more free host memory")
    return [Finding("error", OPTIMIZER_IMPL, f"{message}, but the node has {ctx.host_available_gib:.2f} GiB "
                    f"available: the host runs out of memory (the kernel's OOM killer ends a Ray worker with SIGKILL, "
                    f"or HostAdamW's pinned staging allocation fails)", "; or ".join(alternatives))]


def check_network(c: VerlConfig, ctx: Context) -> list[Finding]:
    """On more than one node: what crosses the network each step (rlkit.planning.multinode), a warning where it binds."""
    from rlkit.planning import multinode

    nodes = int(c.get(NNODES))
    if nodes <= 1:
        return []
    model, shape = _model_shape(c)
    if shape is None:
        return [Finding("info", NNODES, f"network per step not planned: model {model!r} matches no planner preset and no "
                        "local config.json", "set actor_rollout_ref.model.path to a preset or a local model folder")]
    owner = "rlkit" in str(c.get(OPTIMIZER_IMPL)) and bool(c.is_set(RANK0_OWNER_KEY) and c.get(RANK0_OWNER_KEY))
    owners = (c.get(OWNERS_KEY) if c.is_set(OWNERS_KEY) else "group") if owner else "none"
    link = ctx.link_gbps or multinode.DEFAULT_LINK_GBPS
    try:
        plan = multinode.network_plan(shape, nodes=nodes, gpus_per_node=int(c.get("trainer.n_gpus_per_node")),
                                      owners=owners, lora_rank=int(c.get(f"{MODEL}.lora_rank") or 0), link_gbps=link)
    except ParamError as err:
        return [Finding("error", OWNERS_KEY, f"the network planner rejects this config: {err}", "fix the named key")]
    parts = ", ".join(f"{k} {v / 1e9:.2f}" for k, v in plan.bytes_per_node.items() if v)
    message = (f"{nodes} nodes: each node sends {plan.total_bytes / 1e9:.2f} GB per step over the network ({parts} GB; "
               f"HostAdamW owners: {owners}), at least {plan.floor_s:.2f} s at {link:g} Gbit/s")
    if not plan.warnings:
        return [Finding("info", NNODES, message, "none needed")]
    fix = (f"{OWNERS_KEY}=node (one HostAdamW owner per node, bit-identical)" if plan.bytes_per_node["owner_broadcast"]
           else "a faster link between the nodes, fewer nodes, or LoRA (fewer gradients to all-reduce)")
    return [Finding("warning", NNODES, f"{message}: " + "; ".join(plan.warnings), fix)]


LOGITS_PATHS = {
    "torch_rowwise": "verl's unfused path: the model returns the micro-batch's full logits, log-softmax row by row",
    "verl_fused": "verl's fused kernels (torch backend): log-probs from the hidden states in {rows}-row chunks, "
                  "recomputed in backward",
    "chunked_logprobs": "rlkit's chunked_logprobs patch: log-probs from the hidden states in {rows}-row chunks "
                        "(fp32 weight-gradient sum), recomputed in backward",
}


def _describe_path(path: str) -> str:
    from rlkit.planning import budget

    return LOGITS_PATHS[path].format(rows=budget.CHUNKED_LOGITS.get(path, {}).get("chunk_rows"))


def check_logits_path(c: VerlConfig, ctx: Context) -> list[Finding]:
    """Which logits path the actor takes and what it costs in the update micro-batch, next to the alternative."""
    from rlkit.planning import budget, verdict

    path = _logits_path(c, ctx.active_patches)
    out = []
    if path == "chunked_logprobs" and not (c.get(FUSED_KERNELS) and c.get(FUSED_BACKEND) == "torch"):
        out.append(Finding("error", FUSED_KERNELS,
                           f"the chunked_logprobs patch replaces verl's fused-kernel log-probs, but this config has "
                           f"use_fused_kernels={c.get(FUSED_KERNELS)}, impl_backend={c.get(FUSED_BACKEND)!r}: the "
                           f"patch stops the engine at start-up (the model would return full logits)",
                           f"set {FUSED_KERNELS}=True and {FUSED_BACKEND}=torch, or drop the chunked_logprobs patch"))
    elif path == "verl_fused" and c.get(FUSED_BACKEND) != "torch":
        out.append(Finding("warning", FUSED_BACKEND,
                           f"fused kernels with impl_backend={c.get(FUSED_BACKEND)!r}: the planner counts verl's "
                           f"torch backend", "treat the logits GiB below as an estimate"))
    alternative = UNFUSED_PATH if path in budget.CHUNKED_LOGITS else "chunked_logprobs"
    try:
        spec, why = _planner_spec(c, replace(ctx, gpu_gib=ctx.gpu_gib or 80.0))  # the card does not change logits
    except ParamError as err:
        spec, why = None, str(err)
    if spec is None:
        return out + [Finding("info", FUSED_KERNELS, f"logits path: {path} ({_describe_path(path)}); its size is "
                              f"unknown: {why}", "set actor_rollout_ref.model.path to a preset or a local model folder")]
    gib = verdict.update_logits_gib(spec, (path, alternative))
    positions = budget.micro_batch_positions(spec, spec.micro_batch_tokens)
    padding = ("unpadded, use_remove_padding=True" if spec.remove_padding else
               f"use_remove_padding=False: padded to {positions:,.0f} positions")
    message = (f"logits path: {path} ({_describe_path(path)}): {gib[path]:.2f} GiB for the update micro-batch of "
               f"{spec.micro_batch_tokens:,} tokens ({padding}); {alternative} would take {gib[alternative]:.2f} GiB")
    if gib[path] <= gib[alternative]:
        fix = "none needed"
    elif path in budget.CHUNKED_LOGITS:
        fix = (f"none needed; at micro-batches this small the unfused path is {gib[path] - gib[alternative]:.2f} GiB "
               f"smaller (a chunked path pays off above about one chunk of rows)")
    else:
        fix = (f"for {gib[path] - gib[alternative]:.2f} GiB less: {FUSED_KERNELS}=True with rlkit's chunked_logprobs "
               f"patch (verl's own fused kernels: {verdict.update_logits_gib(spec, ('verl_fused',))['verl_fused']:.2f} GiB)")
    return out + [Finding("info", FUSED_KERNELS, message, fix)]
