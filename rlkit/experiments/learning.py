"""Notebook 07: does GRPO still learn with the patches? Arm 1 and arm 5 on a task a random-init model can learn.

The task is synthetic and so is the model: :func:`rlkit.models.reward.target_chars` scores the share of a response's
characters that belong to a small target set named in its prompt (rows from :func:`rlkit.models.data.target_rows`),
and ``qwen3-30m`` (:mod:`rlkit.models.qwen`) is a ~31M-parameter random-init Qwen3, so dozens of steps take minutes
on one GPU. The same code runs the task on real DAPO rows (``data``: a DAPO-Math-17k parquet) and real weights
(``model``: a local checkpoint); what it measures is whether a policy moves, not mathematics.

The plan: the baseline arm (``1-fixes-hostadamw``), the compared arm (``5-master-on-host-cast-once``: every usable
patch) and the baseline again (``repeats`` runs of it in all), same seed, data and model, each a GRPO recipe of
:mod:`rlkit.recipes.grpo` run by :func:`rlkit.experiments.grpo.run` (data, model, preflight, verl's config check, the launch when a
GPU is present). verl's per-step records (:func:`rlkit.verl.logs.read_steps`) give the curves of reward, grad_norm,
pg_loss, entropy and response length; :func:`rlkit.analysis.learning_curves.analyze` reads them:

- a run *learns* when the mean reward of its last ``window`` steps exceeds that of its first ``window`` steps
  by at least ``min_gain`` (a flat curve does not);
- the *noise* is the largest curve distance between two baseline runs (mean over common steps of the absolute
  reward difference), and the compared arm is *within the noise* when its mean distance to the baseline runs is
  at most ``noise_factor`` x that noise (or ``noise_floor``, when the repeats happen to agree more closely).

Each run is its own results folder under ``runs_dir`` (:mod:`rlkit.experiments.learning_runs`; written whole or
left ``.failed``); a launched run found there with the same recipe is read back instead of launched again,
``launch_limit`` caps the launches of one invocation, and ``parallel`` runs go side by side on the one GPU (each its
own verl session; a run far from the GPU's limits, as this one is, leaves it mostly idle)::

    python -m rlkit.experiments.learning --profile h200      # the missing runs; the finished ones are read back

Without a GPU everything before the launch runs for real, the reward is exercised on the prepared rows and the
random model's own samples (:func:`reward_examples`, :func:`probe_model`), and the analysis says it has no steps.
"""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from rlkit.analysis.learning_curves import ENTROPY_COLLAPSE, analyze, analyze_before_collapse, curves
from rlkit.core import params as P
from rlkit.experiments import experiment_main
from rlkit.experiments.learning_config import Config
from rlkit.experiments.learning_runs import build_recipe, run_all, run_plan, run_row
from rlkit.models import reward as RW

NOTEBOOK = "07_does_it_learn"


# ----------------------------------------------------------------------------------------------
# the reward on real rows and on the untrained model's own samples


def reward_examples(rows: list[dict[str, Any]], n_rows: int = 3) -> list[dict[str, Any]]:
    """:func:`rlkit.models.reward.target_chars` on hand-made responses to the first ``n_rows`` rows, each with the score
    it must have: only target characters (1), every other character a target (0.5), case and spaces ignored
    (1), the math answer line, nothing (0). ``expected`` None: no fixed value (the answer line)."""
    out = []
    for i, row in enumerate(rows[:n_rows]):
        targets = RW.row_targets(row["extra_info"])
        other = next(c for c in RW.TARGET_ALPHABET if c not in targets)
        cases = [("only targets", targets * 6, 1.0), ("half targets", "".join(t + other for t in targets) * 3, 0.5),
                 ("upper case, spaced", " ".join(targets.upper()) + "\n" + targets, 1.0),
                 ("math answer line", f"Answer: {row['reward_model']['ground_truth']}", None), ("empty", "", 0.0)]
        for case, response, expected in cases:
            score = RW.target_chars(row["data_source"], response, row["reward_model"]["ground_truth"], row["extra_info"])
            out.append({"row": i, "targets": targets, "case": case, "response": response, "score": score["score"],
                        "expected": expected})
    return out


def task_summary(rows: list[dict[str, Any]], reward: str) -> dict[str, Any]:
    """What the task is on these rows: the reward, its alphabet and set size, how many rows carry each set, and
    whether each set is the one :func:`rlkit.models.reward.target_set_of` derives from the row's prompt before the naming line."""
    sets: dict[str, int] = {}
    derived = 0
    for row in rows:
        targets = (row["extra_info"] or {}).get(RW.TARGET_KEY)
        if targets is None:
            continue
        sets[targets] = sets.get(targets, 0) + 1
        content = row["prompt"][0]["content"]
        line = RW.target_instruction(targets)
        original = "\n".join([content[len(line):], *(m["content"] for m in row["prompt"][1:])])
        derived += content.startswith(line) and RW.target_set_of(original) == targets
    return {"reward": reward, "alphabet": RW.TARGET_ALPHABET, "set_size": RW.TARGET_SIZE, "rows": len(rows),
            "target_sets": dict(sorted(sets.items(), key=lambda kv: -kv[1])), "rows_set_from_prompt": derived,
            "instruction_example": RW.target_instruction(next(iter(sets))) if sets else None}


