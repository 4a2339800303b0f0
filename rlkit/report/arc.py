"""README's headline (issue 41): the seed's arc at the seed's own workload on one GPU, every run from one commit.

The arc's runs are notebook 05's committed folders ``h200-seed-<arm>[-<variant>][.session<N>]`` at lr 0 whose
env.json names one commit: the commit whose runs cover the most arms (ties: the newer commit, so that an arc re-run
from a later commit takes over once it has as many arms), so that every row of the table comes from it and a run from
any other commit stays in docs/results.md's seed table. Arms run in several leases
give the run-to-run spread. Arm 5 against arm 1 and the seed's targets for the full arc are judged through
:mod:`rlkit.analysis.like_for_like`, never on an unlike pair. :mod:`rlkit.report.sections` places the block.
"""
from __future__ import annotations

from pathlib import Path
from statistics import mean

from rlkit.analysis.like_for_like import judge, pair
from rlkit.core.results import OUTPUTS_DIR, fmt
from rlkit.report.notebooks import SEED_PREFIX, committed_arms

FIRST_WORKING_ARM = "1-fixes-hostadamw"
FULL_ARC = "5-master-on-host-cast-once"
# The seed's targets for the full arc against the first working arm (seed 000 on 2 x A6000: 445-450 s -> 369.4 s,
# peak 41.28 -> 33.38 GB).
ARC_STEP_TIME_CUT = 0.16
ARC_PEAK_CUT_GIB = 7.0
# What an arm does on one rank that it does on several: said in its row rather than dropping it.
ONE_RANK_NOTES = {"4-rank0-owner": "its rank-0 owner is a no-op on one rank, so it does arm 3's work"}


def planner_cell(check: dict | None) -> str:
    """The planner for one run in a few characters: its actor GiB and the ratio to the measured peak, or the
    failure it predicts."""
    if check is None:
        return "-"
    if check.get("measured_actor_peak_gib"):
        return f"{check['planner_actor_peak_gib']:.2f} GiB (x{check['ratio']:.2f})"
    if "measured_oom_phase" in check:
        return f"{check['planner_actor_peak_gib']:.1f} GiB > card: {'agrees' if check['agrees'] else 'DISAGREES'}"
    if "planner_free_at_vllm_start_gib" in check:
        return (f"{check['planner_free_at_vllm_start_gib']:.1f} GiB free at vLLM start (x{check['ratio']:.2f}), "
                f"{check['planner_verdict']}: {'agrees' if check['agrees'] else 'DISAGREES'}")
    return check["planner_verdict"]


def split_name(name: str) -> tuple[str, str]:
    """``h200-seed-<arm>[-<variant>][.<lease>]`` -> (arm, variant or '')."""
    from rlkit.recipes.grpo import ARMS

    base = name.removeprefix(SEED_PREFIX).split(".", 1)[0]
    arm = next(a for a in ARMS if base == a or base.startswith(a + "-"))
    return arm, base[len(arm) + 1:]


def commit_time(sha: str, root: Path = OUTPUTS_DIR) -> int:
    """When a commit was made (seconds since the epoch, git's committer date); 0 where this checkout lacks it."""
    import subprocess

    out = subprocess.run(["git", "-C", str(root if root.exists() else root.parent), "show", "-s", "--format=%ct",
                          f"{sha}^{{commit}}"], capture_output=True, text=True, check=False)
    return int(out.stdout.strip()) if out.returncode == 0 and out.stdout.strip().isdigit() else 0


def arc_runs(root: Path = OUTPUTS_DIR) -> tuple[str | None, dict[str, dict], dict[str, str]]:
    """(the arc's commit, its runs' metrics by folder name, their commits): the lr-0 seed-workload runs of the commit
    and GPU whose runs cover the most arms, the newer commit on a tie. One GPU model only: an arm timed on an H100
    and another on an H200 are not one arc, even from one commit."""
    loaded, commits = committed_arms(root, prefix=SEED_PREFIX, reruns=True)
    by_key: dict[tuple[str, str | None], list[str]] = {}
    for name, m in loaded.items():
        if m["recipe"].get("lr") == 0 and commits[name] != "-":
            by_key.setdefault((commits[name], m.get("gpu")), []).append(name)
    if not by_key:
        return None, {}, {}
    key = max(by_key, key=lambda k: (len({split_name(n)[0] for n in by_key[k]}), commit_time(k[0], root)))
    names = sorted(by_key[key])
    return key[0], {n: loaded[n] for n in names}, {n: commits[n] for n in names}


