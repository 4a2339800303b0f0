"""The generated blocks of README.md and docs/*.md, assembled from committed results.

Every number in those blocks comes from files git tracks under ``outputs/`` (a local run, such as the
``tiny/`` folders ``make demo`` writes, is never read). ``python -m rlkit.report --write`` rewrites each block
between its markers in every file of ``DOCS``; ``python -m rlkit.report --check`` exits 1 naming the files whose
blocks disagree with the committed metrics, and so does a test. The single-notebook sections (01-04, 07 and the
deterministic reruns) are :mod:`rlkit.report_notebooks`', the update profiles :mod:`rlkit.report_profile`'; the limits
and issue 24's targets :mod:`rlkit.report_limits`'; this module has notebook 05's arms and the seed workload, and
writes the blocks.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from rlkit.env import REPO_ROOT
from rlkit.like_for_like import ATTENTION_PATH, judge, pair
from rlkit.report_arc import (ARC_PEAK_CUT_GIB, ARC_STEP_TIME_CUT, FIRST_WORKING_ARM, arc_planner_section,
                              planner_cell, seed_arc_table)
from rlkit.report_limits import limits_section, speed_targets_section
from rlkit.report_notebooks import SECTIONS, SEED_PREFIX, committed_arms, determinism_section, learning_section, load_committed
from rlkit.report_profile import update_profile_section
from rlkit.results import OUTPUTS_DIR, committed_runs, fmt




def grpo_arms_section(root: Path = OUTPUTS_DIR) -> list[str]:
    """The verl + vLLM arms of notebook 05 (one folder per arm, named after rlkit.grpo.ARMS)."""
    from rlkit.grpo import outcome, planner_check
    from rlkit.recipe import ARMS
    from rlkit.verl_logs import training_steps

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
    lines += ["", "`planner`: `rlkit.budget` for the arm's exact overrides: the actor's largest total and its ratio to the "
              "measured peak, the OOM it predicts, or the free memory it leaves vLLM at start-up against vLLM's reading.",
              "", "`device peak used`: NVML's 1 Hz reading of the whole GPU (the actor, the sleeping vLLM engine, every CUDA "
              "context), highest GPU. The emulation caps each process at the card, not their sum (`rlkit.emulate_card`): "
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
    from rlkit.grpo import outcome
    from rlkit.recipe import ARMS

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
    from rlkit.grpo import outcome
    from rlkit.recipe import ARMS

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
    from rlkit.recipe import ARMS

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


def seed_workload_section(root: Path = OUTPUTS_DIR) -> list[str]:
    """Notebook 05's arms at the seed's own workload (``outputs/05_grpo_qwen3_4b/h200-seed-<arm>[-<variant>][.session<N>...]/``)."""
    from rlkit.grpo import outcome, planner_check
    from rlkit.verl_logs import training_steps

    loaded, commits = committed_arms(root, prefix=SEED_PREFIX, reruns=True)
    if not loaded:
        return ["*05_grpo_qwen3_4b: no committed runs of the seed's workload yet.*"]
    first = next(iter(loaded.values()))["recipe"]
    means: dict[int, list[str]] = {}
    for name, m in loaded.items():
        means.setdefault(m["recipe"]["response_length_mean"], []).append(commits[name])
    length_means = " or ".join(f"{mean} ({', '.join(sorted(set(c)))})" for mean, c in sorted(means.items()))
    header = ("| run | commit | GPU | attention | logits | tokens/micro-batch | lr | outcome | steps | response mean (min-max) | "
              "step (s) | gen | old_log_prob | update_actor | tokens/s/GPU | actor peak alloc. / reserved (GiB) | "
              "device peak used (GiB) | host peak over idle (GiB) | planner |")
    lines = [f"**The seed's workload** (profile `h200-seed` as of each run's commit: prompt <= {first['max_prompt_length']}, response <= "
             f"{first['max_response_length']} with SYNTHETIC lengths, `rlkit.length_model` mean {length_means} by commit; "
             f"{first['train_batch_size']} x {first['rollout_n']} on {first['n_gpus']} GPU (the `GPU` column, from each run's env.json) emulating a "
             f"{first['emulate_gpu_gib']:g} GiB card; means over steps 2.., step 1 where it is the only one; "
             "`outputs/05_grpo_qwen3_4b/<run>/metrics.json`):", "", header, "|" + "---|" * (header.count("|") - 1)]
    for name, m in loaded.items():
        r, s = m["recipe"], m.get("summary") or {}
        attention = f"{r.get('attn_implementation', 'sdpa')}, {'unpadded' if r.get('use_remove_padding') else 'padded'}"
        lines.append(f"| {name} | {commits[name]} | {short_gpu(m.get('gpu'))} | {attention} | {r.get('logits', 'full')} | "
                     f"{r['ppo_max_token_len_per_gpu']:,} | {r['lr']:g} | {outcome(m)} | "
                     f"{len(training_steps(m.get('steps', [])))} | {fmt(s.get('response_length_mean'), '.0f')} "
                     f"({fmt(s.get('response_length_min'), '.0f')}-{fmt(s.get('response_length_max'), '.0f')}) | "
                     f"{fmt(s.get('step_s'))} | {fmt(s.get('gen_s'))} | {fmt(s.get('old_log_prob_s'))} | "
                     f"{fmt(s.get('update_actor_s'))} | {fmt(s.get('throughput_tok_s_per_gpu'), '.0f')} | "
                     f"{fmt(s.get('actor_max_allocated_gib'), '.2f')} / {fmt(s.get('actor_max_reserved_gib'), '.2f')} | "
                     f"{fmt(max(s['gpu_peak_used_gib']) if s.get('gpu_peak_used_gib') else None, '.2f')} | "
                     f"{fmt(s.get('host_peak_above_baseline_gib'), '.1f')} | {planner_cell(planner_check(m))} |")
    lines += _variant_lines(loaded, commits) + _same_sample_lines(loaded, commits) + _length_band_lines(loaded)
    drift = "; ".join(f"{name}: " + " -> ".join(fmt(step.get("response_length/mean"), ".0f")
                                               for step in training_steps(m.get("steps", [])))
                      for name, m in loaded.items() if training_steps(m.get("steps", [])))
    return lines + ["", f"Response-length mean per step ({drift}). The random-init model's responses end on EOS after a "
                    "geometric number of tokens whose rate lives in the weights; with a noise reward (`synthetic_hash`) "
                    "the updates move it differently in each run, so runs that start alike drift apart. Step times of runs "
                    "with different response means are not comparable; tokens/s/GPU is closer to it. The profile now runs at lr 0 "
                    "for that reason (`nbs/params/05_grpo_qwen3_4b.h200-seed.yaml` says why)."]


def short_gpu(name: str | None) -> str:
    """'NVIDIA H100 80GB HBM3' -> 'H100': the model a table's GPU column names ('-' where none is recorded)."""
    return name.removeprefix("NVIDIA ").split()[0] if name else "-"