def probe_model(model_dir: str, rows: list[dict[str, Any]], *, groups: int, samples: int, max_tokens: int,
                seed: int = 0) -> dict[str, Any]:
    """Sample ``samples`` responses to each of the first ``groups`` prompts from the untrained checkpoint, on the CPU
    (temperature 1, verl's rollout default), and score them: the reward GRPO sees at step 1 and its spread within a
    group, which is what gives advantages (all-equal scores in a group give none)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    torch.manual_seed(seed)
    out = []
    for row in rows[:groups]:
        ids = tokenizer.apply_chat_template(row["prompt"], add_generation_prompt=True, return_tensors="pt",
                                            return_dict=True)["input_ids"]
        with torch.no_grad():
            gen = model.generate(input_ids=ids.repeat(samples, 1), attention_mask=torch.ones_like(ids).repeat(samples, 1),
                                 do_sample=True, temperature=1.0, top_k=0, top_p=1.0, max_new_tokens=max_tokens,
                                 pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id)
        texts = tokenizer.batch_decode(gen[:, ids.shape[1]:], skip_special_tokens=True)
        scores = [RW.target_chars(row["data_source"], t, row["reward_model"]["ground_truth"], row["extra_info"])["score"]
                  for t in texts]
        mean = sum(scores) / len(scores)
        out.append({"targets": RW.row_targets(row["extra_info"]), "scores": scores, "mean": mean,
                    "std": (sum((s - mean) ** 2 for s in scores) / len(scores)) ** 0.5, "example": texts[0][:120]})
    return {"model": model_dir, "samples_per_group": samples, "max_tokens": max_tokens, "groups": out,
            "mean": sum(g["mean"] for g in out) / len(out) if out else None}


# ----------------------------------------------------------------------------------------------
# the experiment (its runs: rlkit.experiments.learning_runs)


def run(cfg: Config, out_dir: str | Path | None = None) -> dict[str, Any]:
    """The whole experiment; returns ``metrics.json`` content."""
    from rlkit.core.results import notebook_out_dir
    from rlkit.experiments import grpo
    from rlkit.models import data

    out = Path(out_dir) if out_dir else notebook_out_dir(NOTEBOOK)
    first = build_recipe(cfg, cfg.baseline_arm)
    paths, data_info, model_info = grpo.prepare(first)  # every run shares them (same model, seed and data)
    rows = data.read_parquet_rows(paths.train_file)
    targets = cfg.reward == "target_chars"
    probe = None
    if targets and cfg.probe_groups:
        probe = probe_model(paths.model, rows, groups=cfg.probe_groups, samples=cfg.rollout_n,
                            max_tokens=cfg.max_response_length, seed=cfg.model_seed)
    done, pending = run_all(cfg, out)
    steps = {name: e["metrics"].get("steps") or [] for name, e in done.items()}
    rows_by_run = {name: run_row(name, e) for name, e in done.items()}
    launched = any(e["metrics"]["launched"] for e in done.values())
    runs = {n: {"arm": done[n]["arm"], "steps": s} for n, s in steps.items()}
    analysis = analyze(runs, baseline_arm=cfg.baseline_arm, compare_arm=cfg.compare_arm, window=cfg.window,
                       min_gain=cfg.min_gain, noise_factor=cfg.noise_factor, noise_floor=cfg.noise_floor)
    return {
        "config": P.as_dict(cfg),
        "synthetic": {"task": targets and cfg.data == "synthetic", "model": first.random_init},
        "task": task_summary(rows, cfg.reward) if targets else {"reward": cfg.reward},
        "data": data_info,
        "model": model_info,
        "reward_examples": reward_examples(rows) if targets else [],
        "probe": probe,
        "plan": [{"run": name, "arm": arm} for name, arm in run_plan(cfg)],
        "runs": rows_by_run,
        "pending": pending,
        "complete": not pending and all(r["launched"] for r in rows_by_run.values()),
        "launched": launched,
        "launch_reason": next(iter(rows_by_run.values()))["launch_reason"] if rows_by_run else "no run this time",
        "steps": steps,
        "curves": {name: curves(s) for name, s in steps.items()},
        "analysis": analysis,
        "analysis_before_collapse": analyze_before_collapse(runs, analysis),
    }


def read_results(results_dir: str | Path) -> dict[str, Any]:
    """Saved results (``outputs/07_does_it_learn/<tag>/``)."""
    from rlkit.core.results import read_metrics

    return read_metrics(results_dir)


# ----------------------------------------------------------------------------------------------
# in words (the figures and the explorer: rlkit.viz.learning)


def _f(value, spec: str = ".3f") -> str:
    return "-" if value is None else format(value, spec)


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
    lines += _comparison_lines(metrics["analysis"])
    lines += _collapse_lines(metrics)
    mfu = [r["update_actor_mfu"] for r in metrics["runs"].values() if r.get("update_actor_mfu") is not None]
    if mfu:
        lines.append(f"Speed is not what this measures: the runs shared one GPU, and a model this small leaves it idle "
                     f"(update_actor at {min(mfu):.2%}-{max(mfu):.2%} of the GPU's dense bf16 peak, rlkit.planning.roofline).")
    v = metrics["analysis"]["verdict"]
    lines.append("Result: " + ("every run learns and the compared arm's curve is within the run-to-run noise of the "
                               "baseline's, in the mean and at every step: the patches do not change what GRPO learns "
                               "here." if v["passed"] else
                               f"not shown (every run learns: {v['all_learned']}; compared arm within the noise: "
                               f"{v['compare_within_noise']}; at every step: {v['compare_every_step_within_band']})."))
    return "\n".join(lines)


def _setup_lines(metrics: dict[str, Any]) -> list[str]:
    """The task, the plan and the untrained model's reward spread."""
    cfg, task, synthetic = metrics["config"], metrics["task"], metrics["synthetic"]
    model = metrics["model"]
    lines = [
        (f"Task: {'synthetic ' if synthetic['task'] else ''}{task['reward']} on {metrics['data']['rows']} "
         f"{metrics['data']['source']} rows" + (f" (target sets {task['target_sets']}, each derived from its prompt in "
                                               f"{task['rows_set_from_prompt']} of {task['rows']} rows)"
                                               if task.get("target_sets") else "") +
         f"; model {cfg['model']} ({'random-init' if synthetic['model'] else 'real weights'}"
         + (f", {model['parameters']:,} parameters" if model.get("parameters") else "") + ")."),
        (f"Plan: {', '.join(p['run'] for p in metrics['plan'])}; {cfg['steps']} steps each, {cfg['train_batch_size']} "
         f"prompts x {cfg['rollout_n']}, lr {cfg['lr']:g}, seed {cfg['model_seed']}."),
    ]
    probe = metrics.get("probe")
    if probe and probe["groups"]:
        spreads = ", ".join(format(g["std"], ".3f") for g in probe["groups"])
        lines.append(f"Untrained model, {probe['samples_per_group']} samples of {probe['max_tokens']} tokens per prompt on "
                     f"the CPU: mean reward {probe['mean']:.3f}; spread within each group (std) {spreads}.")
    return lines


