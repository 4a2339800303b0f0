"""Notebook 01: FSDP1 NO_SHARD param offload that frees nothing, and gradients that never sync.

Part 1 (memory rows): a random-init Qwen3 wrapped like verl's actor (FSDP1 NO_SHARD, bf16/fp32/fp32
mixed precision) is offloaded and reloaded with verl's loop (``handle.flat_param_to``). Each row of
use_orig_params x forward_first x fix runs in a fresh process and records device memory after wrap,
offload and reload (CUDA), plus where the module's parameter views point (every device). After the
reload the row computes logits, takes one AdamW step and computes logits and weights again: every fixed
row must equal its unfixed twin, and each unfixed row does that work twice from the same weights, so
that a difference can be read against the unpatched computation's own (``metrics["determinism"]``;
``deterministic`` turns on :func:`rlkit.measure.determinism.enable` in every row).

Part 2 (grad sync): two ranks on verl's (2, 1) mesh, different micro-batches, FSDP1 with the strategy
verl asks for (HYBRID_SHARD, clamped by FSDP to NO_SHARD over one rank) or the fixed one (NO_SHARD
over the replicate group); max abs difference of the gradients across ranks after backward.

``python -m rlkit.experiments.offload_bug --profile h200``
"""
from __future__ import annotations

import itertools
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlkit.core.params import ParamError
from rlkit.experiments import experiment_main
from rlkit.measure import determinism
from rlkit.measure.launch import run_module

NOTEBOOK = "01_offload_bug"
CHILD = "rlkit.experiments._offload_row"
STAGES = ("before_offload", "after_offload", "after_reload")
# Each row decides whether the fix is on; keep rlkit's verl plugin from applying patches on `import verl`.
NO_PLUGIN_PATCHES = {"RLKIT_PATCHES": ""}


@dataclass(frozen=True)
class Config:
    model: str                        # model preset (rlkit.models.qwen) for the memory rows
    device: str                       # "cuda": measure bytes; "cpu": check the view mechanism only
    use_orig_params: tuple[bool, ...]  # FSDP1 use_orig_params values in the grid
    forward_first: tuple[bool, ...]    # run one forward before offloading?
    fix: tuple[bool, ...]              # offload_views patch off / on
    forward_tokens: int               # tokens in the forward-first / parity batch
    seed: int                         # model init and input seed
    grad_sync_model: str              # model preset for the 2-rank gradient check on 2+ GPUs
    grad_sync_cpu_model: str          # model preset when the gradient check runs on CPU (gloo)
    grad_sync_device: str             # "auto" (cuda with 2+ GPUs, else cpu), "cuda" or "cpu"
    grad_sync_batch: int              # sequences per rank in the gradient check
    grad_sync_tokens: int             # tokens per sequence in the gradient check
    deterministic: bool               # rlkit.measure.determinism.enable in every row and rank (raising mode)

    def __post_init__(self) -> None:
        from rlkit.models.qwen import PRESETS

        for key in ("model", "grad_sync_model", "grad_sync_cpu_model"):
            if getattr(self, key) not in PRESETS:
                raise ParamError(f"{key}={getattr(self, key)!r} is not a model preset. Fix: use one of {sorted(PRESETS)}")
        if self.device not in ("cuda", "cpu"):
            raise ParamError(f"device={self.device!r}. Fix: use 'cuda' (measures bytes) or 'cpu' (mechanism only)")
        if self.grad_sync_device not in ("auto", "cuda", "cpu"):
            raise ParamError(f"grad_sync_device={self.grad_sync_device!r}. Fix: use 'auto', 'cuda' or 'cpu'")
        for key in ("use_orig_params", "forward_first", "fix"):
            values = getattr(self, key)
            if not values or len(set(values)) != len(values):
                raise ParamError(f"{key}={list(values)} must list distinct true/false values. Fix: e.g. [false, true]")
        for key in ("forward_tokens", "grad_sync_batch", "grad_sync_tokens"):
            if getattr(self, key) < 1:
                raise ParamError(f"{key}={getattr(self, key)} must be >= 1. Fix: use a positive integer")