# issue 23: the seed workload's response-length mean, as a fraction of max_response_length
LENGTH_BAND = (0.25, 0.60)


def _length_band_lines(loaded: dict[str, dict]) -> list[str]:
    """Each run's response-length mean (steps 2.., step 1 where it is the only one) against issue 23's band."""
    inside, outside = [], []
    for name, m in loaded.items():
        mean = (m.get("summary") or {}).get("response_length_mean")
        if mean is None:
            continue
        share = mean / m["recipe"]["max_response_length"]
        (inside if LENGTH_BAND[0] <= share <= LENGTH_BAND[1] else outside).append(f"{name} {share:.0%}")
    if not inside and not outside:
        return []
    return ["", f"Response-length mean against the band issue 23 asks for ({LENGTH_BAND[0]:.0%}-{LENGTH_BAND[1]:.0%} of "
            f"the maximum): inside: {', '.join(inside) or 'none'}; outside: {', '.join(outside) or 'none'}."]


def _update_tokens_per_s(steps: list[dict]) -> float | None:
    """Tokens the update processed per second of update_actor over ``steps`` (those that logged both)."""
    steps = [s for s in steps if s.get("perf/total_num_tokens") and s.get("timing_s/update_actor")]
    if not steps:
        return None
    return sum(s["perf/total_num_tokens"] for s in steps) / sum(s["timing_s/update_actor"] for s in steps)