def _comparison_lines(a: dict[str, Any]) -> list[str]:
    """Whether each run learns, the run-to-run noise, and the compared arm against the baseline runs."""
    lines = []
    for name, r in a["per_run"].items():
        lines.append(f"{name}: reward {_f(r['reward_first'])} over the first {a['criteria']['window']} steps, "
                     f"{_f(r['reward_last'])} over the last (gain {_f(r['gain'], '+.3f')}): "
                     f"{'learns' if r['learned'] else 'does NOT learn'} (bar: gain >= {a['criteria']['min_gain']:g}).")
    noise, comp = a["noise"], a["compare"]
    if noise["curve_distance"] is not None:
        lines.append(f"Run-to-run noise ({len(noise['pairs'])} pair(s) of {a['criteria']['baseline_arm']} runs): mean "
                     f"|reward difference| per step {noise['curve_distance']:.4f}, last-window spread "
                     f"{_f(noise['last_window_spread'], '.4f')}.")
    if comp:
        lines.append(f"{comp['run']} against the baseline runs: mean |reward difference| per step "
                     f"{_f(comp['mean_distance'], '.4f')} (threshold {comp['threshold']:.4f} = max({a['criteria']['noise_factor']:g}"
                     f" x noise, floor {a['criteria']['noise_floor']:g})): "
                     f"{'within' if comp['within_noise'] else 'OUTSIDE'} the noise; last-window reward "
                     f"{_f(comp['last_window_difference'], '+.4f')} against the baseline mean.")
        steps = comp["per_step"]
        if steps:
            worst = steps["worst"]
            lines.append(f"Step by step: {comp['run']} lies within the baseline runs' range at {steps['in_range']} of "
                         f"{steps['steps']} steps (with two repeats, a third run of the same arm falls in that range only "
                         f"a third of the time) and within max({a['criteria']['noise_factor']:g} x their range, floor "
                         f"{a['criteria']['noise_floor']:g}) of their mean at {steps['within_band']} of {steps['steps']};"
                         f" the closest call is step {worst['step']} ({worst['difference']:+.4f} against a band of "
                         f"{worst['band']:.4f}).")
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
    if before and before["compare"]:
        b, steps = before["compare"], before["compare"]["per_step"] or {}
        lines.append(f"Before the first collapse (steps 1-{before['last_step']}), the same analysis: noise "
                     f"{_f(before['noise']['curve_distance'], '.4f')}, {b['run']} at {_f(b['mean_distance'], '.4f')} "
                     f"(threshold {b['threshold']:.4f}), within the band at {steps.get('within_band', '-')} of "
                     f"{steps.get('steps', '-')} steps: {'passed' if before['verdict']['passed'] else 'not passed'}.")
    return lines


def main(argv: list[str] | None = None) -> int:
    return experiment_main(Config, run, NOTEBOOK, argv)


if __name__ == "__main__":
    sys.exit(main())