def _cuda_device_count() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def _flatten_row(row: dict[str, Any]) -> dict[str, Any]:
    out = {k: v for k, v in row.items() if k not in STAGES}
    for stage in STAGES:
        for key, value in row[stage].items():
            out[f"{key}_{stage}"] = value
    return out


def _row_env(cfg: Config) -> dict[str, str]:
    return {**NO_PLUGIN_PATCHES, **determinism.child_env(cfg.deterministic)}


# What each row leaves for the parent to compare (``_offload_row.after_reload``): the name of the column
# ``<name>_vs_unfixed`` (``<name>_vs_repeat`` for an unfixed row against its own repeat) and the max abs
# difference of two runs' tensors.
COMPARED = {
    "logits_max_abs_diff": lambda a, b: (a["logits_after_reload"] - b["logits_after_reload"]).abs().max().item(),
    "logits_after_step_max_abs_diff": lambda a, b: (a["logits_after_step"] - b["logits_after_step"]).abs().max().item(),
    "weights_after_step_max_abs_diff": lambda a, b: determinism.probe_max_abs_diff(a["weight_probes"],
                                                                                   b["weight_probes"]),
}


def _compare(row: dict[str, Any], mine: dict | None, other: dict | None, suffix: str, other_checksums) -> None:
    """``row[<compared>_<suffix>]`` and ``row[weights_after_step_equal_<suffix>]`` (None where a run is missing)."""
    for name, diff in COMPARED.items():
        row[f"{name}_{suffix}"] = None if mine is None or other is None else diff(mine, other)
    row[f"weights_after_step_equal_{suffix}"] = (
        None if mine is None or other is None else row["weight_checksums_after_step"] == other_checksums)


def run_memory_rows(cfg: Config) -> list[dict[str, Any]]:
    """The grid's rows, each compared with the unfixed row of its (use_orig_params, forward_first); an
    unfixed row also with its own repeat (the unpatched computation against itself)."""
    import torch

    if cfg.device == "cuda" and _cuda_device_count() < 1:
        raise ParamError("device='cuda' but no CUDA GPU is visible. Fix: use --profile tiny or -p device=cpu")
    rows, tensors = [], {}
    with tempfile.TemporaryDirectory(prefix="rlkit-offload-") as tmp:
        grid = list(itertools.product(cfg.use_orig_params, cfg.forward_first, cfg.fix))
        for i, (uop, forward_first, fix) in enumerate(grid):
            print(f"row {i + 1}/{len(grid)}: use_orig_params={uop} forward_first={forward_first} fix={fix}", flush=True)
            tensors_path = str(Path(tmp) / f"tensors-{i}.pt")
            row = run_module(CHILD, {
                "task": "offload_row", "model": cfg.model, "device": cfg.device, "seed": cfg.seed,
                "forward_tokens": cfg.forward_tokens, "use_orig_params": uop, "forward_first": forward_first,
                "fix": fix, "tensors_path": tensors_path, "deterministic": cfg.deterministic,
            }, env=_row_env(cfg))
            tensors[(uop, forward_first, fix)] = torch.load(tensors_path) if row["status"] == "ok" else None
            rows.append(_flatten_row(row))
    for row in rows:
        key = (row["use_orig_params"], row["forward_first"])
        mine, twin = tensors[(*key, row["fix"])], tensors.get((*key, False))
        twin_row = next((r for r in rows if (r["use_orig_params"], r["forward_first"], r["fix"]) == (*key, False)), {})
        _compare(row, mine and mine["row"], twin and twin["row"], "vs_unfixed", twin_row.get("weight_checksums_after_step"))
        if not row["fix"]:
            _compare(row, mine and mine["row"], mine and mine["repeat"], "vs_repeat",
                     row.get("repeat_weight_checksums_after_step"))
    return rows


