"""Which vLLM engine settings could move gen at a committed run's workload, from arithmetic (issue 42, item 4).

    python -m rlkit.experiments.engine_settings --out DIR [--profile h200-seed|h100-seed|tiny] [-p key=value] [--tag TAG]

writes ``DIR/engine_settings/<tag>/`` (``params.yaml``, ``env.json``, ``metrics.json``). Issue 42 asks for engine
settings that leave the sampled distribution unchanged: the KV pool (``gpu_memory_utilization``), ``max_num_seqs``,
chunked prefill and prefix caching. Before any GPU time, this reads one committed notebook-05 run (its recipe, its
steps 2.., the GPU its env.json names, and its verl.log: the ``vllm serve`` options verl started the engine with and
the KV pool vLLM reported) and gives one row per setting, the value the run had beside what the arithmetic says:

- KV pool: the tokens the decoding wave holds (:func:`rlkit.planning.decode_roofline.kv_demand`, mean + ``sigmas``
  sigma at its peak) against the pool. A pool above that peak keeps every sequence running, so a larger one
  (a higher ``gpu_memory_utilization``) cannot add concurrency.
- ``max_num_seqs`` against the sequences one replica runs: at or above them, one wave holds them all.
- Chunked prefill (``max_num_batched_tokens``) and prefix caching: the prefill's least time (its linear FLOPs at the
  dense bf16 peak, or its chunks' weight reads at the HBM bandwidth if longer) as a share of the measured gen; prefix
  caching, on already, can save at most (n - 1) / n of it for n samples per prompt.

Beside them: the measured gen and the decode roofline's bound without speculation. Arithmetic only, on any machine.
The response lengths are the run's: the synthetic length model's where the recipe has one (the rows then say so).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from rlkit.core import params as P
from rlkit.core.results import OUTPUTS_DIR
from rlkit.experiments._committed_decode import run_folder

NOTEBOOK = "engine_settings"


@dataclass(frozen=True)
class Config:
    run: str  # a committed run folder of notebook 05: outputs/05_grpo_qwen3_4b/<run>/
    sigmas: float = 4.0  # the KV demand's margin: its mean plus this many standard deviations

    def __post_init__(self):
        run_folder(self.run)
        if isinstance(self.sigmas, bool) or not isinstance(self.sigmas, (int, float)) or self.sigmas < 0:
            raise P.ParamError(f"sigmas={self.sigmas!r}: give a number >= 0 (standard deviations above the mean).")


PROFILES: dict[str, dict[str, Any]] = {
    "h200-seed": {"run": "h200-seed-5-master-on-host-cast-once.session18"},
    "h100-seed": {"run": "h200-seed-5-master-on-host-cast-once.session21"},
    "tiny": {"run": "h200-seed-5-master-on-host-cast-once.session18"},  # the arithmetic takes a second anyway
}


def _engine(folder) -> dict[str, Any]:
    """The run's engine settings from its verl.log: the ``vllm serve`` options and the KV pool vLLM reported."""
    from rlkit.verl.logs import CONSOLE_LOG, parse_vllm_log, parse_vllm_serve_args

    text = (folder / CONSOLE_LOG).read_text(errors="replace")
    engines, pools = parse_vllm_serve_args(text), set(parse_vllm_log(text)["kv_cache_tokens"])
    if len(engines) != 1 or len(pools) != 1:
        raise P.ParamError(f"run={folder.name!r}: its {CONSOLE_LOG} shows {len(engines)} vllm serve option list(s) "
                           f"and KV pools {sorted(pools)}; this reads a run of one engine. Fix: name such a run.")
    keys = ("gpu_memory_utilization", "max_num_seqs", "enable_chunked_prefill", "max_num_batched_tokens",
            "enable_prefix_caching")
    return {**{k: engines[0].get(k) for k in keys}, "kv_cache_tokens": pools.pop()}


def _kv_pool_row(engine: dict[str, Any], demand: dict[str, Any]) -> dict[str, Any]:
    waits = demand["upper_tokens"] > engine["kv_cache_tokens"]
    return {"setting": "gpu_memory_utilization", "run_value": engine["gpu_memory_utilization"],
            "pool_tokens": engine["kv_cache_tokens"], "demand": demand,
            "pool_over_demand": engine["kv_cache_tokens"] / demand["upper_tokens"], "sequences_may_wait": waits,
            "says": ("the wave's KV demand may exceed the pool: a larger pool could keep more sequences running" if waits
                     else "the pool holds the wave's KV demand with its margin: no sequence waits for blocks, so a "
                          "larger pool adds no concurrency to this wave")}


