"""The generated blocks of README.md and docs/*.md, assembled from committed results.

Every number in those blocks comes from files git tracks under ``outputs/`` (a local run, such as the
``tiny/`` folders ``make demo`` writes, is never read). ``python -m rlkit.report --write`` rewrites each block
between its markers in every file of ``DOCS``; ``python -m rlkit.report --check`` exits 1 naming the files whose
blocks disagree with the committed metrics, and so does a test. The single-notebook sections (01-04, 07 and the
deterministic reruns) are :mod:`rlkit.report.notebooks`', the update profiles :mod:`rlkit.report.profile`'; the limits
and issue 24's targets :mod:`rlkit.report.limits`'; the seed workload :mod:`rlkit.report.seed_workload`'; this module
has notebook 05's arms, and writes the blocks.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from rlkit.analysis.like_for_like import judge, pair
from rlkit.core.env import REPO_ROOT
from rlkit.core.results import OUTPUTS_DIR, committed_runs, fmt
from rlkit.report.arc import (
    ARC_PEAK_CUT_GIB,
    ARC_STEP_TIME_CUT,
    FIRST_WORKING_ARM,
    arc_planner_section,
    planner_cell,
    seed_arc_table,
)
from rlkit.report.limits import limits_section, speed_targets_section, step_target_section
from rlkit.report.notebooks import SECTIONS, committed_arms, determinism_section, learning_section, load_committed
from rlkit.report.profile import update_profile_section
from rlkit.report.seed_workload import seed_workload_section


def grpo_arms_section(root: Path = OUTPUTS_DIR) -> list[str]:
    """The verl + vLLM arms of notebook 05 (one folder per arm, named after rlkit.experiments.grpo.ARMS)."""
    from rlkit.experiments.estimates import planner_check
    from rlkit.experiments.grpo_runs import outcome
    from rlkit.recipes.grpo import ARMS
    from rlkit.verl.logs import training_steps

    loaded, commits = committed_arms(root)
    if not loaded:
        return ["*05_grpo_qwen3_4b: no committed GPU results yet.*"]
    names = list(loaded)
    first = loaded[names[0]]["recipe"]
    header = ("| arm | commit | response | tokens/micro-batch | outcome | steps | step (s) | gen | old_log_prob | update_actor | "
              "update_weights | tokens/s/GPU | actor peak alloc. (GiB) | device peak used (GiB) | host peak over idle (GiB) | "
              "host used after update (GiB) | grad_norm | pg_loss | sanity | ranks max abs diff | planner |")
    lines = [f"**verl 0.9.1 + vLLM 0.24 GRPO, Qwen3-4B (random init), 2 x H200 each emulating a {first['emulate_gpu_gib']:g} GiB "
             f"card** ({first['train_batch_size']} x {first['rollout_n']}, prompt {first['max_prompt_length']}; "
             "`outputs/05_grpo_qwen3_4b/<arm>/metrics.json`; means over steps 2..; only rows with the same response "
             "length and tokens per micro-batch are comparable; `commit` is the rlkit commit a run came from (env.json), "
             "one per device session, and rows from different sessions ran on different leases of the node):", "", header, "|" + "---|" * (header.count("|") - 1)]
    for name, m in loaded.items():
        result = outcome(m)
        s, check = m.get("summary") or {}, m.get("sanity") or {}
        steps = len(training_steps(m.get("steps", [])))
        lines.append(f"| {name} | {commits[name]} | {m['recipe']['max_response_length']} | {m['recipe']['ppo_max_token_len_per_gpu']} | "
                     f"{result} | {steps} | {fmt(s.get('step_s'))} | "
                     f"{fmt(s.get('gen_s'))} | {fmt(s.get('old_log_prob_s'))} | {fmt(s.get('update_actor_s'))} | "
                     f"{fmt(s.get('update_weights_s'), '.2f')} | {fmt(s.get('throughput_tok_s_per_gpu'), '.0f')} | "
                     f"{fmt(s.get('actor_max_allocated_gib'), '.2f')} | "
                     f"{fmt(max(s['gpu_peak_used_gib']) if s.get('gpu_peak_used_gib') else None, '.2f')} | "
                     f"{fmt(s.get('host_peak_above_baseline_gib'), '.1f')} | "
                     f"{fmt(s.get('host_memory_used_gib'), '.1f')} | {fmt(s.get('grad_norm'), '.3f')} | "
                     f"{fmt(s.get('pg_loss'), '.2e')} | {'passed' if check.get('passed') else ('-' if not check else 'FAILED')} | "
                     f"{fmt(check.get('rank_max_abs_diff'), 'g')} | {planner_cell(planner_check(m))} |")
    lines += ["", "`planner`: `rlkit.planning.budget` for the arm's exact overrides: the actor's largest total and its ratio to the "
              "measured peak, the OOM it predicts, or the free memory it leaves vLLM at start-up against vLLM's reading.",
              "", "`device peak used`: NVML's 1 Hz reading of the whole GPU (the actor, the sleeping vLLM engine, every CUDA "
              "context), highest GPU. The emulation caps each process at the card, not their sum (`rlkit.patches.instruments.emulate_card`): "
              "above the card, the excess can be cached-but-free allocator memory that a real card would reclaim; what "
              "it must hold is the actor's allocated peak, vLLM's residue while asleep and the CUDA contexts. "
              "`host peak over idle`: the node's used memory (/proc/meminfo, 1 Hz) at its highest during the launch, "
              "less its value before verl started (runs since the second device session). `host used after update`: "
              "verl's actor/perf/cpu_memory_used_gb, the node's used memory (all processes) at the end of update_actor."]
    return lines + ["", arc_summary({name: m for name, m in loaded.items() if name in ARMS}, commits)]


def arc_summary(arms: dict[str, dict], commits: dict[str, str] | None = None) -> str:
    """The seed's arc in one paragraph: every later arm that trained all its steps with the first working arm's
    response length and token budget, against that arm (marked when ``commits`` shows it ran in another device
    session); then the full arc (the last arm) against the targets."""
    from rlkit.experiments.grpo_runs import outcome
    from rlkit.recipes.grpo import ARMS

    base = arms.get(FIRST_WORKING_ARM)
    if base is None or not outcome(base).startswith("trained"):
        return f"The seed's arc is measured against {FIRST_WORKING_ARM}, which has no complete run yet."
    keys = ("max_response_length", "ppo_max_token_len_per_gpu")
    b = base["summary"]
    later = list(ARMS)[list(ARMS).index(FIRST_WORKING_ARM) + 1:]
    done = [a for a in later if a in arms and outcome(arms[a]).startswith("trained")
            and all(arms[a]["recipe"][k] == base["recipe"][k] for k in keys)]
    parts = [f"{a}: step {arms[a]['summary']['step_s']:.1f} s (x{arms[a]['summary']['step_s'] / b['step_s']:.3f}), "
             f"actor peak {arms[a]['summary']['actor_max_allocated_gib'] - b['actor_max_allocated_gib']:+.2f} GiB"
             + (f" (another device session: {commits[a]} vs {commits[FIRST_WORKING_ARM]})"
                if commits and commits.get(a) != commits.get(FIRST_WORKING_ARM) else "")
             for a in done]
    text = (f"The seed's arc against the first working arm, {FIRST_WORKING_ARM} (step {b['step_s']:.1f} s, actor peak "
            f"{b['actor_max_allocated_gib']:.2f} GiB): " + ("; ".join(parts) if parts else "no later arm trained yet") + ".")
    full = later[-1]
    missing = [a for a in later if a not in done]
    if full not in done:
        return (text + f" Targets for the full arc ({full}): step time at least {ARC_STEP_TIME_CUT:.0%} shorter and "
                f"actor peak at least {ARC_PEAK_CUT_GIB:g} GiB lower: not measured yet (no complete run of "
                f"{', '.join(missing)} at this response length and token budget).")
    f = arms[full]["summary"]
    cut, drop = 1 - f["step_s"] / b["step_s"], b["actor_max_allocated_gib"] - f["actor_max_allocated_gib"]
    pairing = pair(arms[full], base, (commits or {}).get(full, "-"), (commits or {}).get(FIRST_WORKING_ARM, "-"))
    return (text + f" Full arc ({full}; {pairing.basis}): step time {cut:.1%} shorter (target {ARC_STEP_TIME_CUT:.0%}: "
            f"{judge(pairing, cut >= ARC_STEP_TIME_CUT)}), actor peak {drop:.2f} GiB lower (target "
            f"{ARC_PEAK_CUT_GIB:g} GiB: {judge(pairing, drop >= ARC_PEAK_CUT_GIB)})"
            + (f"; arms without a complete run: {', '.join(missing)}." if missing else "."))


def util_sweep_section(root: Path = OUTPUTS_DIR) -> list[str]:
    """Notebook 06's measured points (``outputs/06_util_sweep/<case>-u<util>/``) and the answer they give."""
    from rlkit.experiments import util_sweep

    folder = root / util_sweep.NOTEBOOK
    # the sweep's points (util_sweep.point_folders, as notebook 06 reads them) that git tracks
    committed = {p.name for p in committed_runs(folder)}
    runs = [r for r in util_sweep.read_results(folder)["runs"] if r.get("measured") and r["tag"] in committed] \
        if committed else []
    return util_sweep.answer_lines(runs) if runs else [f"*{util_sweep.NOTEBOOK}: no committed GPU results yet.*"]