def determinism_summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """``metrics["determinism"]``: each fixed row against its unfixed twin, next to that twin against its repeat."""
    unfixed = {(r["use_orig_params"], r["forward_first"]): r for r in rows if not r["fix"]}
    checks = []
    for row in rows:
        if not row["fix"]:
            continue
        twin = unfixed.get((row["use_orig_params"], row["forward_first"]), {})
        for name, label in (("logits_max_abs_diff", "logits after reload"),
                            ("logits_after_step_max_abs_diff", "logits after one train step"),
                            ("weights_after_step_max_abs_diff", "weights after one train step (probe)")):
            checks.append(determinism.check(f"{row_label(row)}: {label}", row.get(f"{name}_vs_unfixed"),
                                            twin.get(f"{name}_vs_repeat")))
    ops = {row_label(r): r["nondeterministic_op"] for r in rows if r.get("nondeterministic_op")}
    settings = next((r["determinism"] for r in rows if r.get("determinism")), None)
    return determinism.summary(checks, settings, ops)


def run_grad_sync(cfg: Config) -> dict[str, Any]:
    gpus = _cuda_device_count()
    device, fallback_reason = cfg.grad_sync_device, None
    if device == "auto":
        device = "cuda" if gpus >= 2 else "cpu"
        if gpus == 1:
            fallback_reason = "1 CUDA GPU visible; the 2-rank check needs 2, so it runs on CPU with gloo"
    if device == "cuda" and gpus < 2:
        raise ParamError(f"grad_sync_device='cuda' needs 2 GPUs, {gpus} visible. Fix: -p grad_sync_device=auto")
    model = cfg.grad_sync_model if device == "cuda" else cfg.grad_sync_cpu_model
    runs = {}
    for fix in (False, True):
        print(f"grad sync: fix={fix}, {model} on {device}", flush=True)
        runs["with_fix" if fix else "without_fix"] = run_module(CHILD, {
            "task": "grad_sync", "model": model, "device": device, "seed": cfg.seed, "fix": fix,
            "batch": cfg.grad_sync_batch, "tokens": cfg.grad_sync_tokens, "deterministic": cfg.deterministic,
        }, nproc=2, env=_row_env(cfg))
    return {
        "backend": "nccl" if device == "cuda" else "gloo",
        "device": device,
        "model": model,
        "ranks": 2,
        "fallback_reason": fallback_reason,
        "max_abs_grad_diff_without_fix": runs["without_fix"]["max_abs_grad_diff"],
        "max_abs_grad_diff_with_fix": runs["with_fix"]["max_abs_grad_diff"],
        **runs,
    }


def run(cfg: Config) -> dict[str, Any]:
    rows = run_memory_rows(cfg)
    return {
        "model": cfg.model,
        "device": cfg.device,
        "model_params": rows[0]["model_params"],
        "model_gib": rows[0]["model_gib"],
        "memory_measured": cfg.device == "cuda",
        "rows": rows,
        "determinism": determinism_summary(rows),
        "grad_sync": run_grad_sync(cfg),
    }


# ---------------------------------------------------------------------------------------------------
# Notebook-facing views of metrics.json (pandas / plotly imported lazily: not needed on the GPU node)
# ---------------------------------------------------------------------------------------------------

ROW_KEYS = ("use_orig_params", "forward_first", "fix")


def find_row(metrics: dict[str, Any], use_orig_params: bool, forward_first: bool, fix: bool) -> dict | None:
    for row in metrics["rows"]:
        if (row["use_orig_params"], row["forward_first"], row["fix"]) == (use_orig_params, forward_first, fix):
            return row
    return None


def row_label(row: dict[str, Any]) -> str:
    return (f"orig_params={'T' if row['use_orig_params'] else 'F'} · "
            f"{'fwd first' if row['forward_first'] else 'no fwd'} · fix {'on' if row['fix'] else 'off'}")


def rows_table(metrics: dict[str, Any]):
    import pandas as pd

    columns = [*ROW_KEYS, "model_gib", "after_wrap_gib", "after_offload_gib", "after_reload_gib",
               "views_before_offload", "views_stale_after_offload", "stale_view_gib_after_offload",
               "views_stale_after_reload", "view_dtypes_before_offload", "logits_max_abs_diff_vs_unfixed",
               "logits_after_step_max_abs_diff_vs_unfixed", "weights_after_step_equal_vs_unfixed"]
    table = pd.DataFrame([{k: row.get(k) for k in columns} for row in metrics["rows"]])
    if not metrics["memory_measured"]:
        table = table.drop(columns=["after_wrap_gib", "after_offload_gib", "after_reload_gib"])
    return table