def update_tokens_per_s(metrics: dict) -> float | None:
    """Tokens the update processed per second of update_actor over a run's averaged steps (steps 2..)."""
    from rlkit.verl_logs import averaged_steps

    return _update_tokens_per_s(averaged_steps(metrics.get("steps", [])))


# issue 23: the remove-padding arm's update_actor at least this many times the padded arm's tokens per second
REMOVE_PADDING_SPEEDUP_TARGET = 1.3
# step 1 of two runs sampled the same workload when their token counts differ by at most this fraction (vLLM's
# sampling is not bit-reproducible across launches, so the same prompts and model give nearly, not exactly, the same)
SAME_SAMPLE_TOLERANCE = 0.001


def _varied_run(name: str, loaded: dict[str, dict]) -> str | None:
    """The run ``<run>-<variant>`` varies: the longest other name it extends with a '-'."""
    return max((b for b in loaded if name.startswith(b + "-")), key=len, default=None)


# a padded variant differs from its unpadded base in the attention path by design, and in the tokens per micro-batch
# where the planner fits only fewer padded (its line says so)
PADDING_VARIES = (*ATTENTION_PATH, "ppo_max_token_len_per_gpu")


def _is_padding_pair(variant: dict, base: dict) -> bool:
    return not variant["recipe"].get("use_remove_padding") and bool(base["recipe"].get("use_remove_padding"))


def _padding_target(variant: dict, base: dict, ratio: float | None, pairing) -> str:
    """For a padded variant of an unpadded run, whether the base's update speed meets the 1.3x target, judged only
    on a like-for-like pair (:mod:`rlkit.like_for_like`)."""
    if ratio is None or not _is_padding_pair(variant, base):
        return ""
    return (f" Remove-padding target {REMOVE_PADDING_SPEEDUP_TARGET}x: "
            f"{judge(pairing, ratio >= REMOVE_PADDING_SPEEDUP_TARGET)} ({pairing.basis}).")


def _variant_lines(loaded: dict[str, dict], commits: dict[str, str]) -> list[str]:
    """Each run named ``<run>-<variant>`` (e.g. ``-padded``: padded SDPA; ``-overlap``: HostAdamW's overlapped
    copies) against the run it varies: update tokens/s and step time, each side's own measurement."""
    from rlkit.grpo import outcome
    from rlkit.verl_logs import training_steps

    out = []
    for name, m in loaded.items():
        base = _varied_run(name, loaded)
        if base is None:
            continue
        if not training_steps(m.get("steps", [])):
            out.append(f"- `{name}` against `{base}`: {outcome(m)}, no step to compare.")
            continue
        ours, theirs = update_tokens_per_s(m), update_tokens_per_s(loaded[base])
        step, base_step = (m.get("summary") or {}).get("step_s"), (loaded[base].get("summary") or {}).get("step_s")
        ratio = theirs / ours if ours and theirs else None
        change = f"{step / base_step - 1:+.0%}" if step and base_step else "-"
        varies = PADDING_VARIES if _is_padding_pair(m, loaded[base]) else ()
        pairing = pair(m, loaded[base], commits[name], commits[base], varies=varies)
        out.append(f"- `{name}` against `{base}`: update_actor {fmt(ours, '.0f')} against {fmt(theirs, '.0f')} tokens/s "
                   f"(`{base}` {f'{ratio:.2f}x' if ratio else '-'} the variant's), step {fmt(step)} against {fmt(base_step)} s ({change})."
                   + ("" if pairing.like or varies else f" {pairing.basis[0].upper()}{pairing.basis[1:]}.")
                   + _padding_target(m, loaded[base], ratio, pairing) + _planner_at_base_tokens(m, loaded[base]))
    return ["", "Variants against the run they vary (update tokens per second of update_actor, steps 2..):", *out] \
        if out else []


