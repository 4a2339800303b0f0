"""The generated blocks of how far notebook 05's runs are from the hardware (issue 24): each phase against its limit,
and the issue's targets judged on arm 5 and its variants at one commit. Every number comes from committed
``outputs/05_grpo_qwen3_4b/<run>/metrics.json`` (rlkit.planning.roofline via rlkit.experiments.estimates.phase_limits); :mod:`rlkit.report.sections`
places the blocks.
"""
from __future__ import annotations

from pathlib import Path

from rlkit.analysis.like_for_like import ATTENTION_PATH, judge, pair
from rlkit.core.env import short_gpu
from rlkit.core.results import OUTPUTS_DIR, fmt, pct
from rlkit.report.notebooks import SEED_PREFIX, committed_arms

# Notebook 05's runs of the h200 profile's shape on one GPU (profile h200-1gpu): folders "h200-1gpu-<arm>[-<variant>]".
ONE_GPU_PREFIX = "h200-1gpu-"
# Issue 24's targets are set against arm 5: its variants at the same commit are the candidates for the fastest arm.
BASE_ARM = "5-master-on-host-cast-once"
# the fastest variant may differ from arm 5 in the workload levers issue 24 counts among its levers: the attention
# path and the tokens per micro-batch (remove-padding's budget); everything else must match (rlkit.analysis.like_for_like)
FAST_VARIES = (*ATTENTION_PATH, "ppo_max_token_len_per_gpu")
STEP_CHANGE_TARGET = -0.30  # the fastest correct arm's step time against arm 5's at the same shape
UPDATE_MFU_TARGET = 0.40
GEN_FRACTION_TARGET = 0.70  # of standalone vLLM's output tokens/s at the same batch and lengths
BETWEEN_PHASES_TARGET = 0.05  # of the step
STEP_CUT_TARGET = 0.25  # issue 42: the fastest variant's step at least 25% below arm 5's at the seed's workload


def _limits_row(root: Path, name: str, metrics: dict) -> dict:
    """One committed run's phases against their limits, on the GPU its env.json names."""
    from rlkit.core.env import gpu_name, read_saved
    from rlkit.experiments.estimates import limits_row, phase_limits

    return limits_row(name, phase_limits(metrics, gpu_name(read_saved(root / "05_grpo_qwen3_4b" / name))))


def _limits_rows(root: Path) -> list[tuple[str, str, dict]]:
    """(name, commit, limits row) of every notebook 05 run that trained two steps or more."""
    from rlkit.verl.logs import training_steps

    rows = []
    for prefix in ("", SEED_PREFIX, ONE_GPU_PREFIX):
        arms, commits = committed_arms(root, prefix=prefix)
        rows += [(name, commits[name], _limits_row(root, name, m)) for name, m in arms.items()
                 if len(training_steps(m.get("steps", []))) >= 2]
    return rows


def limits_section(root: Path = OUTPUTS_DIR) -> list[str]:
    """Notebook 05's runs with steps 2.. measured (those that trained, and those that failed later), each phase against
    its limit."""
    rows = _limits_rows(root)
    if not rows:
        return ["*05_grpo_qwen3_4b: no committed arm has trained two steps yet.*"]
    header = ("| arm | commit | GPU | tokens/seq (real / computed) | update_actor s | MFU | hardware FLOPs | host optimizer step s "
              "(of PCIe) | update_weights s (of PCIe) | gen s (of standalone vLLM) | gen's HBM bound s (of gen) | old_log_prob s (MFU) | between phases (of step) |")
    lines = ["**Each phase against its limit** (notebook 05's runs that trained two steps or more; means over steps 2..; `rlkit.planning.roofline`: model "
             "FLOPs of the real tokens, fwd + bwd, against the dense bf16 peak of the GPU the run's env.json names (H100 SXM and H200: 989 TFLOP/s, data sheets); "
             "hardware FLOPs add the checkpoint recompute and the padding; the host optimizer step and the weight sync "
             "against the node's pinned copy rate (`outputs/02_host_adamw/h200/metrics.json`); gen against a standalone vLLM "
             "of the run's shape on the same GPU (committed by `rlkit.experiments.vllm_ceiling`, found by "
             "`rlkit.planning.roofline.vllm_ceiling`), `-` where none is committed; gen's HBM bound: every weight read once per decode step and each sequence's "
             "KV cache at its context, over the run's response lengths (the synthetic length model's), at the GPU's memory "
             "bandwidth (H200: 4.8 TB/s, H100 SXM: 3.35 TB/s, data sheets; `rlkit.planning.roofline.decode_bound`), a lower bound):", "", header, "|" + "---|" * (header.count("|") - 1)]
    for name, commit, r in rows:
        lines.append(f"| {name} | {commit} | {short_gpu(r['gpu'])} | {fmt(r['tokens_real'], 'd')} / {fmt(r['tokens_computed'], 'd')} | "
                     f"{fmt(r['update_actor_s'])} | {pct(r['update_actor_fraction'])} | "
                     f"{pct(r['update_actor_hardware_fraction'])} | {fmt(r['optimizer_step_s'], '.2f')} "
                     f"({pct(r['optimizer_step_fraction'])}) | {fmt(r['update_weights_s'], '.2f')} "
                     f"({pct(r['update_weights_fraction'])}) | {fmt(r['gen_s'])} ({pct(r.get('gen_fraction'))}) | "
                     f"{fmt(r['gen_hbm_limit_s'])} ({pct(r['gen_hbm_fraction'])}) | "
                     f"{fmt(r['old_log_prob_s'], '.2f')} "
                     f"({pct(r['old_log_prob_fraction'])}) | {pct(r['between_phases_share'])} |")
    return lines