def _max_num_seqs_row(engine: dict[str, Any], sequences: int) -> dict[str, Any]:
    waits = engine["max_num_seqs"] < sequences
    return {"setting": "max_num_seqs", "run_value": engine["max_num_seqs"], "sequences": sequences,
            "sequences_may_wait": waits,
            "says": ("sequences queue behind max_num_seqs: a higher one runs more at once" if waits
                     else "one wave runs every sequence of the replica: a higher max_num_seqs adds no concurrency")}


def _prefill_rows(work: dict[str, Any], engine: dict[str, Any]) -> list[dict[str, Any]]:
    """Chunked prefill and prefix caching, both bounded by the prefill's least time against the measured gen."""
    from rlkit.planning import roofline

    inputs, shape, gen_s = work["inputs"], work["shape"], work["mean"]["timing_s/gen"]
    tokens = inputs["sequences"] * inputs["prompt_tokens"]
    chunks = math.ceil(tokens / engine["max_num_batched_tokens"])
    compute_s = 2.0 * roofline.linear_params(shape) * tokens / work["peak"][0]
    reads_s = chunks * roofline.linear_params(shape) * roofline.DECODE_DTYPE_BYTES / work["hbm"][0]
    prefill_s, group = max(compute_s, reads_s), work["recipe"]["rollout_n"]
    cached_s = prefill_s * (group - 1) / group  # every sample after a group's first finds its prompt cached
    return [{"setting": "enable_chunked_prefill", "run_value": engine["enable_chunked_prefill"],
             "max_num_batched_tokens": engine["max_num_batched_tokens"], "prefill_tokens": tokens,
             "prefill_chunks": chunks, "prefill_compute_s": compute_s, "prefill_weight_reads_s": reads_s,
             "prefill_bound_s": prefill_s, "share_of_gen": prefill_s / gen_s,
             "says": "the prefill's least time, as a share of gen: the part of gen a prefill setting acts on"},
            {"setting": "enable_prefix_caching", "run_value": engine["enable_prefix_caching"], "rollout_n": group,
             "cacheable_share_of_prefill": (group - 1) / group, "cached_prefill_s": cached_s,
             "share_of_gen": cached_s / gen_s,
             "says": "on already: the most of the prefill it can save, as a share of gen"}]


def run(cfg: Config) -> dict[str, Any]:
    from rlkit.experiments._committed_decode import decode_workload, lengths_basis
    from rlkit.planning import roofline
    from rlkit.planning.decode_roofline import decode_roofline, kv_demand

    work = decode_workload(cfg.run)
    inputs, engine = work["inputs"], _engine(work["folder"])
    pmf, gen_s = inputs["response_pmf"], work["mean"]["timing_s/gen"]
    demand = kv_demand(sequences=inputs["sequences"], prompt_tokens=inputs["prompt_tokens"], response_pmf=pmf,
                       sigmas=cfg.sigmas)
    decode = decode_roofline(work["shape"], sequences=inputs["sequences"], prompt_tokens=inputs["prompt_tokens"],
                             response_pmf=pmf, hbm_bytes_per_s=work["hbm"][0], peak_flops=work["peak"][0],
                             dtype_bytes=roofline.DECODE_DTYPE_BYTES)
    return {"run": str(work["folder"].relative_to(OUTPUTS_DIR.parent)), "run_commit": work["commit"],
            "analysed_at": work["analysed_at"], "gpu": work["gpu"], "hbm_source": work["hbm"][1],
            "peak_source": work["peak"][1], "model": work["shape"].name, "lengths": lengths_basis(work),
            "sequences": inputs["sequences"], "prompt_tokens": inputs["prompt_tokens"],
            "response_mean": sum(r * p for r, p in pmf.items()), "response_max": max(pmf), "engine": engine,
            "measured_gen_s": gen_s,
            "decode_bound": {k: decode[k] for k in ("limit_s", "bandwidth_s", "compute_s", "compute_bound_share")},
            "settings": [_kv_pool_row(engine, demand), _max_num_seqs_row(engine, inputs["sequences"]),
                         *_prefill_rows(work, engine)]}


def main(argv=None) -> int:
    from rlkit.experiments import built_in_parser, run_built_in

    ns = built_in_parser(NOTEBOOK, __doc__.split("\n\n")[0], PROFILES, NOTEBOOK).parse_args(argv)
    return 0 if run_built_in(ns, Config, PROFILES, NOTEBOOK, lambda cfg, _work_dir: run(cfg)) is not None else 2


if __name__ == "__main__":
    raise SystemExit(main())
