"""Notebook 00's experiment: source document 003's table reproduced, and the derived planner for option sets.

1. :func:`seed_table` reproduces the script of source document 003 exactly (same cases, constants and
   formula). The table the document *printed* does not match its own script in every row; it is kept
   verbatim in :data:`PRINTED_SEED_TABLE` and :func:`seed_table_diff` shows where and by how much. The
   formula is never adjusted to match the printed table.
2. :func:`run` evaluates :func:`rlkit.planning.verdict.plan` for the notebook's option sets, the leave-one-out
   ablations of the largest set, and every logits path. Pure arithmetic: no torch import.
"""
from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from typing import Any

from rlkit.core.params import ParamError
from rlkit.models.shape import presets
from rlkit.planning.budget import (
    DEVICE_COMPONENTS,
    GIB,
    LOGITS_BYTES,
    PHASES,
    RLKIT_OPTIONS,
    UPDATE_ENTROPY_BYTES,
    PlanSpec,
    with_options,
)
from rlkit.planning.cost import cost_per_million_samples, run_cost
from rlkit.planning.multinode import DEFAULT_LINK_GBPS, OWNERS, format_network_plan, network_plan_for
from rlkit.planning.verdict import format_plan, plan

NOTEBOOK = "00_phase_budget"


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
        """The planner's inputs with ``options``; the CUDA graphs as vLLM measured them for this model in the
        committed runs (:func:`rlkit.planning.vllm_terms.cuda_graphs_term`, as pre-flight takes them), ``cudagraph_gib``
        where none did (0 stays 0: enforce_eager)."""
        from rlkit.planning.vllm_terms import cuda_graphs_term

        base = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "option_sets"}
        if base["cudagraph_gib"] and (measured := cuda_graphs_term(self.model)["gib"]) is not None:
            base["cudagraph_gib"] = measured
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

    from rlkit.core.colours import component_colour

    labels = [(label, ph) for label, p in plans.items() for ph in p["device_gib"]]
    x = [[label for label, _ in labels], [ph for _, ph in labels]]
    fig = go.Figure()
    for comp in DEVICE_COMPONENTS:
        y = [plans[label]["device_gib"][ph].get(comp, 0.0) for label, ph in labels]
        if any(y):
            fig.add_bar(name=comp, x=x, y=y, marker_color=component_colour(comp))
    fig.add_hline(y=gpu_gib, line_dash="dash", annotation_text=f"GPU {gpu_gib} GiB")
    fig.update_layout(barmode="stack", title=title or "device memory per GPU by phase (GiB)",
                      yaxis_title="GiB per GPU", height=520, legend_title="component")
    return fig


# ---------------------------------------------------------------------------------------------------
# Command line: ``rlkit budget``

def describe(metrics: dict[str, Any]) -> str:
    """The notebook's findings: the document's table against its script and the planner's verdict per option set, in plain sentences, every number read from ``metrics`` (:func:`rlkit.experiments.prose.phase_budget`)."""
    from rlkit.experiments.prose import phase_budget

    return phase_budget(metrics)


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
    g.add_argument("--n-gpus", type=int, default=d.n_gpus, help="data-parallel GPUs of all nodes together")
    g.add_argument("--nodes", type=int, default=d.nodes,
                   help="nodes the GPUs are spread over (verl trainer.nnodes): host memory per node, network per step")
    g.add_argument("--owners", choices=OWNERS, default=None,
                   help="HostAdamW owners for the network plan (default: node with --options rank0_owner, else none)")
    g.add_argument("--link-gbps", type=float, default=DEFAULT_LINK_GBPS, help="each node's network link, Gbit/s")
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
    g.add_argument("--logits-chunk-rows", type=int, default=d.logits_chunk_rows,
                   help="rows per chunk on a chunked logits path (0 = the path's own)")
    g.add_argument("--remove-padding", action="store_true",
                   help="verl use_remove_padding: micro-batches hold their actual tokens (default: padded)")
    g.add_argument("--mean-response-tokens", type=float, default=d.mean_response_tokens,
                   help="expected response length (0 = --response-len): with padding, rows padded to the longest")
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
        model=ns.model, gpu_gib=ns.gpu_gib, n_gpus=ns.n_gpus, nodes=ns.nodes, gpu_memory_utilization=ns.util,
        max_prompt_length=ns.prompt_len, max_response_length=ns.response_len, train_batch_size=ns.batch,
        group_size=ns.group, micro_batch_tokens=ns.micro_batch_tokens,
        log_prob_micro_batch_tokens=ns.log_prob_micro_batch_tokens or ns.micro_batch_tokens,
        lora_rank=ns.lora_rank, gradient_checkpointing=not ns.no_grad_ckpt, param_offload=not ns.no_param_offload,
        optimizer_offload=not ns.no_optimizer_offload, cudagraph_gib=ns.cudagraph_gib,
        non_torch_gib=ns.non_torch_gib, logits_path=ns.logits_path, update_entropy=ns.update_entropy,
        host_gib=ns.host_gib, logits_chunk_rows=ns.logits_chunk_rows, remove_padding=ns.remove_padding,
        mean_response_tokens=ns.mean_response_tokens,
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
            spec = spec_from_args(ns)
            result = plan(spec)
            network = network_plan_for(spec, owners=ns.owners, link_gbps=ns.link_gbps)
            if ns.json:
                print(json.dumps({**result.as_dict(), "network": network.as_dict()}, indent=1))
            else:
                print(format_plan(result) + ("\n" + format_network_plan(network) if spec.nodes > 1 else ""))
            return 0 if result.fits else 1
    except ParamError as err:
        print(f"rlkit budget: error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