def _correct(metrics: dict) -> bool:
    """Trained every step it was asked for and passed the run's sanity bar (finite, non-zero gradients; no NaN)."""
    from rlkit.experiments.grpo_runs import outcome

    return outcome(metrics) == "trained" and bool((metrics.get("sanity") or {}).get("passed"))


def _correct_base_runs(arms: dict[str, dict], base: str) -> list[str]:
    """The correct runs of arm 5 itself (folder ``base`` or its reruns ``base.session<N>``), not of its variants."""
    return [n for n, m in arms.items() if (n == base or n.startswith(base + ".session")) and _correct(m)]


def fastest_pairs(root: Path = OUTPUTS_DIR) -> list[dict]:
    """Per shape (profile prefix), the fastest correct variant of arm 5 (``<prefix>5-...-<variant>``) and the arm-5
    run of the same commit it beats, with both step times (means over steps 2..) and the variant's phases against their
    limits. Shapes without such a pair are left out."""
    pairs = []
    for prefix in (ONE_GPU_PREFIX, SEED_PREFIX):
        arms, commits = committed_arms(root, prefix=prefix, reruns=True)
        base = prefix + BASE_ARM
        bases = {commits[n]: n for n in _correct_base_runs(arms, base)}
        found = [(arms[n]["summary"]["step_s"], n, bases[commits[n]]) for n, m in arms.items()
                 if n.startswith(base + "-") and commits[n] in bases and _correct(m)]
        if found:
            step, name, base_name = min(found)
            pairs.append({"shape": prefix.rstrip("-"), "variant": name, "base": base_name, "commit": commits[name],
                          "step_s": step, "base_step_s": arms[base_name]["summary"]["step_s"],
                          "pairing": pair(arms[name], arms[base_name], commits[name], commits[base_name],
                                          varies=FAST_VARIES),
                          "limits": _limits_row(root, name, arms[name])})
    return pairs


def _verdict(pairing, value: float | None, target: float, below: bool = False) -> str:
    if value is None:
        return "not measured"
    return judge(pairing, value <= target if below else value >= target)


def speed_targets_section(root: Path = OUTPUTS_DIR) -> list[str]:
    """Issue 24's targets on the fastest correct variant of arm 5 against arm 5 at the same commit, per shape."""
    pairs = fastest_pairs(root)
    if not pairs:
        return [f"*No arm-5 run and correct variant of it at one commit yet (`{ONE_GPU_PREFIX}arm5` and "
                f"`{ONE_GPU_PREFIX}fast` in `scripts/node_session.sh` measure them in one lease).*"]
    header = ("| shape | fastest correct variant | against | commit | step s | step change (target <= "
              f"{STEP_CHANGE_TARGET:.0%}) | update_actor MFU (>= {UPDATE_MFU_TARGET:.0%}) | gen of standalone vLLM "
              f"(>= {GEN_FRACTION_TARGET:.0%}) | between phases (<= {BETWEEN_PHASES_TARGET:.0%}) |")
    lines = ["**Issue 24's targets** (per shape, the correct variant of arm 5 with the shortest step, against arm 5 at "
             "the same commit; correct: trained every step and passed the sanity bar; means over steps 2..; "
             "`outputs/05_grpo_qwen3_4b/<run>/metrics.json`):", "", header, "|" + "---|" * (header.count("|") - 1)]
    for p in pairs:
        row = p["limits"]
        change = p["step_s"] / p["base_step_s"] - 1
        mfu, gen, between = (row.get(k) for k in ("update_actor_fraction", "gen_fraction", "between_phases_share"))
        lines.append(f"| {p['shape']} | {p['variant']} | {p['base']} | {p['commit']} | {p['base_step_s']:.1f} -> "
                     f"{p['step_s']:.1f} | {change:+.0%}: {_verdict(p['pairing'], change, STEP_CHANGE_TARGET, below=True)} | "
                     f"{pct(mfu)}: {_verdict(p['pairing'], mfu, UPDATE_MFU_TARGET)} | "
                     f"{pct(gen)}: {_verdict(p['pairing'], gen, GEN_FRACTION_TARGET)} | "
                     f"{pct(between)}: {_verdict(p['pairing'], between, BETWEEN_PHASES_TARGET, below=True)} |")
    return lines + ["", *(f"{p['shape']}: {p['pairing'].basis}." for p in pairs)]


