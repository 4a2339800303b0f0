"""Lint a verl configuration for known memory and correctness traps before a GPU is booked.

Input is a YAML file, a shell script or command line holding ``python -m verl.trainer.main_ppo ...``
overrides, or a list of Hydra overrides (``key=value``, ``+key=value``, ``++key=value``, ``~key``), read by
:mod:`rlkit.verl.config` without verl; keys the input does not set take verl 0.9.1's defaults.

Each check returns :class:`Finding` objects (severity ``error`` / ``warning`` / ``info``, the dotted config key,
a message and a fix; the type is :mod:`rlkit.planning.preflight_findings`'). The traps come from source document 003
(gpu_memory_utilization semantics and band, max_num_batched_tokens, deprecated micro-batch keys, the dynamic-batch
token floor, disable_log_stats, CUDA-graph memory, the Ray uv runtime-env hook) and from verl 0.9's FSDP1 with
fsdp_size=1 (no gradient all-reduce; param offload that frees nothing), which are reported as fixed when the rlkit
patch ``no_shard`` / ``offload_views`` is active; a nonzero entropy_coeff under the ``metric_entropy`` patch is an
error. The memory checks are :mod:`rlkit.planning.preflight_memory`'s: when the model and the GPU memory are known, the
phase-budget planner's verdict is a finding too, and the logits path the actor will take (verl's unfused logits,
verl's fused kernels, or rlkit's ``chunked_logprobs`` patch) is named with its GiB for the update micro-batch
(padded or not, per ``use_remove_padding``) and the alternative's. With HostAdamW (``optimizer_impl=rlkit.optim``),
its host state per node (fp32 masters, Adam moments, pinned staging buffers, :func:`rlkit.planning.host_memory.host_adamw_bytes`)
is held against the node's available host memory when that is given (``--host-gib``; ``auto``: this machine's
``MemAvailable``, what ``rlkit.recipes.job`` passes before a launch). This module runs every check (:data:`CHECKS`)
and is the ``rlkit preflight`` command.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable, Iterable, Mapping
from importlib import metadata
from typing import Any

from rlkit.core.params import ParamError
from rlkit.planning.preflight_findings import ACTOR_FSDP, ROLLOUT, SEVERITIES, Context, Finding
from rlkit.planning.preflight_memory import (
    ENTROPY_COEFF,
    _entropy_coeff,
    available_host_gib,
    check_host_memory,
    check_logits_path,
    check_network,
    check_planner,
    planner_spec_for_overrides,  # noqa: F401  (rlkit.planning.preflight's API: grpo, tests
)
from rlkit.verl.config import PreflightInputError, VerlConfig, load_config, merge_trees, parse_overrides

UTIL_BAND = (0.5, 0.7)  # verl perf note: the useful band for gpu_memory_utilization
RAY_UV_HOOK_SINCE = "2.47"  # Ray versions that rewrite runtime_env["working_dir"] under `uv run`


# ---------------------------------------------------------------------------------------------------
# Checks: each takes (config, context) and returns findings
# ---------------------------------------------------------------------------------------------------

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


def check_metric_entropy_coeff(c: VerlConfig, ctx: Context) -> list[Finding]:
    coeff = _entropy_coeff(c)
    if "metric_entropy" not in ctx.active_patches or coeff == 0.0:
        return []
    return [Finding("error", ENTROPY_COEFF,
                    f"entropy_coeff={coeff} with the metric_entropy patch: the patch is for a metric-only entropy "
                    "(it computes the entropy's forward in row chunks) and stops the run at the first loss",
                    "set actor_rollout_ref.actor.entropy_coeff=0, or drop metric_entropy from the patches")]


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
    "network": check_network,
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
                 host_available_gib: float | None = None, link_gbps: float | None = None) -> list[Finding]:
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
    if link_gbps is not None and not link_gbps > 0:
        raise PreflightInputError(f"link_gbps: must be a positive link speed in Gbit/s, got {link_gbps!r}")
    ctx = Context(active_patches=active_patches, env=os.environ if env is None else env,
                  ray_version=ray_version if ray_version is not None else _installed("ray"),
                  gpu_gib=gpu_gib, planner_options=list(planner_options), host_available_gib=host_available_gib,
                  link_gbps=link_gbps)
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
    parser.add_argument("--link-gbps", type=float, default=None,
                        help="each node's network link in Gbit/s, for trainer.nnodes > 1 (default 25)")
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
                                planner_options=[o for o in ns.options.split(",") if o], host_available_gib=host_gib,
                                link_gbps=ns.link_gbps)
    except ParamError as err:
        print(f"rlkit preflight: error: {err}", file=sys.stderr)
        return 2
    print(json.dumps([f.as_dict() for f in findings], indent=1) if ns.json else format_findings(findings))
    return 1 if has_errors(findings) else 0




if __name__ == "__main__":
    sys.exit(main())
