"""Notebook 07's findings in words (:func:`describe`), every number taken from its ``metrics.json``.

Results from before issue 46 (one compared run of arm 5, a fixed ``noise_floor``, no rising/plateau split) are read
as they are and said to be so; the figures and the explorer are :mod:`rlkit.viz.learning`.
"""
from __future__ import annotations

from typing import Any

from rlkit.analysis.learning_curves import ENTROPY_COLLAPSE, compared_runs


def _f(value, spec: str = ".3f") -> str:
    return "-" if value is None else format(value, spec)


def _of(counts: dict[str, int] | None, key: str) -> str:
    return f"{counts[key]} of {counts['steps']}" if counts else "-"


_NUMBER = {1: "one", 2: "two", 3: "three", 4: "four", 8: "eight"}


def gpus_per_run(cfg: dict[str, Any]) -> int:
    """The config's ``n_gpus``; results from before the field ran on one GPU (every run's recipe had ``n_gpus`` 1, as
    its ``metrics.json`` records)."""
    return cfg.get("n_gpus", 1)


def where_runs(cfg: dict[str, Any]) -> str:
    """Where each run ran: "one GPU", or e.g. "two ranks (one GPU each)"."""
    n = gpus_per_run(cfg)
    return "one GPU" if n == 1 else f"{_NUMBER.get(n, n)} ranks (one GPU each)"


def shared_gpus(cfg: dict[str, Any]) -> str:
    """The GPUs the side-by-side runs shared: "one GPU" or e.g. "two GPUs"."""
    n = gpus_per_run(cfg)
    return f"{_NUMBER.get(n, n)} GPU{'s' if n > 1 else ''}"


def describe(metrics: dict[str, Any]) -> str:
    """What the experiment found, in words, every number taken from ``metrics``."""
    lines = _setup_lines(metrics)
    cfg = metrics["config"]
    if not metrics["launched"]:
        lines.append(f"No run was launched: {metrics['launch_reason']}")
        return "\n".join(lines)
    if metrics["pending"]:
        lines.append(f"Not run yet (launch_limit {cfg['launch_limit']}): {', '.join(metrics['pending'])}; run the same "
                     "command again to add them.")
    lines += _learned_lines(metrics["analysis"]) + _noise_lines(metrics["analysis"])
    for comp in compared_runs(metrics["analysis"]).values():
        lines += _compared_lines(metrics["analysis"], comp)
    lines += _collapse_lines(metrics)
    mfu = [r["update_actor_mfu"] for r in metrics["runs"].values() if r.get("update_actor_mfu") is not None]
    if mfu:
        lines.append(f"Speed is not what this measures: the runs shared {shared_gpus(cfg)}, and a model this small leaves "
                     f"{'it' if gpus_per_run(cfg) == 1 else 'them'} idle "
                     f"(update_actor at {min(mfu):.2%}-{max(mfu):.2%} of the GPU's dense bf16 peak, rlkit.planning.roofline).")
    v = metrics["analysis"]["verdict"]
    rising = [f"{name} at {c['per_step']['rising']['in_range']} of {c['per_step']['rising']['steps']}"
              for name, c in compared_runs(metrics["analysis"]).items() if (c["per_step"] or {}).get("rising")]
    lines.append("Result: " + ("every run learns and each compared run's curve is within the run-to-run noise of the "
                               "baseline's, in the mean and at every step: the compared variant does not change what "
                               "GRPO learns here." if v["passed"] else
                               f"not shown (every run learns: {v['all_learned']}; compared runs within the noise: "
                               f"{v['compare_within_noise']}; at every step: {v['compare_every_step_within_band']}; "
                               f"compared spread within the noise: {v.get('compare_spread_within_noise')}).")
                 + (f" The band decides; beside it, the literal count in the rising part: inside the baseline runs' "
                    f"range {', '.join(rising)} steps." if rising else ""))
    return "\n".join(lines)