def memory_figure(metrics: dict[str, Any]):
    """Grouped bars per row: device GiB after wrap/offload/reload (CUDA) or bytes pinned by stale views (CPU)."""
    import plotly.graph_objects as go

    labels = [row_label(r) for r in metrics["rows"]]
    if metrics["memory_measured"]:
        stages = {"after wrap": "after_wrap_gib", "after offload": "after_offload_gib", "after reload": "after_reload_gib"}
        title = f"Device memory allocated, {metrics['model']} ({metrics['model_gib']:.3f} GiB fp32)"
        y_title = "GiB allocated"
    else:
        stages = {"after offload": "stale_view_gib_after_offload", "after reload": "stale_view_gib_after_reload"}
        title = f"Storage kept alive by stale parameter views, {metrics['model']} (CPU, emulated move)"
        y_title = "GiB pinned by stale views"
    fig = go.Figure([go.Bar(name=name, x=labels, y=[r[key] for r in metrics["rows"]]) for name, key in stages.items()])
    if metrics["memory_measured"]:
        fig.add_hline(y=metrics["model_gib"], line_dash="dot", annotation_text="model size")
    fig.update_layout(barmode="group", title=title, yaxis_title=y_title, legend_title="stage")
    return fig


def findings(metrics: dict[str, Any]) -> str:
    """The notebook's conclusions, as Markdown, with every number taken from ``metrics``."""
    lines = []
    model_gib = metrics["model_gib"]
    bug, fixed = find_row(metrics, False, False, False), find_row(metrics, False, False, True)
    fwd_bug = find_row(metrics, False, True, False)
    if metrics["memory_measured"]:
        if bug:
            lines.append(
                f"- **Bug** (use_orig_params=False, offload before any forward, no fix): {bug['after_wrap_gib']:.3f} GiB "
                f"after wrap, **{bug['after_offload_gib']:.3f} GiB after offload** and **{bug['after_reload_gib']:.3f} GiB "
                f"after reload** ({bug['after_reload_gib'] / model_gib:.2f}x the {model_gib:.3f} GiB model): "
                f"{bug['views_stale_after_offload']} of {bug['views_before_offload']} parameter views still point at the old device "
                f"storage ({bug['stale_view_gib_after_offload']:.3f} GiB kept alive).")
        if fixed:
            lines.append(
                f"- **Fix** (offload_views patch): {fixed['after_offload_gib']:.3f} GiB after offload, "
                f"{fixed['after_reload_gib']:.3f} GiB after reload; stale views after offload: "
                f"{fixed['views_stale_after_offload']}.")
        if fwd_bug:
            lines.append(
                f"- **Forward first, no fix**: {fwd_bug['after_offload_gib']:.3f} GiB after offload, "
                f"{fwd_bug['after_reload_gib']:.3f} GiB after reload: the views were left on the "
                f"{'/'.join(fwd_bug['view_dtypes_before_offload'])} compute copy, which FSDP freed after the forward.")
    else:
        if bug:
            lines.append(
                f"- **Bug** (use_orig_params=False, offload before any forward, no fix): after the (emulated) move "
                f"{bug['views_stale_after_offload']} of {bug['views_before_offload']} parameter views still point at the old storage, "
                f"keeping {bug['stale_view_gib_after_offload'] * 2**30:,.0f} bytes alive; after reload "
                f"{bug['views_stale_after_reload']} do.")
        if fixed:
            lines.append(
                f"- **Fix**: {fixed['views_on_flat_param_after_offload']} of {fixed['views_before_offload']} views follow the moved "
                f"flat parameter; {fixed['views_stale_after_offload']} stale.")
        if fwd_bug:
            lines.append(
                f"- **Forward first, no fix**: {fwd_bug['views_stale_after_offload']} stale views; before the offload "
                f"{fwd_bug['views_freed_before_offload']} of {fwd_bug['views_before_offload']} views pointed at the freed "
                f"{'/'.join(fwd_bug['view_dtypes_before_offload'])} compute copy.")
    orig = [r for r in metrics["rows"] if r["use_orig_params"]]
    if orig:
        stale = max(r["views_stale_after_offload"] for r in orig)
        text = f"- **use_orig_params=True** rows: at most {stale} stale views after offload, with and without the fix"
        if metrics["memory_measured"]:
            text += (f"; after offload {max(r['after_offload_gib'] for r in orig):.3f} GiB at most, after reload "
                     f"{max(r['after_reload_gib'] for r in orig):.3f} GiB at most")
        lines.append(text + ".")
    diffs = [r["logits_max_abs_diff_vs_unfixed"] for r in metrics["rows"] if r["fix"] and r["logits_max_abs_diff_vs_unfixed"] is not None]
    if diffs:
        lines.append(f"- The fix does not change the computation: max |logits(fix) - logits(no fix)| after the round "
                     f"trip = {max(diffs):.1e} over {len(diffs)} row pairs.")
    stepped = [r for r in metrics["rows"] if r["fix"] and r.get("logits_after_step_max_abs_diff_vs_unfixed") is not None]
    if stepped:
        lines.append(f"- Nor how the reloaded model trains: after one AdamW step max |logits(fix) - logits(no fix)| = "
                     f"{max(r['logits_after_step_max_abs_diff_vs_unfixed'] for r in stepped):.1e}, weights bit-identical "
                     f"in {sum(bool(r['weights_after_step_equal_vs_unfixed']) for r in stepped)} of {len(stepped)} row pairs.")
    return "\n".join(lines)


