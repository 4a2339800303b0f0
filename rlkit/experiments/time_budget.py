"""Notebook 08, where the time goes: each phase of notebook 05's committed runs against its limit.

The limits are :func:`rlkit.experiments.estimates.phase_limits` on the GPU each run's env.json names: the update's
model FLOPs at the GPU's dense bf16 peak (MFU), the host optimizer step and the weight sync at the node's pinned copy
rate, gen against a standalone vLLM of the run's shape where one is committed and against the decode's memory-bandwidth
bound; beside them, what speculative decoding could give gen (:mod:`rlkit.experiments.speculative_bound`'s committed
folders, arithmetic) and whether vLLM's engine settings could move it (:mod:`rlkit.experiments.engine_settings`'s).
It reads committed results only, so a laptop shows the same numbers as the GPU node; nothing runs.
``python -m rlkit.experiments.time_budget --profile tiny`` writes ``outputs/08_where_the_time_goes/<tag>/``.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from rlkit.core import params as P
from rlkit.core.results import OUTPUTS_DIR, committed_runs

NOTEBOOK = "08_where_the_time_goes"
RUNS = "05_grpo_qwen3_4b"
SPECULATIVE = "speculative_bound"
ENGINE_SETTINGS = "engine_settings"
# The phases held against a limit, in a step's order.
PHASES = ("gen", "old_log_prob", "update_actor", "optimizer_step", "update_weights")


@dataclass(frozen=True)
class Config:
    prefix: str = "h200-seed-"  # notebook 05's runs whose folder starts so ("h200-seed-": the seed's workload)
    min_steps: int = 2  # a run's steps 2.. are measured: at least two trained steps

    def __post_init__(self) -> None:
        if not isinstance(self.prefix, str):
            raise P.ParamError(f"prefix: must be a folder-name prefix such as 'h200-seed-', got {self.prefix!r}")
        if isinstance(self.min_steps, bool) or not isinstance(self.min_steps, int) or self.min_steps < 2:
            raise P.ParamError(f"min_steps: must be an integer >= 2 (steps 2.. are the measured ones), "
                               f"got {self.min_steps!r}")


def _run_row(folder, metrics: dict[str, Any]) -> dict[str, Any]:
    from rlkit.core.env import gpu_name, read_saved
    from rlkit.experiments.estimates import limits_row, phase_limits

    env = read_saved(folder) or {}
    gpu = gpu_name(env)
    step = (metrics.get("summary") or {}).get("step_s")
    return {**limits_row(folder.name, phase_limits(metrics, gpu)), "gpu": gpu, "commit": (env.get("git_sha") or "-")[:7],
            "step_s": step}


def run(cfg: Config) -> dict[str, Any]:
    """Every committed run of notebook 05 under ``cfg.prefix`` with ``cfg.min_steps`` trained steps or more, each
    phase against its limit (:func:`rlkit.experiments.estimates.limits_row`), with its GPU and commit."""
    from rlkit.experiments.grpo_runs import read_results
    from rlkit.verl.logs import training_steps

    rows = []
    for folder in committed_runs(OUTPUTS_DIR / RUNS):
        if folder.name.startswith(cfg.prefix):
            metrics = read_results(folder)
            if len(training_steps(metrics.get("steps", []))) >= cfg.min_steps:
                rows.append(_run_row(folder, metrics))
    return {"config": asdict(cfg), "source": f"outputs/{RUNS}/<run>/metrics.json", "rows": rows,
            "speculative": [_speculative(folder) for folder in committed_runs(OUTPUTS_DIR / SPECULATIVE)],
            "engine_settings": [_engine_settings(folder) for folder in committed_runs(OUTPUTS_DIR / ENGINE_SETTINGS)]}


def _speculative(folder) -> dict[str, Any]:
    """One committed speculative_bound folder, as notebook 08 shows it: the run it read, its decode bound and the
    bound's speed-up for each pair of draft tokens and acceptance."""
    from rlkit.core.results import read_metrics

    m = read_metrics(folder)
    plain = m["no_speculation"]
    return {"tag": folder.name, "run": m["run"], "gpu": m["gpu"], "measured_gen_s": m["measured_gen_s"],
            "bound_s": plain["limit_s"], "kv_share": plain["kv_bytes"] / (plain["kv_bytes"] + plain["weight_bytes"]),
            "compute_bound_share": plain["compute_bound_share"],
            "rows": [{k: r[k] for k in ("draft_tokens", "acceptance", "limit_s", "speedup_of_bound")}
                     for r in m["speculative"]]}