def _trained(metrics: dict) -> bool:
    from rlkit.experiments.grpo_runs import outcome

    return outcome(metrics) == "trained" and bool((metrics.get("sanity") or {}).get("passed"))


def _spread(runs: list[dict], key: str = "step_s") -> float | None:
    """(max - min) / mean of a summary value over two or more trained runs of one arm."""
    values = [m["summary"][key] for m in runs if _trained(m) and m["summary"].get(key) is not None]
    return (max(values) - min(values)) / mean(values) if len(values) >= 2 else None


def _row(arm: str, name: str, m: dict, spread: float | None) -> str:
    from rlkit.experiments.estimates import planner_check
    from rlkit.experiments.grpo_runs import outcome
    from rlkit.verl.logs import training_steps

    s = m.get("summary") or {}
    note = f" ({ONE_RANK_NOTES[arm]})" if arm in ONE_RANK_NOTES and m["recipe"]["n_gpus"] == 1 else ""
    return (f"| {arm} | {name} | {outcome(m)}{note} | {len(training_steps(m.get('steps', [])))} | {fmt(s.get('step_s'))} | "
            f"{'-' if spread is None else f'{spread:.1%}'} | {fmt(s.get('gen_s'))} | {fmt(s.get('old_log_prob_s'))} | "
            f"{fmt(s.get('update_actor_s'))} | {fmt(s.get('throughput_tok_s_per_gpu'), '.0f')} | "
            f"{fmt(s.get('actor_max_allocated_gib'), '.2f')} | {planner_cell(planner_check(m))} |")


def seed_arc_table(root: Path = OUTPUTS_DIR) -> list[str]:
    """The arc's table (one row per run, arms in the seed's order, an arm without a run at the commit said so), the
    fastest correct variant of the full arc, and :func:`arc_sentence`."""
    from rlkit.recipes.grpo import ARMS

    commit, runs, commits = arc_runs(root)
    if commit is None:
        return ["*05_grpo_qwen3_4b: no committed run of the seed's workload at lr 0 yet.*"]
    r, gpu = next(iter(runs.values()))["recipe"], next(iter(runs.values())).get("gpu") or "GPU (not recorded)"
    by_arm: dict[str, list[str]] = {a: [] for a in ARMS}
    variants = []
    for name in runs:
        arm, variant = split_name(name)
        (variants if variant else by_arm[arm]).append(name)
    header = ("| arm | run | outcome | steps | step (s) | step spread | gen | old_log_prob | update_actor | tokens/s/GPU | "
              "actor peak alloc. (GiB) | planner |")
    lines = [f"**The seed's arc at the seed's workload, commit {commit}: verl 0.9.1 + vLLM 0.24 GRPO, Qwen3-4B (random "
             f"init), {r['n_gpus']} x {gpu} emulating a {r['emulate_gpu_gib']:g} GiB card** ({r['train_batch_size']} x "
             f"{r['rollout_n']}, prompt <= {r['max_prompt_length']}, response <= {r['max_response_length']} with "
             f"SYNTHETIC lengths of mean {r['response_length_mean']}, {r['ppo_max_token_len_per_gpu']:,} tokens per "
             f"micro-batch, {r['attn_implementation']} without padding, lr {r['lr']:g}; means over steps 2..; every run "
             f"from commit {commit}, one per lease; `step spread`: (max - min) / mean of an arm's runs; "
             "`outputs/05_grpo_qwen3_4b/<run>/metrics.json`):", "", header, "|" + "---|" * (header.count("|") - 1)]
    for arm, names in by_arm.items():
        spread = _spread([runs[n] for n in names])
        lines += [_row(arm, n, runs[n], spread) for n in names] or [
            f"| {arm} | - | no run at {commit} yet | - | - | - | - | - | - | - | - | - |"]
    fastest = min((n for n in variants if split_name(n)[0] == FULL_ARC and _trained(runs[n])),
                  key=lambda n: runs[n]["summary"]["step_s"], default=None)
    lines.append(f"| fastest correct variant | {fastest} |" + _row(FULL_ARC, fastest, runs[fastest], None).split("|", 3)[3]
                 if fastest else f"| fastest correct variant | - | no variant of {FULL_ARC} at {commit} yet "
                 "| - | - | - | - | - | - | - | - | - |")
    return lines + ["", arc_sentence(by_arm, runs, commits), "", "The planner against every phase of each run: "
                    "[results](docs/results.md#the-planner-against-every-phase-of-the-arc)."]


