"""The short summary of a profiled update (:mod:`rlkit.experiments.update_profile`), in markdown: the ``SUMMARY.md``
committed beside its results, every number from its ``metrics.json``.
"""
from __future__ import annotations

from typing import Any


def markdown(metrics: dict[str, Any], *, name_chars: int = 90) -> str:
    """The short summary to commit beside the results (``SUMMARY.md``): wall time and MFU, GPU time by category,
    the top kernels, the largest idle gaps, the host syncs and their sources; every number from ``metrics``."""
    from rlkit.core.results import fmt

    s, f, t, w = metrics["summary"], metrics["flops"], metrics["timing"], metrics["workload"]
    d, cfg = s["device"], metrics["config"]

    def pct(x):
        return fmt(None if x is None else 100 * x, ".1f") + ("" if x is None else " %")

    def short(name):
        return name if len(name) <= name_chars else name[:name_chars - 3] + "..."

    timed = [x["seconds"] for x in t["timed"]]
    lines = [
        f"# One update, profiled ({metrics['device']}, torch {metrics['torch']})", "",
        (f"{cfg['model']}, wrap {cfg['wrap']}, optimizer {cfg['optimizer']}: {w['micro_batches']} micro-batches, "
         f"{w['sequences']} sequences, {w['tokens']:,} tokens (mean {w['sequence_tokens_mean']:.0f}, max "
         f"{w['sequence_tokens_max']}; per micro-batch {', '.join(f'{n:,}' for n in w['tokens_per_micro_batch'])})."),
        "",
        (f"- wall time: {fmt(sum(timed) / len(timed) if timed else None, '.2f')} s unprofiled, "
         f"{t['profiled_s']:.2f} s profiled (overhead {pct(t['profiler_overhead'])}); peak allocated "
         f"{fmt(t['peak_allocated_gib'], '.1f')} GiB"),
        (f"- model FLOPs {f['model_flops'] / 1e12:.3g} TFLOP (attention {pct(f['attention_share_of_model_flops'])}); "
         f"MFU {pct(f['mfu_timed'])} (profiled {pct(f['mfu_profiled'])}), {pct(f['mfu_busy'])} of the busy time alone; "
         f"peak {fmt(f['peak_bf16_flops'] and f['peak_bf16_flops'] / 1e12, '.0f')} TFLOP/s"),
        (f"- {s['timeline']}: busy {d['busy_ms']:.1f} ms of {s['window']['ms']:.1f} ms ({pct(d['busy_fraction'])}), "
         f"idle {d['idle_ms']:.1f} ms in {s['idle_gaps']['count']:,} gaps; host syncs {s['host_syncs']['count']} "
         f"({s['host_syncs']['ms']:.1f} ms blocked), device-to-host copies {s['host_syncs']['d2h_copies']['count']}"),
        f"- trace: {metrics['trace']['kept']}", "",
        "| category | ms | share of kernel time | share of window |", "|---|---|---|---|",
        *[f"| {c} | {v['ms']:.1f} | {pct(v['share'])} | {pct(v['share_of_window'])} |"
          for c, v in sorted(s["categories"].items(), key=lambda kv: -kv[1]["ms"]) if v["count"]], "",
        *_passes_table(s, pct), "",
        "| kernel | category | count | ms | share |", "|---|---|---|---|---|",
        *[f"| `{short(r['name'])}` | {r['category']} | {r['count']} | {r['total_ms']:.1f} | {pct(r['share'])} |"
          for r in s["top_kernels"]], "",
        "| idle gap at (ms) | ms | before | after | host | phase |", "|---|---|---|---|---|---|",
        *[f"| {g['start_ms']:.1f} | {g['ms']:.2f} | `{short(g['before'] or '-')}` | `{short(g['after'] or '-')}` | "
          f"{', '.join(g['host']) or '-'} | {g['region'] or '-'} |" for g in s["idle_gaps"]["largest"]], "",
        "Idle time by phase: " + ", ".join(f"{k} {v['ms']:.1f} ms ({v['count']} gaps)"
                                           for k, v in s["idle_gaps"]["by_region"].items()) + ".", "",
        "| sync source | count | ms | kinds | phases |", "|---|---|---|---|---|",
        *[f"| `{r['op']}` | {r['count']} | {r['ms']:.2f} | {r['kinds']} | {r['regions']} |"
          for r in s["host_syncs"]["by_source"]],
    ]
    return "\n".join(lines) + "\n"


def _passes_table(summary: dict[str, Any], pct) -> list[str]:
    """Kernel time by pass (forward, the checkpoint's recompute, backward, optimizer) and category; a summary made
    before the passes were counted has none."""
    passes = summary.get("passes")
    if not passes:
        return ["*Kernel time by pass: not in this summary (`--reanalyze` adds it from the trace).*"]
    cats = [c for c in summary["categories"] if any(v["ms_by_category"].get(c) for v in passes.values())]
    return ["| pass | ms | share of kernel time | " + " | ".join(cats) + " |", "|---" * (len(cats) + 3) + "|",
            *[f"| {p} | {v['ms']:.1f} | {pct(v['share'])} | "
              + " | ".join(f"{v['ms_by_category'].get(c, 0.0):.1f}" for c in cats) + " |"
              for p, v in passes.items() if v["count"]]]