def _arm5_seed_runs(root: Path) -> list[tuple[str, str, dict]]:
    """(name, commit, metrics) of every correct arm-5 run of the seed's workload at lr 0, reruns included."""
    arms, commits = committed_arms(root, prefix=SEED_PREFIX, reruns=True)
    return [(n, commits[n], arms[n]) for n in _correct_base_runs(arms, SEED_PREFIX + BASE_ARM)
            if arms[n]["recipe"]["lr"] == 0]


def step_target_section(root: Path = OUTPUTS_DIR) -> list[str]:
    """Issue 42's step target as arithmetic on each correct arm-5 run of the seed's workload: what update_actor's MFU
    and gen's seconds must become for a step 25% shorter (rlkit.planning.roofline.step_cut_needs)."""
    from rlkit.planning.roofline import step_cut_needs

    runs = _arm5_seed_runs(root)
    if not runs:
        return ["*No correct arm-5 run of the seed's workload at lr 0 committed yet.*"]
    header = ("| run | commit | GPU | step s -> target | update_actor s (MFU) | update_actor alone: s (MFU) | "
              f"update_actor at {UPDATE_MFU_TARGET:.0%} MFU: s | gen s (of standalone vLLM) | gen then: s | "
              "gen's HBM bound s |")
    lines = [f"**What issue 42's step target asks of arm 5** (a step {STEP_CUT_TARGET:.0%} shorter; each correct "
             "arm-5 run of the seed's workload at lr 0, means over steps 2..; each phase's FLOPs and bytes as the run "
             "did them, every other phase unchanged; `update_actor alone`: the phase giving the whole cut; `gen then`: "
             f"what gen must take once update_actor runs at {UPDATE_MFU_TARGET:.0%} MFU; "
             "`rlkit.planning.roofline.step_cut_needs`; `outputs/05_grpo_qwen3_4b/<run>/metrics.json`):", "", header,
             "|" + "---|" * (header.count("|") - 1)]
    verdicts = []
    for name, commit, m in runs:
        row = _limits_row(root, name, m)
        need = step_cut_needs(m["summary"]["step_s"], row["update_actor_s"], row["update_actor_fraction"],
                              row["gen_s"], STEP_CUT_TARGET, UPDATE_MFU_TARGET)
        lines.append(f"| {name} | {commit} | {short_gpu(row['gpu'])} | {need['step_s']:.1f} -> {need['target_step_s']:.1f} | "
                     f"{row['update_actor_s']:.1f} ({pct(row['update_actor_fraction'])}) | "
                     f"{fmt(need['update_alone_s'])} ({pct(need['update_alone_mfu'])}) | "
                     f"{need['update_at_target_s']:.1f} | {row['gen_s']:.1f} ({pct(row.get('gen_fraction'))}) | "
                     f"{need['gen_then_s']:.1f} | {fmt(row['gen_hbm_limit_s'])} |")
        verdicts.append(_step_target_verdict(name, row, need))
    return lines + ["", *verdicts]


def _against_bound(seconds: float, bound: float | None) -> str:
    if bound is None:
        return ""
    return f", {'above' if seconds >= bound else 'below'} its HBM bound of {bound:.1f} s"


def _step_target_verdict(name: str, row: dict, need: dict) -> str:
    """One run's arithmetic in words: what update_actor alone, and gen beside a 40%-MFU update, would have to reach."""
    mfu, bound, ceiling = need["update_alone_mfu"], row["gen_hbm_limit_s"], row.get("gen_fraction")
    update = (f"update_actor alone would have to run at {pct(mfu)} MFU" if mfu is not None
              else "update_actor alone cannot give it (the cut is longer than the phase)")
    speed = (f", {ceiling * row['gen_s'] / need['gen_then_s']:.0%} of a standalone vLLM's speed"
             if ceiling is not None else "")
    return (f"- {name}: {update}. With update_actor at {UPDATE_MFU_TARGET:.0%} MFU, gen would still have to fall from "
            f"{row['gen_s']:.1f} to {need['gen_then_s']:.1f} s{speed}{_against_bound(need['gen_then_s'], bound)}. "
            f"gen alone would have to take {need['gen_alone_s']:.1f} s{_against_bound(need['gen_alone_s'], bound)}.")