# Each arm's own phase: where its change acts (the step is what a user gets).
OWN_PHASE = {"2-skip-old-logprob": "old_log_prob_s", "3-pinned": "update_actor_s", "4-rank0-owner": "update_actor_s",
             "5-master-on-host-cast-once": "update_actor_s"}


def net_effect_lines(runs: dict[str, dict], commit: str) -> list[str]:
    """Each arm against the arm before it at the arc's commit (means over each arm's trained runs): what it changes in
    its own phase, and in the whole step, with whether the pair (each arm's first run) is like for like."""
    from rlkit.recipes.grpo import ARMS

    trained: dict[str, list[dict]] = {}
    for name, m in runs.items():
        arm, variant = split_name(name)
        if not variant and _trained(m):
            trained.setdefault(arm, []).append(m)
    out = []
    for before, arm in zip(list(ARMS), list(ARMS)[1:]):
        if arm not in OWN_PHASE:
            continue
        if before not in trained or arm not in trained:
            out.append(f"- {arm} against {before}: not measured yet at this commit.")
            continue
        phase = OWN_PHASE[arm]
        own = [mean(m["summary"][phase] for m in trained[a]) for a in (before, arm)]
        step = [mean(m["summary"]["step_s"] for m in trained[a]) for a in (before, arm)]
        basis = pair(trained[arm][0], trained[before][0], commit, commit).basis
        out.append(f"- {arm} against {before} ({basis}): {phase.removesuffix('_s')} {own[0]:.1f} -> {own[1]:.1f} s "
                   f"({own[1] - own[0]:+.1f} s); the whole step {step[0]:.1f} -> {step[1]:.1f} s ({step[1] - step[0]:+.1f} s, "
                   f"{step[1] / step[0] - 1:+.1%}).")
    return ["Each arm against the one before it, in its own phase and in the whole step (means over each arm's runs "
            "at this commit; the step is what a user gets):", *out]


def arc_planner_section(root: Path = OUTPUTS_DIR) -> list[str]:
    """docs/results.md: each arm's net effect on the step (:func:`net_effect_lines`) and the planner against each
    phase of every run of the arc (:func:`phase_check_lines`)."""
    commit, runs, _ = arc_runs(root)
    if commit is None:
        return ["*05_grpo_qwen3_4b: no committed run of the seed's workload at lr 0 yet.*"]
    return [f"**The arc at commit {commit}** (`outputs/05_grpo_qwen3_4b/<run>/metrics.json`; device peaks from the "
            "launch's 1 Hz samples, each phase placed from the marks of when each step's line arrived, as notebook 06 "
            "places them):", "", *net_effect_lines(runs, commit), "", *phase_check_lines(runs)]


def allocator_gap_gib(summary: dict) -> float | None:
    """What the actor's caching allocator reserved above its peak allocation (verl's since-start peaks, GiB): memory the
    card shows and the planner, which counts allocations, leaves out. None where the run lacks either peak."""
    reserved, allocated = summary.get("actor_max_reserved_gib"), summary.get("actor_max_allocated_gib")
    return None if reserved is None or allocated is None else reserved - allocated


