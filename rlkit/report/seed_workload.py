"""The seed's own workload (notebook 05, profile ``h200-seed``): its block of docs/results.md.

Every run at the seed workload (``outputs/05_grpo_qwen3_4b/h200-seed-<arm>[-<variant>][.session<N>...]/``) in one
table; each variant (``<run>-<variant>``) against the run it varies, over steps 2.. and on step 1 of the same sampled
workload, with issue 23's remove-padding target judged only on a like-for-like pair; each run's response-length mean
against issue 23's band. :mod:`rlkit.report.sections` places the block.
"""
from __future__ import annotations

from pathlib import Path

from rlkit.analysis.like_for_like import ATTENTION_PATH, judge, pair
from rlkit.core.env import short_gpu
from rlkit.core.results import OUTPUTS_DIR, fmt
from rlkit.report.arc import planner_cell
from rlkit.report.notebooks import SEED_PREFIX, committed_arms


def seed_workload_section(root: Path = OUTPUTS_DIR) -> list[str]:
    """Notebook 05's arms at the seed's own workload (``outputs/05_grpo_qwen3_4b/h200-seed-<arm>[-<variant>][.session<N>...]/``)."""
    from rlkit.experiments.estimates import planner_check
    from rlkit.experiments.grpo_runs import outcome
    from rlkit.verl.logs import training_steps

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
             f"{first['max_response_length']} with SYNTHETIC lengths, `rlkit.models.lengths` mean {length_means} by commit; "
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
    from rlkit.verl.logs import averaged_steps

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
    on a like-for-like pair (:mod:`rlkit.analysis.like_for_like`)."""
    if ratio is None or not _is_padding_pair(variant, base):
        return ""
    return (f" Remove-padding target {REMOVE_PADDING_SPEEDUP_TARGET}x: "
            f"{judge(pairing, ratio >= REMOVE_PADDING_SPEEDUP_TARGET)} ({pairing.basis}).")


def _variant_lines(loaded: dict[str, dict], commits: dict[str, str]) -> list[str]:
    """Each run named ``<run>-<variant>`` (e.g. ``-padded``: padded SDPA; ``-overlap``: HostAdamW's overlapped
    copies) against the run it varies: update tokens/s and step time, each side's own measurement."""
    from rlkit.experiments.grpo_runs import outcome
    from rlkit.verl.logs import training_steps

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
    from rlkit.experiments.estimates import planner_for_run

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
    from rlkit.verl.logs import training_steps

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
