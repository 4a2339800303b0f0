"""What speculative decoding could give gen at a committed run's workload, from the decode roofline (issue 42).

    python -m rlkit.experiments.speculative_bound --out DIR [--profile h200-seed|h100-seed|tiny] [-p key=value] [--tag TAG]

writes ``DIR/speculative_bound/<tag>/`` (``params.yaml``, ``env.json``, ``metrics.json``). It reads one committed
notebook-05 run (``outputs/05_grpo_qwen3_4b/<run>/``): its recipe, its steps 2.. and the GPU its env.json names, and
puts one vLLM replica's decoding of that batch (:func:`rlkit.planning.roofline.decode_inputs`) through
:func:`rlkit.planning.decode_roofline.decode_roofline`, without speculation and for each pair of ``draft_tokens``
and ``acceptance``. Next to them: the bandwidth-only bound the run's limits report (:func:`roofline.decode_bound`)
and the run's measured gen. Arithmetic only, on any machine: a random-init model accepts no draft, so no run here can
measure an acceptance, and the rows are what a real model with that acceptance would be bound by. The response
lengths are the run's: the synthetic length model's where the recipe has one (then the rows say so).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rlkit.core import params as P
from rlkit.core.results import OUTPUTS_DIR
from rlkit.experiments._committed_decode import run_folder

NOTEBOOK = "speculative_bound"


@dataclass(frozen=True)
class Config:
    run: str  # a committed run folder of notebook 05: outputs/05_grpo_qwen3_4b/<run>/
    draft_tokens: tuple[int, ...]  # tokens a drafter proposes per verify step, one row each (with each acceptance)
    acceptance: tuple[float, ...]  # each draft token's chance to be kept given the ones before it, in [0, 1]

    def __post_init__(self):
        run_folder(self.run)
        if not self.draft_tokens or min(self.draft_tokens) < 1:
            raise P.ParamError(f"draft_tokens={list(self.draft_tokens)}: list one or more counts >= 1.")
        if not self.acceptance or not all(0.0 <= a <= 1.0 for a in self.acceptance):
            raise P.ParamError(f"acceptance={list(self.acceptance)}: list one or more values in [0, 1].")


_GRID = {"draft_tokens": [1, 2, 4], "acceptance": [0.5, 0.6, 0.7, 0.8, 0.9]}
PROFILES: dict[str, dict[str, Any]] = {
    "h200-seed": {"run": "h200-seed-5-master-on-host-cast-once.session18", **_GRID},
    "h100-seed": {"run": "h200-seed-5-master-on-host-cast-once.session21", **_GRID},
    "tiny": {"run": "h200-seed-5-master-on-host-cast-once.session18", "draft_tokens": [2], "acceptance": [0.7]},
}


def run(cfg: Config) -> dict[str, Any]:
    from rlkit.experiments._committed_decode import decode_workload, lengths_basis
    from rlkit.planning import roofline
    from rlkit.planning.decode_roofline import NO_SPECULATION, Speculation, decode_roofline

    work = decode_workload(cfg.run)
    inputs, shape = work["inputs"], work["shape"]
    pmf = inputs["response_pmf"]

    def bound(speculation=NO_SPECULATION):
        return decode_roofline(shape, sequences=inputs["sequences"], prompt_tokens=inputs["prompt_tokens"],
                               response_pmf=pmf, hbm_bytes_per_s=work["hbm"][0], peak_flops=work["peak"][0],
                               dtype_bytes=roofline.DECODE_DTYPE_BYTES, speculation=speculation)

    plain = bound()
    rows = [bound(Speculation(k, a)) for k in cfg.draft_tokens for a in cfg.acceptance]
    rows = [{**row, "speedup_of_bound": plain["limit_s"] / row["limit_s"]} for row in rows]
    bandwidth_only = roofline.decode_bound(shape, **inputs, hbm_bytes_per_s=work["hbm"][0],
                                           dtype_bytes=roofline.DECODE_DTYPE_BYTES)
    return {"run": str(work["folder"].relative_to(OUTPUTS_DIR.parent)), "run_commit": work["commit"],
            "analysed_at": work["analysed_at"], "gpu": work["gpu"], "hbm_source": work["hbm"][1],
            "peak_source": work["peak"][1], "model": shape.name,
            "lengths": lengths_basis(work),
            "sequences": inputs["sequences"], "prompt_tokens": inputs["prompt_tokens"],
            "response_mean": sum(r * p for r, p in pmf.items()), "response_max": max(pmf),
            "measured_gen_s": work["mean"]["timing_s/gen"],
            "bandwidth_only": {k: bandwidth_only[k] for k in ("limit_s", "decode_steps", "steps_set_by")},
            "no_speculation": plain, "speculative": rows}


def main(argv=None) -> int:
    from rlkit.experiments import built_in_parser, run_built_in

    ns = built_in_parser(NOTEBOOK, __doc__.split("\n\n")[0], PROFILES, NOTEBOOK).parse_args(argv)
    return 0 if run_built_in(ns, Config, PROFILES, NOTEBOOK, lambda cfg, _work_dir: run(cfg)) is not None else 2


if __name__ == "__main__":
    raise SystemExit(main())