def grad_sync_findings(metrics: dict[str, Any]) -> str:
    g = metrics["grad_sync"]
    bug, fixed = g["without_fix"], g["with_fix"]
    where = f"{g['ranks']} ranks, {g['backend']} on {g['device']}, model {g['model']}"
    if g["fallback_reason"]:
        where += f" ({g['fallback_reason']})"
    setup = f"- Setup: {where}; rank losses {', '.join(f'{x:.4f}' for x in bug['rank_losses'])} (different micro-batches)."
    without = (f"- **Without the fix** verl asks for {bug['requested_strategy']}, FSDP runs {bug['effective_strategy']} "
               f"over a {bug['grad_reduce_group_size']}-rank group: max |grad rank0 - grad rank1| = "
               f"**{g['max_abs_grad_diff_without_fix']:.3e}** (largest gradient entry {bug['max_abs_grad']:.3e}).")
    with_fix = (f"- **With the fix** (NO_SHARD over the {fixed['grad_reduce_group_size']}-rank replicate group): "
                f"max |grad rank0 - grad rank1| = **{g['max_abs_grad_diff_with_fix']:.1e}**.")
    return f"{setup}\n{without}\n{with_fix}"


def describe(metrics: dict[str, Any]) -> str:
    """The notebook's findings in plain sentences (its Markdown findings, the parity against the unpatched run's own
    spread, the gradient sync), every number read from ``metrics``."""
    from rlkit.experiments.prose import device_label, plain
    from rlkit.measure.determinism import findings as determinism_findings

    where = device_label(metrics["device"], model=metrics["model"])
    lines = [f"{where} Compared: FSDP1 NO_SHARD param offload and reload of {metrics['model']} "
             f"({metrics['model_params']:,} parameters, {metrics['model_gib']:.3f} GiB) over {len(metrics['rows'])} "
             "rows (use_orig_params x forward first x fix), each in a fresh process"
             + ("; device memory measured." if metrics["memory_measured"] else
                "; the device move is emulated by a copy, so views are counted, not device memory.")]
    lines += plain(findings(metrics)).splitlines()
    lines.append(plain(determinism_findings(metrics)))
    lines += plain(grad_sync_findings(metrics)).splitlines()
    return "\n".join(line for line in lines if line)


if __name__ == "__main__":
    sys.exit(experiment_main(Config, run, NOTEBOOK))