def _engine_settings(folder) -> dict[str, Any]:
    """One committed engine_settings folder, as notebook 08 shows it: the KV demand against the pool, max_num_seqs
    against the sequences, the prefill's share of gen, and the decode bound beside the measured gen."""
    from rlkit.core.results import read_metrics

    m = read_metrics(folder)
    pool, seqs, chunked, cached = m["settings"]
    return {"tag": folder.name, "run": m["run"], "gpu": m["gpu"], "measured_gen_s": m["measured_gen_s"],
            "bound_s": m["decode_bound"]["limit_s"], "pool_tokens": pool["pool_tokens"],
            "demand_tokens": pool["demand"]["upper_tokens"], "sigmas": pool["demand"]["sigmas"],
            "max_num_seqs": seqs["run_value"], "sequences": seqs["sequences"],
            "sequences_may_wait": pool["sequences_may_wait"] or seqs["sequences_may_wait"],
            "prefill_share": chunked["share_of_gen"], "prefix_cache_share": cached["share_of_gen"]}


def largest_gap(row: dict[str, Any]) -> tuple[str, float] | None:
    """The phase whose seconds lie furthest above its limit's (the time a faster implementation could win there)."""
    gaps = {p: row[f"{p}_s"] - row[f"{p}_limit_s"] for p in PHASES
            if row.get(f"{p}_s") is not None and row.get(f"{p}_limit_s") is not None}
    return max(gaps.items(), key=lambda kv: kv[1]) if gaps else None


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:.0%}"


def describe(metrics: dict[str, Any]) -> str:
    """The findings in words, one sentence per run, from ``metrics`` alone."""
    rows = metrics["rows"]
    if not rows:
        return (f"No committed run of notebook 05 under '{metrics['config']['prefix']}' has "
                f"{metrics['config']['min_steps']} trained steps: nothing to hold against a limit.")
    lines = [f"{len(rows)} committed run(s) of notebook 05 ({metrics['source']}), each phase of steps 2.. against its "
             "limit on the GPU its env.json names:"]
    for r in rows:
        gap = largest_gap(r)
        where = (f"; the most time above a limit is {gap[0]}'s, {gap[1]:.1f} s of the step's {r['step_s']:.1f} s"
                 if gap and r.get("step_s") else "")
        lines.append(f"- {r['arm']} ({r['gpu']}, {r['commit']}): update_actor at {_pct(r['update_actor_fraction'])} MFU "
                     f"({_pct(r['update_actor_hardware_fraction'])} counting the recompute and padding), gen at "
                     f"{_pct(r['gen_hbm_fraction'])} of its memory-bandwidth bound and {_pct(r.get('gen_fraction'))} of "
                     f"standalone vLLM, between phases {_pct(r['between_phases_share'])} of the step{where}.")
    lines += [_speculative_line(s) for s in metrics.get("speculative", [])]
    lines += [_engine_settings_line(e) for e in metrics.get("engine_settings", [])]
    return "\n".join(lines)


def _speculative_line(s: dict[str, Any]) -> str:
    ups = [r["speedup_of_bound"] for r in s["rows"]]
    accept = sorted({r["acceptance"] for r in s["rows"]})
    return (f"- Speculative decoding, arithmetic for a free drafter ({s['run']} on {s['gpu']}, "
            f"outputs/{SPECULATIVE}/{s['tag']}): gen's decode is bound at {s['bound_s']:.1f} s "
            f"({_pct(s['compute_bound_share'])} of it by arithmetic, {_pct(s['kv_share'])} of the bytes KV cache) against "
            f"{s['measured_gen_s']:.1f} s measured; at acceptances {accept[0]:g} to {accept[-1]:g} the bound falls "
            f"{min(ups):.2f}x to {max(ups):.2f}x. No acceptance is measured: a random-init model accepts nothing.")


def _engine_settings_line(e: dict[str, Any]) -> str:
    verdict = ("some sequence may wait: a larger pool or max_num_seqs could add concurrency" if e["sequences_may_wait"]
               else "neither a larger pool nor a higher max_num_seqs adds concurrency")
    return (f"- vLLM engine settings, arithmetic ({e['run']} on {e['gpu']}, outputs/{ENGINE_SETTINGS}/{e['tag']}): the "
            f"decoding wave holds at most {e['demand_tokens']:,.0f} KV tokens (mean + {e['sigmas']:g} sigma) of a "
            f"{e['pool_tokens']:,}-token pool and max_num_seqs {e['max_num_seqs']} runs its {e['sequences']} sequences "
            f"at once: {verdict}; the prefill's least time is {e['prefill_share']:.1%} of the measured "
            f"{e['measured_gen_s']:.1f} s gen (prefix caching, on, saves at most {e['prefix_cache_share']:.1%}); the "
            f"decode's bandwidth bound is {e['bound_s']:.1f} s of it.")


def main(argv: list[str] | None = None) -> int:
    from rlkit.experiments import experiment_main

    return experiment_main(Config, run, NOTEBOOK, argv)


if __name__ == "__main__":
    raise SystemExit(main())