def standin_table(root: Path = OUTPUTS_DIR) -> list[str]:
    """docs/results.md's history: the seed's arms at the stand-in shape (the h200 profile on two GPUs, before the
    seed's own workload ran), in a few columns, then :func:`arc_summary`."""
    from rlkit.experiments.grpo_runs import outcome
    from rlkit.recipes.grpo import ARMS

    loaded, commits = committed_arms(root)
    arms = {name: m for name, m in loaded.items() if name in ARMS}
    if not arms:
        return ["*05_grpo_qwen3_4b: no committed GPU results yet.*"]
    r = next(iter(arms.values()))["recipe"]
    lines = [f"**History: the seed's arc at the stand-in shape, before the seed's own workload ran: verl 0.9.1 + vLLM "
             f"0.24 GRPO, Qwen3-4B (random init), 2 x H200 each emulating a {r['emulate_gpu_gib']:g} GiB card** "
             f"({r['train_batch_size']} x {r['rollout_n']}, prompt {r['max_prompt_length']}, responses and tokens per "
             "micro-batch as each row says, one run per arm, arms from several commits; means over steps 2..; "
             "`outputs/05_grpo_qwen3_4b/<arm>/metrics.json`):", "",
             "| arm | response, tokens/micro-batch | outcome | step (s) | actor peak alloc. (GiB) | tokens/s/GPU |",
             "|---|---|---|---|---|---|"]
    for name in ARMS:
        m = arms.get(name)
        if m is None:
            lines.append(f"| {name} | - | no committed run | - | - | - |")
            continue
        s = m.get("summary") or {}
        lines.append(f"| {name} | {m['recipe']['max_response_length']}, {m['recipe']['ppo_max_token_len_per_gpu']} | "
                     f"{outcome(m)} | {fmt(s.get('step_s'))} | {fmt(s.get('actor_max_allocated_gib'), '.2f')} | "
                     f"{fmt(s.get('throughput_tok_s_per_gpu'), '.0f')} |")
    return lines + ["", arc_summary(arms, commits)]