def _planner_at_base_tokens(variant: dict, base: dict) -> str:
    """For a variant run at fewer tokens per micro-batch than its base: the planner's verdict for the variant's own
    overrides at the base's tokens (why the variant runs smaller)."""
    from rlkit.grpo import planner_for_run

    key, field = "actor_rollout_ref.actor.ppo_max_token_len_per_gpu", "ppo_max_token_len_per_gpu"
    tokens = base["recipe"][field]
    if variant["recipe"][field] >= tokens:
        return ""
    at_base = {**variant, "recipe": {**variant["recipe"], field: tokens},
               "overrides": [f"{key}={tokens}" if o.startswith(key + "=") else o for o in variant["overrides"]]}
    planned = planner_for_run(at_base)
    return f" The planner for the variant at {tokens:,} tokens: {planned[2].verdict} ({planned[2].reason})." if planned else ""


def _first_step(metrics: dict) -> tuple[dict, float] | None:
    """A run's step 1 and its update tokens per second (None without them)."""
    from rlkit.verl_logs import training_steps

    first = training_steps(metrics.get("steps", []))[:1]
    speed = _update_tokens_per_s(first)
    return (first[0], speed) if speed else None


def _same_sample_lines(loaded: dict[str, dict], commits: dict[str, str]) -> list[str]:
    """Step 1 of each variant against step 1 of every run of the arm it varies (its reruns included) that sampled
    the same workload. Step 1's rollout comes before any update, so the lr does not enter it; that the two runs
    processed the same tokens (within SAME_SAMPLE_TOLERANCE) is the check that their prompts, model and lengths were
    the same. Step 1 carries the one-off start-up of each phase on both sides."""
    out = []
    for name, m in loaded.items():
        base, first = _varied_run(name, loaded), _first_step(m)
        if base is None or first is None:
            continue
        ours, our_speed = first
        for other in (n for n in loaded if n == base or n.startswith(base + ".session")):
            if (found := _first_step(loaded[other])) is None:
                continue
            theirs, their_speed = found
            tokens = ours["perf/total_num_tokens"], theirs["perf/total_num_tokens"]
            if abs(tokens[0] / tokens[1] - 1) > SAME_SAMPLE_TOLERANCE:
                continue
            ratio = their_speed / our_speed
            out.append(f"- `{name}` against `{other}` ({tokens[0]:,.0f} and {tokens[1]:,.0f} tokens, response mean "
                       f"{ours['response_length/mean']:.0f} and {theirs['response_length/mean']:.0f}): update_actor "
                       f"{our_speed:.0f} against {their_speed:.0f} tokens/s (`{other}` {ratio:.2f}x the variant's), "
                       f"old_log_prob {ours['timing_s/old_log_prob']:.1f} against {theirs['timing_s/old_log_prob']:.1f} s, "
                       f"step {ours['timing_s/step']:.1f} against {theirs['timing_s/step']:.1f} s."
                       + _padding_target(m, loaded[other], ratio, pair(
                           m, loaded[other], commits[name], commits[other], step1=True,
                           varies=PADDING_VARIES if _is_padding_pair(m, loaded[other]) else ())))
    return ["", "Step 1 of the same sampled workload (the runs' tokens agree within "
            f"{SAME_SAMPLE_TOLERANCE:.1%}; step 1 includes each phase's one-off start-up on both sides):", *out] if out else []


def results_section(root: Path = OUTPUTS_DIR) -> list[str]:
    """docs/results.md: every notebook's committed GPU results."""
    lines = []
    for notebook, section in SECTIONS:
        metrics = load_committed(notebook, root=root)
        lines += (section(metrics) if metrics else [f"*{notebook}: no committed GPU results yet.*"]) + [""]
    return lines + grpo_arms_section(root) + [""] + util_sweep_section(root)


# Each generated block: its name (the markers' word) and what makes its lines; and where each block goes.
BLOCKS = {"arc": seed_arc_table, "arcplanner": arc_planner_section, "standin": standin_table, "results": results_section, "seed": seed_workload_section, "limits": limits_section,
          "targets": speed_targets_section, "profile": update_profile_section, "determinism": determinism_section, "reruns": reruns_section,
          "learning": learning_section}
DOCS = {"README.md": ("arc",), "docs/results.md": ("standin", "results", "seed", "arcplanner", "limits", "targets", "profile", "determinism", "learning"),
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
    from rlkit.results import NotACheckout

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


if __name__ == "__main__":
    sys.exit(main())
