"""Lint a verl configuration for known memory and correctness traps before a GPU is booked.

Input is a YAML file, a shell script or command line holding ``python -m verl.trainer.main_ppo ...``
overrides, or a list of Hydra overrides (``key=value``, ``+key=value``, ``++key=value``, ``~key``), read by
:mod:`rlkit.verl_config` without verl; keys the input does not set take verl 0.9.1's defaults.

Each check returns :class:`Finding` objects (severity ``error`` / ``warning`` / ``info``, the dotted
config key, a message and a fix). The traps come from source document 003 (gpu_memory_utilization
semantics and band, max_num_batched_tokens, deprecated micro-batch keys, the dynamic-batch token
floor, disable_log_stats, CUDA-graph memory, the Ray uv runtime-env hook) and from verl 0.9's FSDP1
with fsdp_size=1 (no gradient all-reduce; param offload that frees nothing), which are reported as
fixed when the rlkit patch ``no_shard`` / ``offload_views`` is active. When the model and the GPU
memory are known, the phase-budget planner's verdict is a finding too, and the logits path the actor will take
(verl's unfused logits, verl's fused kernels, or rlkit's ``chunked_logprobs`` patch) is named with its GiB for
the update micro-batch (padded or not, per ``use_remove_padding``) and the alternative's. With HostAdamW
(``optimizer_impl=rlkit.optim``), its host state per node (fp32 masters, Adam moments, pinned staging buffers,
:func:`rlkit.budget.host_adamw_bytes`) is held against the node's available host memory when that is given
(``--host-gib``; ``auto``: this machine's ``MemAvailable``, what ``rlkit.verl_job`` passes before a launch).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass, replace
from importlib import metadata
from typing import Any

from rlkit.params import ParamError
from rlkit.verl_config import PreflightInputError, VerlConfig, merge_trees, load_config, parse_overrides

SEVERITIES = ("error", "warning", "info")
ACTOR_FSDP = "actor_rollout_ref.actor.fsdp_config"
RANK0_OWNER_KEY = "actor_rollout_ref.actor.optim.override_optimizer_config.rank0_owner"
ROLLOUT = "actor_rollout_ref.rollout"
UTIL_BAND = (0.5, 0.7)  # verl perf note: the useful band for gpu_memory_utilization
RAY_UV_HOOK_SINCE = "2.47"  # Ray versions that rewrite runtime_env["working_dir"] under `uv run`


@dataclass(frozen=True)
class Finding:
    severity: str  # error | warning | info
    key: str  # dotted config key
    message: str
    fix: str
    check: str = ""  # name of the check that produced it

    def __post_init__(self) -> None:
        if self.severity not in SEVERITIES:
            raise ValueError(f"severity {self.severity!r} is not one of {SEVERITIES}")

    def as_dict(self) -> dict[str, str]:
        return asdict(self)


# ---------------------------------------------------------------------------------------------------
# Checks: each takes (config, context) and returns findings
# ---------------------------------------------------------------------------------------------------

@dataclass
class Context:
    active_patches: list[str]
    env: Mapping[str, str]
    ray_version: str | None
    gpu_gib: float | None
    planner_options: list[str]
    host_available_gib: float | None = None  # host memory a job can get on a node (MemAvailable); None: unknown


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def check_gpu_memory_utilization(c: VerlConfig, ctx: Context) -> list[Finding]:
    key = f"{ROLLOUT}.gpu_memory_utilization"
    util, name = _number(c.get(key)), c.get(f"{ROLLOUT}.name")
    if util is None or not 0 < util <= 1:
        return [Finding("error", key, f"gpu_memory_utilization={c.get(key)!r} is not a fraction in (0, 1]",
                        "set a fraction such as 0.6")]
    if name == "sglang":
        return [Finding("warning", key,
                        f"for SGLang, gpu_memory_utilization={util} is a fraction of FREE memory for static "
                        f"allocations and the remaining 1-x is still used during inference; for vLLM (>=0.7) it "
                        f"is a fraction of TOTAL memory. A value copied from a vLLM config means something else",
                        "re-derive the value for SGLang; treat any copied value as a hypothesis")]
    low, high = UTIL_BAND
    if util < low:
        return [Finding("warning", key,
                        f"gpu_memory_utilization={util} (fraction of total memory for vLLM) is below verl's "
                        f"{low}-{high} band: less KV cache and lower rollout throughput",
                        f"raise it into {low}-{high} once the update-phase peak is known to fit (see the planner)")]
    if util > high:
        offloaded = c.get(f"{ACTOR_FSDP}.param_offload") and c.get(f"{ROLLOUT}.free_cache_engine")
        if offloaded:
            return [Finding("info", key,
                            f"gpu_memory_utilization={util} is above verl's {low}-{high} band; this only works "
                            f"because the actor leaves the device during rollout (param_offload + sleep mode)",
                            "check the planner finding: the actor's residue must fit in the 1-util left free")]
        return [Finding("warning", key,
                        f"gpu_memory_utilization={util} is above verl's {low}-{high} band while the actor stays "
                        f"on the device during rollout: little headroom for the update phase",
                        f"lower it into {low}-{high}, or enable fsdp_config.param_offload with free_cache_engine")]
    return []


def check_max_num_batched_tokens(c: VerlConfig, ctx: Context) -> list[Finding]:
    key = f"{ROLLOUT}.max_num_batched_tokens"
    value = _number(c.get(key))
    if value is not None and value <= 2048:
        return [Finding("warning", key,
                        f"max_num_batched_tokens={int(value)} is at or below 2048; verl's perf note recommends "
                        f">2048 for rollout throughput",
                        "raise it (e.g. 8192, verl's default) unless memory is known to be short")]
    return []


DEPRECATED_MICRO_BATCH = (
    ("actor_rollout_ref.actor.ppo_micro_batch_size", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu"),
    ("actor_rollout_ref.rollout.log_prob_micro_batch_size", "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu"),
    ("actor_rollout_ref.ref.log_prob_micro_batch_size", "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu"),
    ("critic.ppo_micro_batch_size", "critic.ppo_micro_batch_size_per_gpu"),
    ("critic.forward_micro_batch_size", "critic.forward_micro_batch_size_per_gpu"),
)


def check_deprecated_micro_batch(c: VerlConfig, ctx: Context) -> list[Finding]:
    out = []
    for old, new in DEPRECATED_MICRO_BATCH:
        if not c.is_set(old) or c.get(old) is None:
            continue
        if c.is_set(new) and c.get(new) is not None:
            out.append(Finding("error", old, f"both {old} (deprecated) and {new} are set; verl refuses this",
                               f"remove {old}"))
        else:
            out.append(Finding("warning", old,
                               f"{old}={c.get(old)} is deprecated: verl divides this global value by the GPU count "
                               f"({c.world_size} here), so a value tuned for another GPU count silently changes",
                               f"set {new} instead (performance batch sizes are per GPU)"))
    return out


def check_dynamic_bsz_floor(c: VerlConfig, ctx: Context) -> list[Finding]:
    seq = c.seq_len()
    floor = 2 * seq
    pairs = (
        ("actor_rollout_ref.actor.use_dynamic_bsz", "actor_rollout_ref.actor.ppo_max_token_len_per_gpu"),
        (f"{ROLLOUT}.log_prob_use_dynamic_bsz", f"{ROLLOUT}.log_prob_max_token_len_per_gpu"),
        ("actor_rollout_ref.ref.log_prob_use_dynamic_bsz", "actor_rollout_ref.ref.log_prob_max_token_len_per_gpu"),
    )
    out = []
    for flag, key in pairs:
        if not c.get(flag):
            continue
        limit = _number(c.get(key))
        if limit is None:
            continue
        if limit < seq:
            out.append(Finding("error", key,
                               f"{key}={int(limit)} is below one full sequence (max_prompt_length + "
                               f"max_response_length = {seq}); a long sample cannot be packed",
                               f"set it to at least {floor} (2 x {seq})"))
        elif limit < floor:
            out.append(Finding("warning", key,
                               f"{key}={int(limit)} is below the use_dynamic_bsz floor 2 x (max_prompt_length + "
                               f"max_response_length) = {floor}",
                               f"set it to at least {floor}; forward-only limits can go ~2x the actor's"))
    return out


def check_disable_log_stats(c: VerlConfig, ctx: Context) -> list[Finding]:
    key = f"{ROLLOUT}.disable_log_stats"
    if c.get(key) is not False:
        default = "" if c.is_set(key) else " (verl's default)"
        return [Finding("warning", key,
                        f"disable_log_stats={c.get(key)}{default}: vLLM emits no rollout statistics, so "
                        f"throughput and KV usage cannot be tuned",
                        f"set {key}=False")]
    return []


def check_cuda_graphs(c: VerlConfig, ctx: Context) -> list[Finding]:
    eager, sizes = c.get(f"{ROLLOUT}.enforce_eager"), c.get(f"{ROLLOUT}.cudagraph_capture_sizes")
    if eager and sizes:
        return [Finding("warning", f"{ROLLOUT}.cudagraph_capture_sizes",
                        f"cudagraph_capture_sizes={sizes} has no effect with enforce_eager=True",
                        "remove it, or set enforce_eager=False to capture graphs")]
    if not eager:
        return [Finding("info", f"{ROLLOUT}.enforce_eager",
                        "vLLM captures CUDA graphs (enforce_eager=False); their memory cannot be offloaded and "
                        "stays on the device while the actor updates, outside any actor offload",
                        "count it in the update budget (rlkit budget --cudagraph-gib); near the edge, shrink "
                        "cudagraph_capture_sizes")]
    return []


def _version_at_least(version: str | None, minimum: str) -> bool:
    if not version:
        return False
    from packaging.version import InvalidVersion, Version

    try:
        return Version(version) >= Version(minimum)
    except InvalidVersion:
        return False


def check_ray_uv_hook(c: VerlConfig, ctx: Context) -> list[Finding]:
    out = []
    py_key = "ray_kwargs.ray_init.runtime_env.py_executable"
    py = c.get(py_key)
    if isinstance(py, str) and py.split()[:2] == ["uv", "run"]:
        out.append(Finding("warning", py_key,
                           f"py_executable={py!r} is a `uv run` prefix; if the launcher relocates the working "
                           f"directory before ray.init(), every Ray worker fails to import",
                           "set py_executable to an absolute interpreter path (e.g. /path/.venv/bin/python)"))
    hook = ctx.env.get("RAY_ENABLE_UV_RUN_RUNTIME_ENV")
    if hook is not None and hook.strip().lower() not in ("0", "false", "") and _version_at_least(ctx.ray_version, RAY_UV_HOOK_SINCE):
        out.append(Finding("error", "env.RAY_ENABLE_UV_RUN_RUNTIME_ENV",
                           f"RAY_ENABLE_UV_RUN_RUNTIME_ENV={hook} with Ray {ctx.ray_version}: Ray >= "
                           f"{RAY_UV_HOOK_SINCE} rewrites runtime_env['working_dir'] and crashes on the explicit "
                           f"working_dir=None that verl passes",
                           "unset it or set RAY_ENABLE_UV_RUN_RUNTIME_ENV=0 (verl's own default)"))
    return out


def _fsdp1(c: VerlConfig) -> bool:
    return c.get("actor_rollout_ref.actor.strategy") == "fsdp"


def _no_shard(c: VerlConfig) -> bool:
    """FSDP1 ends up NO_SHARD when the shard group has one rank: fsdp_size=1, or a single GPU."""
    return c.get(f"{ACTOR_FSDP}.fsdp_size") == 1 or c.world_size == 1


def check_fsdp1_grad_sync(c: VerlConfig, ctx: Context) -> list[Finding]:
    key = f"{ACTOR_FSDP}.fsdp_size"
    if not (_fsdp1(c) and c.get(key) == 1 and c.world_size > 1):
        return []
    if "no_shard" in ctx.active_patches:
        return [Finding("info", key,
                        f"strategy=fsdp with fsdp_size=1 on {c.world_size} GPUs: verl's HYBRID_SHARD-on-(N,1)-mesh "
                        f"gradient bug is fixed by the active rlkit patch no_shard (NO_SHARD over all ranks)",
                        "none needed")]
    return [Finding("error", key,
                    f"strategy=fsdp with fsdp_size=1 on {c.world_size} GPUs: verl builds an ({c.world_size},1) mesh "
                    f"and HYBRID_SHARD, FSDP1 clamps it to NO_SHARD over a 1-rank group, and gradients are never "
                    f"all-reduced (verl #7493, won't fix): the ranks train independent replicas",
                    "apply rlkit's no_shard patch, or use strategy=fsdp2, or fsdp_size=-1 (shard over all GPUs)")]


def check_fsdp1_offload_frees_nothing(c: VerlConfig, ctx: Context) -> list[Finding]:
    key = f"{ACTOR_FSDP}.param_offload"
    if not (_fsdp1(c) and c.get(key) and not c.get(f"{ACTOR_FSDP}.use_orig_params") and _no_shard(c)):
        return []
    if "offload_views" in ctx.active_patches:
        return [Finding("info", key,
                        "param_offload under FSDP1 NO_SHARD with use_orig_params=False: the stale-view leak is "
                        "fixed by the active rlkit patch offload_views",
                        "none needed")]
    return [Finding("error", key,
                    "param_offload under FSDP1 NO_SHARD with use_orig_params=False frees nothing: the module's "
                    "parameter views keep the device storage alive, and each reload allocates a second copy "
                    "(verl #7596, won't fix); vLLM then fails its free-memory check at high gpu_memory_utilization",
                    "apply rlkit's offload_views patch, or set fsdp_config.use_orig_params=True, or use fsdp2")]


ENTROPY_COEFF = "actor_rollout_ref.actor.entropy_coeff"


def _entropy_coeff(c: VerlConfig) -> float:
    return float(c.get(ENTROPY_COEFF) or 0.0)


def check_metric_entropy_coeff(c: VerlConfig, ctx: Context) -> list[Finding]:
    coeff = _entropy_coeff(c)
    if "metric_entropy" not in ctx.active_patches or coeff == 0.0:
        return []
    return [Finding("error", ENTROPY_COEFF,
                    f"entropy_coeff={coeff} with the metric_entropy patch: the patch is for a metric-only entropy "
                    "(it computes the entropy's forward in row chunks) and stops the run at the first loss",
                    "set actor_rollout_ref.actor.entropy_coeff=0, or drop metric_entropy from the patches")]


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
    """Expected response tokens of a random-init model written by rlkit.offline_model with the synthetic length
    model (its marker's response_length_mean); 0 (= max_response_length) for any other model."""
    from rlkit import length_model, offline_model

    marker = offline_model.read_marker(model) if os.path.isdir(os.path.expanduser(str(model))) else None
    mean = int((marker or {}).get("response_length_mean") or 0)
    return length_model.expected_response_tokens(mean, max_response_length) if mean else 0


def _planner_spec(c: VerlConfig, ctx: Context):
    """A budget.PlanSpec from the config, or a reason why the planner cannot run."""
    from rlkit import budget, model_shape

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
    if c.get("actor_rollout_ref.actor.use_dynamic_bsz"):
        tokens = int(c.get("actor_rollout_ref.actor.ppo_max_token_len_per_gpu"))
    else:
        per_gpu = c.get("actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu")
        glob = c.get("actor_rollout_ref.actor.ppo_micro_batch_size")
        mbs = per_gpu or (max(1, int(glob) // n) if glob else None)
        if not mbs:
            return None, "no actor micro-batch size is set (ppo_micro_batch_size_per_gpu)"
        tokens = round(int(mbs) * expected_seq)
    if c.get(f"{ROLLOUT}.log_prob_use_dynamic_bsz"):
        lp_tokens = int(c.get(f"{ROLLOUT}.log_prob_max_token_len_per_gpu"))
    else:
        lp = c.get(f"{ROLLOUT}.log_prob_micro_batch_size_per_gpu")
        lp_tokens = round(int(lp) * expected_seq) if lp else tokens
    options = set(ctx.planner_options)
    options |= {p for p in ctx.active_patches if p in budget.RLKIT_OPTIONS}
    if "rlkit" in str(c.get("actor_rollout_ref.actor.optim.optimizer_impl")):  # HostAdamW (rlkit.optim)
        options.add("cpu_optimizer_step")
        # verl passes optim.override_optimizer_config as keyword arguments to the optimizer
        if c.is_set(RANK0_OWNER_KEY) and c.get(RANK0_OWNER_KEY):
            options.add("rank0_owner")
    values = {
        "model": model, "gpu_gib": ctx.gpu_gib, "n_gpus": n,
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
    values["update_entropy"] = _update_entropy(c, ctx.active_patches)
    values["logits_path"] = _logits_path(c, ctx.active_patches)
    values["remove_padding"] = bool(c.get(f"{MODEL}.use_remove_padding"))
    values["mean_response_tokens"] = mean_response
    spec = budget.with_options(budget.PlanSpec(**values), sorted(options))
    return spec, ""


def planner_spec_for_overrides(overrides: list[str], active_patches: Iterable[str] = (), *, gpu_gib: float):
    """The phase-budget planner's inputs for exactly this verl command (None when the planner cannot run)."""
    ctx = Context(active_patches=list(active_patches), env=os.environ, ray_version=None, gpu_gib=gpu_gib,
                  planner_options=[])
    spec, _ = _planner_spec(VerlConfig(parse_overrides(overrides)), ctx)
    return spec


def check_planner(c: VerlConfig, ctx: Context) -> list[Finding]:
    from rlkit import budget

    key = f"{ROLLOUT}.gpu_memory_utilization"
    try:
        spec, why = _planner_spec(c, ctx)
    except ParamError as err:
        return [Finding("error", key, f"the phase-budget planner rejects this config: {err}", "fix the named key")]
    if spec is None:
        return [Finding("info", "actor_rollout_ref.model.path", f"phase-budget planner skipped: {why}",
                        "set actor_rollout_ref.model.path to a preset or a local model folder and pass --gpu-gib")]
    result = budget.plan(spec)
    tp = c.get(f"{ROLLOUT}.tensor_model_parallel_size")
    caveat = f" (the planner assumes one vLLM engine per GPU, TP=1; this config has TP={tp})" if tp != 1 else ""
    message = (f"planner ({result.model}, {spec.gpu_gib} GiB x {spec.n_gpus}, options: "
               f"{', '.join(spec.options) or 'none'}): {result.verdict}: {result.reason}{caveat}")
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


def available_host_gib(meminfo: str | os.PathLike | None = None) -> float | None:
    """This machine's ``MemAvailable`` in GiB (``meminfo``: a /proc/meminfo-format file; default this host's),
    None where it cannot be read."""
    from rlkit import measure

    available = measure.host_available_bytes(meminfo or measure.MEMINFO)
    return None if available is None else available / 2**30


def check_host_memory(c: VerlConfig, ctx: Context) -> list[Finding]:
    """HostAdamW's host state per node against the node's available memory (a host OOM kills a Ray worker
    with SIGKILL mid-update; a pin larger than the host fails at allocation, rlkit.optim.staging)."""
    from rlkit import budget, model_shape

    if "rlkit" not in str(c.get(OPTIMIZER_IMPL)):
        return []
    model = c.get(f"{MODEL}.path")
    try:
        shape = model_shape.resolve_model(model) if model else None
    except ParamError:
        shape = None
    if shape is None:
        return [Finding("info", OPTIMIZER_IMPL, f"HostAdamW's host memory not checked: model {model!r} matches no "
                        "planner preset and no local config.json", "set actor_rollout_ref.model.path to a preset or "
                        "a local model folder")]
    ranks = int(c.get("trainer.n_gpus_per_node"))
    owner = bool(c.is_set(RANK0_OWNER_KEY) and c.get(RANK0_OWNER_KEY))
    on_host = "master_on_host" in ctx.active_patches
    options = {"ranks": ranks, "param_offload": bool(c.get(f"{ACTOR_FSDP}.param_offload")),
               "lora_rank": int(c.get(f"{MODEL}.lora_rank") or 0)}
    need = budget.host_adamw_bytes(shape, rank0_owner=owner, master_on_host=on_host, **options)
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
        with_owner = sum(budget.host_adamw_bytes(shape, rank0_owner=True, master_on_host=on_host, **options).values())
        alternatives.append(f"{RANK0_OWNER_KEY}=true ({with_owner / 2**30:.2f} GiB: Adam state on rank 0 only)")
    if not on_host:
        with_master = sum(budget.host_adamw_bytes(shape, rank0_owner=owner, master_on_host=True, **options).values())
        alternatives.append(f"the master_on_host patch ({with_master / 2**30:.2f} GiB: no second fp32 copy)")
    alternatives.append("a node with more free host memory")
    return [Finding("error", OPTIMIZER_IMPL, f"{message}, but the node has {ctx.host_available_gib:.2f} GiB "
                    f"available: the host runs out of memory (the kernel's OOM killer ends a Ray worker with SIGKILL, "
                    f"or HostAdamW's pinned staging allocation fails)", "; or ".join(alternatives))]


LOGITS_PATHS = {
    "torch_rowwise": "verl's unfused path: the model returns the micro-batch's full logits, log-softmax row by row",
    "verl_fused": "verl's fused kernels (torch backend): log-probs from the hidden states in {rows}-row chunks, "
                  "recomputed in backward",
    "chunked_logprobs": "rlkit's chunked_logprobs patch: log-probs from the hidden states in {rows}-row chunks "
                        "(fp32 weight-gradient sum), recomputed in backward",
}


def _describe_path(path: str) -> str:
    from rlkit import budget

    return LOGITS_PATHS[path].format(rows=budget.CHUNKED_LOGITS.get(path, {}).get("chunk_rows"))


def check_logits_path(c: VerlConfig, ctx: Context) -> list[Finding]:
    """Which logits path the actor takes and what it costs in the update micro-batch, next to the alternative."""
    from rlkit import budget

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
    gib = budget.update_logits_gib(spec, (path, alternative))
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
               f"patch (verl's own fused kernels: {budget.update_logits_gib(spec, ('verl_fused',))['verl_fused']:.2f} GiB)")
    return out + [Finding("info", FUSED_KERNELS, message, fix)]


CHECKS: dict[str, Callable[[VerlConfig, Context], list[Finding]]] = {
    "gpu_memory_utilization": check_gpu_memory_utilization,
    "max_num_batched_tokens": check_max_num_batched_tokens,
    "deprecated_micro_batch": check_deprecated_micro_batch,
    "dynamic_bsz_floor": check_dynamic_bsz_floor,
    "disable_log_stats": check_disable_log_stats,
    "cuda_graphs": check_cuda_graphs,
    "ray_uv_hook": check_ray_uv_hook,
    "fsdp1_grad_sync": check_fsdp1_grad_sync,
    "fsdp1_offload_frees_nothing": check_fsdp1_offload_frees_nothing,
    "metric_entropy_coeff": check_metric_entropy_coeff,
    "logits_path": check_logits_path,
    "host_memory": check_host_memory,
    "planner": check_planner,
}


def _installed(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def check_config(tree: Mapping[str, Any], active_patches: Iterable[str] | None = None, *,
                 gpu_gib: float | None = None, planner_options: Iterable[str] = (),
                 env: Mapping[str, str] | None = None, ray_version: str | None = None,
                 host_available_gib: float | None = None) -> list[Finding]:
    """All findings for a nested config dict (errors first).

    ``active_patches`` defaults to ``rlkit.patches.active()``; ``env`` to ``os.environ``; ``ray_version``
    to the installed Ray; ``host_available_gib`` (host memory a job can get on a node) to unknown.
    """
    if active_patches is None:
        from rlkit import patches

        active_patches = patches.active()
    active_patches = list(active_patches)
    from rlkit.patches import KNOWN_PATCHES

    unknown = sorted(set(active_patches) - set(KNOWN_PATCHES))
    if unknown:
        raise PreflightInputError(f"patches: unknown rlkit patch(es) {unknown}; known: {list(KNOWN_PATCHES)}")
    if gpu_gib is not None and not gpu_gib > 0:
        raise PreflightInputError(f"gpu_gib: must be positive GiB, got {gpu_gib!r}")
    if host_available_gib is not None and not host_available_gib >= 0:
        raise PreflightInputError(f"host_gib: must be GiB >= 0, got {host_available_gib!r}")
    ctx = Context(active_patches=active_patches, env=os.environ if env is None else env,
                  ray_version=ray_version if ray_version is not None else _installed("ray"),
                  gpu_gib=gpu_gib, planner_options=list(planner_options), host_available_gib=host_available_gib)
    config = VerlConfig(tree)
    findings = [f for name, check in CHECKS.items() for f in _named(check(config, ctx), name)]
    return sorted(findings, key=lambda f: SEVERITIES.index(f.severity))


def _named(findings: list[Finding], name: str) -> list[Finding]:
    return [Finding(f.severity, f.key, f.message, f.fix, f.check or name) for f in findings]


def check_overrides(overrides: list[str], active_patches: Iterable[str] | None = None, **kwargs) -> list[Finding]:
    """Findings for a list of Hydra overrides (what the rlkit recipe passes to verl)."""
    return check_config(parse_overrides(overrides), active_patches, **kwargs)


def has_errors(findings: Iterable[Finding]) -> bool:
    return any(f.severity == "error" for f in findings)


def format_findings(findings: list[Finding]) -> str:
    if not findings:
        return "no findings"
    lines = []
    for f in findings:
        lines.append(f"{f.severity.upper():8}{f.key}: {f.message}")
        lines.append(f"{'':8}fix: {f.fix}")
    counts = {s: sum(f.severity == s for f in findings) for s in SEVERITIES}
    lines.append(", ".join(f"{n} {s}{'s' if n != 1 else ''}" for s, n in counts.items()))
    return "\n".join(lines)


def _host_gib_arg(value: str | None) -> float | None:
    if value is None:
        return None
    if value == "auto":
        found = available_host_gib()
        if found is None:
            raise PreflightInputError("--host-gib auto: this machine has no /proc/meminfo. Fix: pass the GiB a node has")
        return found
    try:
        return float(value)
    except ValueError:
        raise PreflightInputError(f"--host-gib {value!r}: expected GiB (a number) or 'auto'") from None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="rlkit preflight",
        description="Lint a verl config (YAML file, shell script, or key=value overrides) for known traps.",
    )
    parser.add_argument("inputs", nargs="*", help="a .yaml file, a script/command file, and/or key=value overrides")
    parser.add_argument("--json", action="store_true", help="print findings as JSON")
    parser.add_argument("--patches", default=None,
                        help="comma-separated active rlkit patches (default: those active in this process)")
    parser.add_argument("--gpu-gib", type=float, default=None, help="GPU memory in GiB: enables the planner verdict")
    parser.add_argument("--options", default="", help="extra planner options (see rlkit budget --options)")
    parser.add_argument("--host-gib", default=None,
                        help="host memory available to the job per node in GiB, or 'auto' (this machine's MemAvailable): "
                             "checks HostAdamW's host state")
    ns = parser.parse_args(argv)
    try:
        host_gib = _host_gib_arg(ns.host_gib)
        tree: dict[str, Any] = {}
        overrides = []
        for item in ns.inputs:
            if "=" in item or item.startswith("~"):
                overrides.append(item)
            else:
                tree = merge_trees(tree, load_config(item))
        tree = merge_trees(tree, parse_overrides(overrides))
        patches = None if ns.patches is None else [p for p in ns.patches.split(",") if p]
        findings = check_config(tree, patches, gpu_gib=ns.gpu_gib,
                                planner_options=[o for o in ns.options.split(",") if o], host_available_gib=host_gib)
    except ParamError as err:
        print(f"rlkit preflight: error: {err}", file=sys.stderr)
        return 2
    print(json.dumps([f.as_dict() for f in findings], indent=1) if ns.json else format_findings(findings))
    return 1 if has_errors(findings) else 0




if __name__ == "__main__":
    sys.exit(main())
