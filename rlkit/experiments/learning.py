"""Notebook 07: does GRPO still learn with the patches? Arm 1 and the fastest correct variant, each run at least twice,
on a task a random-init model can learn.

The task is synthetic and so is the model: :func:`rlkit.models.reward.target_chars` scores the share of a response's
characters that belong to a small target set named in its prompt (rows from :func:`rlkit.models.data.target_rows`),
and ``qwen3-30m`` (:mod:`rlkit.models.qwen`) is a ~31M-parameter random-init Qwen3, so dozens of steps take minutes
on one GPU. The same code runs the task on real DAPO rows (``data``: a DAPO-Math-17k parquet) and real weights
(``model``: a local checkpoint); what it measures is whether a policy moves, not mathematics.

The plan: the baseline arm (``1-fixes-hostadamw``, ``repeats`` runs) and the compared variant (``compare_name``:
``compare_arm`` with ``compare_overrides`` on top, the levers of the fastest correct variant; ``compare_repeats``
runs), interleaved, same seed, data and model, each a GRPO recipe of :mod:`rlkit.recipes.grpo` run by
:func:`rlkit.experiments.grpo.run` (data, model, preflight, verl's config check, the launch when a GPU is present).
verl's per-step records (:func:`rlkit.verl.logs.read_steps`) give the curves of reward, grad_norm, pg_loss, entropy
and response length; :func:`rlkit.analysis.learning_curves.analyze` reads them:

- a run *learns* when the mean reward of its last ``window`` steps exceeds that of its first ``window`` steps
  by at least ``min_gain`` (a flat curve does not);
- the *noise* is the largest curve distance between two baseline runs (mean over common steps of the absolute
  reward difference); each compared side has its own spread too, held to the same threshold;
- each compared run is *within the noise* when its mean distance to the baseline runs is at most ``noise_factor`` x
  that noise, and at each step the literal count says whether it lies inside the baseline runs' [lowest, highest]
  range, beside the band (``noise_factor`` x their range at the step, at least their measured mean range per step:
  the floor is a measurement, not a parameter);
- the counts are given apart for the rising part (before the baseline's mean reward has covered 90% of its rise)
  and the plateau, where runs that sample the same responses agree by construction.

Each run is its own results folder under ``runs_dir`` (:mod:`rlkit.experiments.learning_runs`; written whole or
left ``.failed``); a launched run found there with the same recipe is read back instead of launched again,
``launch_limit`` caps the launches of one invocation, and ``parallel`` runs go side by side on the same GPU(s) (each
its own verl session on ``n_gpus`` ranks; a run far from the GPU's limits, as this one is, leaves it mostly idle)::

    python -m rlkit.experiments.learning --profile h200      # the missing runs; the finished ones are read back
    python -m rlkit.experiments.learning --profile h200-2gpu # the same comparison, each run on two ranks

Without a GPU everything before the launch runs for real, the reward is exercised on the prepared rows and the
random model's own samples (:func:`reward_examples`, :func:`probe_model`), and the analysis says it has no steps.
The findings in words: :mod:`rlkit.experiments.learning_words`.
"""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from rlkit.analysis.learning_curves import analyze, analyze_before_collapse, curves
from rlkit.core import params as P
from rlkit.experiments import experiment_main
from rlkit.experiments.learning_config import Config
from rlkit.experiments.learning_runs import arm_of, build_recipe, run_all, run_plan, run_row
from rlkit.experiments.learning_words import describe  # noqa: F401  (the findings: rlkit.experiments.findings)
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
    runs = {n: {"arm": done[n]["variant"], "steps": s} for n, s in steps.items()}
    analysis = analyze(runs, baseline_arm=cfg.baseline_arm, compare_arm=cfg.compare_name, window=cfg.window,
                       min_gain=cfg.min_gain, noise_factor=cfg.noise_factor)
    return {
        "config": P.as_dict(cfg),
        "synthetic": {"task": targets and cfg.data == "synthetic", "model": first.random_init},
        "task": task_summary(rows, cfg.reward) if targets else {"reward": cfg.reward},
        "data": data_info,
        "model": model_info,
        "reward_examples": reward_examples(rows) if targets else [],
        "probe": probe,
        "plan": [{"run": name, "arm": arm_of(cfg, side), "variant": side} for name, side in run_plan(cfg)],
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


def main(argv: list[str] | None = None) -> int:
    return experiment_main(Config, run, NOTEBOOK, argv)


if __name__ == "__main__":
    sys.exit(main())