def _phase_cell(phase: str, entry: dict, summary: dict) -> str:
    if entry["ratio"] is None:
        return f"{phase} {entry['measured_gib']:.1f} GiB in {entry['samples']} sample(s), too short to judge at 1 Hz"
    cell = f"{phase} x{entry['ratio']:.2f}"
    if entry["within"]:
        return cell
    gap = allocator_gap_gib(summary) if phase == "update_actor" else None  # the phase of the actor's since-start peak
    if gap is None:
        return cell + " (outside 10%)"
    return (cell + f" (outside 10%; the actor's allocator reserved {gap:.2f} GiB above its peak allocation, which the "
            f"planner does not count: x{(entry['measured_gib'] - gap) / entry['planner_gib']:.2f} without it)")


def phase_check_lines(runs: dict[str, dict]) -> list[str]:
    """Per run, the planner against each phase's device peak (rlkit.experiments.estimates.planner_phase_check): its ratio, and which
    phases miss the 10% bar, an update_actor miss with the allocator's reserve it leaves out (:func:`allocator_gap_gib`);
    a run recorded without phase marks says so."""
    from rlkit.experiments.estimates import planner_phase_check

    out = []
    for name, m in runs.items():
        check = planner_phase_check(m) if (m.get("summary") or {}).get("step_s") else None
        if check is None:
            why = ("no trained step" if not (m.get("summary") or {}).get("step_s")
                   else "recorded without phase marks (runs record them since the launcher marks each step)")
            out.append(f"- {name}: {why}.")
        else:
            out.append(f"- {name}: " + "; ".join(_phase_cell(p, e, m["summary"]) for p, e in check.items()) + ".")
    return ["Planner against each phase's device peak (used memory of the card minus the idle baseline, steps 2.., "
            "measured / planner; the planner's bar is 10%):", *out]


def arc_sentence(by_arm: dict[str, list[str]], runs: dict[str, dict], commits: dict[str, str]) -> str:
    """Arm 5 against arm 1 at the arc's commit (means over each arm's runs), with the spread beside it, and the seed's
    targets for the full arc judged on that like-for-like pair."""
    base = [n for n in by_arm.get(FIRST_WORKING_ARM, []) if _trained(runs[n])]
    full = [n for n in by_arm.get(FULL_ARC, []) if _trained(runs[n])]
    if not base or not full:
        missing = [a for a, names in ((FIRST_WORKING_ARM, base), (FULL_ARC, full)) if not names]
        return (f"Arm 5 against arm 1 at this commit: not measured yet (no trained run of {' or '.join(missing)}); the "
                f"seed's targets for the full arc (step at least {ARC_STEP_TIME_CUT:.0%} shorter, actor peak at least "
                f"{ARC_PEAK_CUT_GIB:g} GiB lower) are not judged.")
    pairing = pair(runs[full[0]], runs[base[0]], commits[full[0]], commits[base[0]])
    step = {a: mean(runs[n]["summary"]["step_s"] for n in names) for a, names in ((FULL_ARC, full), (FIRST_WORKING_ARM, base))}
    peak = {a: mean(runs[n]["summary"]["actor_max_allocated_gib"] for n in names)
            for a, names in ((FULL_ARC, full), (FIRST_WORKING_ARM, base))}
    cut, drop = 1 - step[FULL_ARC] / step[FIRST_WORKING_ARM], peak[FIRST_WORKING_ARM] - peak[FULL_ARC]
    spreads = "; ".join(f"{a} {len(names)} run(s)" + (f", step spread {s:.1%}" if (s := _spread([runs[n] for n in names]))
                                                       is not None else ", no repeat yet")
                        for a, names in ((FIRST_WORKING_ARM, base), (FULL_ARC, full)))
    return (f"{FULL_ARC} against {FIRST_WORKING_ARM} ({pairing.basis}): step {step[FULL_ARC]:.1f} against "
            f"{step[FIRST_WORKING_ARM]:.1f} s, {cut:.1%} shorter (the seed's target {ARC_STEP_TIME_CUT:.0%}: "
            f"{judge(pairing, cut >= ARC_STEP_TIME_CUT)}); actor peak {drop:.2f} GiB lower (target "
            f"{ARC_PEAK_CUT_GIB:g} GiB: {judge(pairing, drop >= ARC_PEAK_CUT_GIB)}). Repeats: {spreads}.")