def reruns_section(root: Path = OUTPUTS_DIR) -> list[str]:
    """Lab notes: each arm next to its runs from earlier device sessions (``<arm>.session<N>``), in the columns
    the notes discuss (update time, HostAdamW threads, actor peak), and the bound on the first working arm."""
    from rlkit.recipes.grpo import ARMS

    loaded, commits = committed_arms(root, reruns=True)
    rows = [name for arm in ARMS if any(n.startswith(f"{arm}.session") for n in loaded)
            for name in sorted(n for n in loaded if n == arm or n.startswith(f"{arm}.session"))]
    if not rows:
        return ["*05_grpo_qwen3_4b: no committed re-runs yet.*"]
    lines = ["**Arms measured in more than one device session** (`outputs/05_grpo_qwen3_4b/<run>/metrics.json`; "
             "means over steps 2..; `host threads` / `torch threads`: HostAdamW's thread count for its step and torch's "
             "in verl's worker, `-` where the run predates the field):", "",
             "| run | commit | step (s) | update_actor (s) | optimizer step (s) | host threads | torch threads | "
             "actor peak alloc. (GiB) |", "|---|---|---|---|---|---|---|---|"]
    for name in rows:
        s = loaded[name].get("summary") or {}
        lines.append(f"| {name} | {commits[name]} | {fmt(s.get('step_s'))} | {fmt(s.get('update_actor_s'))} | "
                     f"{fmt(s.get('optimizer_step_s'), '.2f')} | {fmt(s.get('host_threads'), 'd')} | "
                     f"{fmt(s.get('torch_threads'), 'd')} | {fmt(s.get('actor_max_allocated_gib'), '.2f')} |")
    base, full = loaded.get(FIRST_WORKING_ARM), loaded.get(list(ARMS)[-1])
    b = (base or {}).get("summary") or {}
    if full and b.get("optimizer_step_s") is not None:
        floor, f = b["step_s"] - b["optimizer_step_s"], full["summary"]["step_s"]
        lines += ["", f"A bound for the arc's baseline: {FIRST_WORKING_ARM}'s optimizer step took "
                  f"{b['optimizer_step_s']:.1f} s (`optimizer_step_s`); with no optimizer time at all its step would be "
                  f"{floor:.1f} s, and {list(ARMS)[-1]}'s {f:.1f} s would still be {1 - f / floor:.1%} shorter."]
    return lines