def _setup_lines(metrics: dict[str, Any]) -> list[str]:
    """The task, the plan, the compared variant and the untrained model's reward spread."""
    cfg, task, synthetic = metrics["config"], metrics["task"], metrics["synthetic"]
    model = metrics["model"]
    lines = [
        (f"Task: {'synthetic ' if synthetic['task'] else ''}{task['reward']} on {metrics['data']['rows']} "
         f"{metrics['data']['source']} rows" + (f" (target sets {task['target_sets']}, each derived from its prompt in "
                                               f"{task['rows_set_from_prompt']} of {task['rows']} rows)"
                                               if task.get("target_sets") else "") +
         f"; model {cfg['model']} ({'random-init' if synthetic['model'] else 'real weights'}"
         + (f", {model['parameters']:,} parameters" if model.get("parameters") else "") + ")."),
        (f"Plan: {', '.join(p['run'] for p in metrics['plan'])}; {cfg['steps']} steps each on {where_runs(cfg)}, "
         f"{cfg['train_batch_size']} "
         f"prompts x {cfg['rollout_n']}, {cfg['max_response_length']}-token responses, lr {cfg['lr']:g}, seed "
         f"{cfg['model_seed']}."),
    ]
    if "compare_name" in cfg:
        levers = ", ".join(f"{k}={v}" for k, v in cfg["compare_overrides"].items()) or "nothing"
        lines.append(f"Compared variant {cfg['compare_name']}: arm {cfg['compare_arm']} with {levers} on top; both sides "
                     f"run attn_implementation={cfg['attn_implementation']}, use_remove_padding={cfg['use_remove_padding']}.")
    probe = metrics.get("probe")
    if probe and probe["groups"]:
        spreads = ", ".join(format(g["std"], ".3f") for g in probe["groups"])
        lines.append(f"Untrained model, {probe['samples_per_group']} samples of {probe['max_tokens']} tokens per prompt on "
                     f"the CPU: mean reward {probe['mean']:.3f}; spread within each group (std) {spreads}.")
    return lines


def _learned_lines(a: dict[str, Any]) -> list[str]:
    return [f"{name}: reward {_f(r['reward_first'])} over the first {a['criteria']['window']} steps, "
            f"{_f(r['reward_last'])} over the last (gain {_f(r['gain'], '+.3f')}): "
            f"{'learns' if r['learned'] else 'does NOT learn'} (bar: gain >= {a['criteria']['min_gain']:g})."
            for name, r in a["per_run"].items()]


def _noise_lines(a: dict[str, Any]) -> list[str]:
    """Both sides' spreads, the band's floor and where the baseline's reward stops rising."""
    noise, crit, lines = a["noise"], a["criteria"], []
    if noise["curve_distance"] is None:
        return lines
    lines.append(f"Run-to-run noise ({len(noise['pairs'])} pair(s) of {crit['baseline_arm']} runs): mean |reward "
                 f"difference| per step {noise['curve_distance']:.4f}, last-window spread "
                 f"{_f(noise['last_window_spread'], '.4f')}.")
    if crit["noise_floor"] is None:
        lines.append(f"The band's floor is measured, not chosen: the baseline runs' mean range per step, "
                     f"{_f(noise['floor'], '.4f')}.")
    else:
        lines.append(f"The band's floor is a fixed {crit['noise_floor']:g}, not a measurement (results from before issue "
                     f"46){'' if noise.get('mean_range') is None else ', against a measured mean range per step of ' + format(noise['mean_range'], '.4f')}.")
    spread = a.get("compare_spread")
    if spread:
        lines.append(f"Compared side's own spread ({len(spread['pairs'])} pair(s) of {crit['compare_arm']} runs): "
                     f"{_f(spread['curve_distance'], '.4f')} per step, last-window spread "
                     f"{_f(spread['last_window_spread'], '.4f')}: "
                     f"{'within' if a['verdict']['compare_spread_within_noise'] else 'OUTSIDE'} the threshold.")
    else:
        lines.append("One compared run: no compared spread.")
    rising = a.get("rising")
    if rising:
        lines.append(f"The baseline's mean reward rises from {rising['first']:.3f} to {rising['final']:.3f} and first "
                     f"reaches {rising['share']:.0%} of that rise ({rising['target']:.3f}) at step "
                     f"{rising['plateau_from']}: steps 1-{rising['plateau_from'] - 1} are the rising part "
                     f"({rising['rising_steps']} steps), the rest the plateau, counted apart.")
    elif "rising" not in a:
        lines.append("These results split no rising part from the plateau (from before issue 46): the step counts "
                     "below include the plateau.")
    return lines


def _compared_lines(a: dict[str, Any], comp: dict[str, Any]) -> list[str]:
    """One compared run against the baseline runs: in the mean, then the literal in-range count beside the band."""
    crit = a["criteria"]
    floor = "measured floor" if crit["noise_floor"] is None else f"floor {crit['noise_floor']:g}"
    lines = [(f"{comp['run']} against the baseline runs: mean |reward difference| per step {_f(comp['mean_distance'], '.4f')}"
             f" (threshold {comp['threshold']:.4f} = max({crit['noise_factor']:g} x noise, {floor})): "
             f"{'within' if comp['within_noise'] else 'OUTSIDE'} the noise; last-window reward "
             f"{_f(comp['last_window_difference'], '+.4f')} against the baseline mean.")]
    steps = comp["per_step"]
    if steps:
        expected = steps.get("expected_in_range", 1 / 3)
        split = (f" (rising part: inside at {_of(steps['rising'], 'in_range')}, band at {_of(steps['rising'], 'within_band')};"
                 f" plateau: inside at {_of(steps['plateau'], 'in_range')}, band at {_of(steps['plateau'], 'within_band')})"
                 if "rising" in steps else "")
        worst = steps["worst"]
        lines.append(f"Step by step: {comp['run']} lies inside the baseline runs' [lowest, highest] range at "
                     f"{steps['in_range']} of {steps['steps']} steps (a further baseline run would at about "
                     f"{expected:.0%} of them) and within max({crit['noise_factor']:g} x their range, {floor}) of their "
                     f"mean at {steps['within_band']} of {steps['steps']}{split}; the closest call is step "
                     f"{worst['step']} ({worst['difference']:+.4f} against a band of {worst['band']:.4f}).")
    return lines


def _collapse_lines(metrics: dict[str, Any]) -> list[str]:
    """Where the entropy collapsed, and the comparison over the steps before it."""
    a, lines = metrics["analysis"], []
    collapsed = {n: r["entropy_collapsed_at"] for n, r in a["per_run"].items() if r["entropy_collapsed_at"]}
    if collapsed:
        lines.append(f"Entropy collapse (at most {ENTROPY_COLLAPSE:.0%} of step 1's): "
                     + ", ".join(f"{n} from step {s}" for n, s in collapsed.items())
                     + ". After it each prompt's samples are nearly identical, the group advantages and the updates "
                       "vanish, and the curves' agreement says little: the steps before it carry the comparison.")
    before = metrics.get("analysis_before_collapse")
    for b in compared_runs(before).values() if before else []:
        steps = b["per_step"] or {}
        lines.append(f"Before the first collapse (steps 1-{before['last_step']}), the same analysis: noise "
                     f"{_f(before['noise']['curve_distance'], '.4f')}, {b['run']} at {_f(b['mean_distance'], '.4f')} "
                     f"(threshold {b['threshold']:.4f}), inside the baseline runs' range at {steps.get('in_range', '-')} "
                     f"and within the band at {steps.get('within_band', '-')} of {steps.get('steps', '-')} steps: "
                     f"{'passed' if before['verdict']['passed'] else 'not passed'}.")
    return lines