def results_section(root: Path = OUTPUTS_DIR) -> list[str]:
    """docs/results.md: every notebook's committed GPU results."""
    lines = []
    for notebook, section in SECTIONS:
        metrics = load_committed(notebook, root=root)
        lines += (section(metrics) if metrics else [f"*{notebook}: no committed GPU results yet.*"]) + [""]
    return lines + grpo_arms_section(root) + [""] + util_sweep_section(root)


# Each generated block: its name (the markers' word) and what makes its lines; and where each block goes.
BLOCKS = {"arc": seed_arc_table, "arcplanner": arc_planner_section, "standin": standin_table, "results": results_section, "seed": seed_workload_section, "limits": limits_section,
          "targets": speed_targets_section, "steptarget": step_target_section, "profile": update_profile_section, "determinism": determinism_section, "reruns": reruns_section,
          "learning": learning_section}
DOCS = {"README.md": ("arc",), "docs/results.md": ("standin", "results", "seed", "arcplanner", "limits", "targets", "steptarget", "profile", "determinism", "learning"),
        "docs/lab-notes.md": ("reruns",)}


def markers(name: str) -> tuple[str, str]:
    return (f"<!-- {name}:begin (generated by `python -m rlkit.report --write`; do not edit) -->",
            f"<!-- {name}:end -->")


def block(name: str, root: Path = OUTPUTS_DIR) -> str:
    """Block ``name`` between its markers, a blank line inside each."""
    begin, end = markers(name)
    return "\n".join([begin, "", *BLOCKS[name](root), "", end])


def results_block(root: Path = OUTPUTS_DIR) -> str:
    return block("results", root)


def replace_block(text: str, name: str, new: str) -> str:
    """``text`` with its block ``name`` (markers included) replaced by ``new``; an error if it has none."""
    begin, end = markers(name)
    if text.count(begin) != 1 or end not in text.split(begin, 1)[1]:
        raise ValueError(f"expected one {name!r} block; add the lines {begin!r} and {end!r} where it goes")
    head, rest = text.split(begin, 1)
    return head + new + rest.split(end, 1)[1]


def regenerate(doc: str, text: str, root: Path = OUTPUTS_DIR) -> str:
    """``text`` of ``doc`` (a key of DOCS) with each of its blocks generated again."""
    for name in DOCS[doc]:
        text = replace_block(text, name, block(name, root))
    return text


def stale(docs: dict[str, tuple[str, ...]] = DOCS, base: Path = REPO_ROOT, root: Path = OUTPUTS_DIR) -> list[str]:
    """The docs whose generated blocks differ from what the committed results give."""
    return [doc for doc in docs if (base / doc).read_text() != regenerate(doc, (base / doc).read_text(), root)]


def main(argv: list[str] | None = None) -> int:
    from rlkit.core.results import NotACheckout

    parser = argparse.ArgumentParser(prog="python -m rlkit.report", description=__doc__.split("\n\n")[0])
    parser.add_argument("--write", nargs="*", metavar="DOC", default=None,
                        help=f"rewrite the generated blocks of these files (default: all of {', '.join(DOCS)})")
    parser.add_argument("--check", action="store_true", help="exit 1 if a doc's blocks disagree with the results")
    parser.add_argument("--block", choices=sorted(BLOCKS), help="print one block (default: the results block)")
    ns = parser.parse_args(argv)
    try:
        if ns.check:
            bad = stale()
            for doc in bad:
                print(f"{doc}: generated blocks are stale; run `python -m rlkit.report --write`", file=sys.stderr)
            return 1 if bad else 0
        if ns.write is None:
            print(block(ns.block or "results"))
            return 0
        for doc in ns.write or list(DOCS):
            path = Path(doc).resolve()
            key = path.relative_to(REPO_ROOT).as_posix() if path.is_relative_to(REPO_ROOT) else doc
            if key not in DOCS:
                parser.error(f"{doc} has no generated blocks; the docs that do: {', '.join(DOCS)}")
            path = REPO_ROOT / key
            path.write_text(regenerate(key, path.read_text()))
    except NotACheckout as err:
        print(f"python -m rlkit.report: {err}", file=sys.stderr)
        return 2
    return 0
