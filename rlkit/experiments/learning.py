"""Notebook 07: does GRPO still learn with the patches? Arm 1 and arm 5 on a task a random-init model can learn.

The task is synthetic and so is the model: :func:`rlkit.reward.target_chars` scores the share of a response's
characters that belong to a small target set named in its prompt (rows from :func:`rlkit.data.target_rows`),
and ``qwen3-30m`` (:mod:`rlkit.models`) is a ~31M-parameter random-init Qwen3, so dozens of steps take minutes
on one GPU. The same code runs the task on real DAPO rows (``data``: a DAPO-Math-17k parquet) and real weights
(``model``: a local checkpoint); what it measures is whether a policy moves, not mathematics.

The plan: the baseline arm (``1-fixes-hostadamw``), the compared arm (``5-master-on-host-cast-once``: every usable
patch) and the baseline again (``repeats`` runs of it in all), same seed, data and model, each a GRPO recipe of
:mod:`rlkit.recipe` run by :func:`rlkit.grpo.run` (data, model, preflight, verl's config check, the launch when a
GPU is present). verl's per-step records (:func:`rlkit.verl_logs.read_steps`) give the curves of reward, grad_norm,
pg_loss, entropy and response length; :func:`rlkit.learning_curves.analyze` reads them:

- a run *learns* when the mean reward of its last ``window`` steps exceeds that of its first ``window`` steps
  by at least ``min_gain`` (a flat curve does not);
- the *noise* is the largest curve distance between two baseline runs (mean over common steps of the absolute
  reward difference), and the compared arm is *within the noise* when its mean distance to the baseline runs is
  at most ``noise_factor`` x that noise (or ``noise_floor``, when the repeats happen to agree more closely).

Each run is its own results folder under ``runs_dir`` (written whole or left ``.failed``); a launched run found
there with the same recipe is read back instead of launched again, ``launch_limit`` caps the launches of one
invocation, and ``parallel`` runs go side by side on the one GPU (each its own verl session; a run far from the
GPU's limits, as this one is, leaves it mostly idle)::

    python -m rlkit.experiments.learning --profile h200      # the missing runs; the finished ones are read back

Without a GPU everything before the launch runs for real, the reward is exercised on the prepared rows and the
random model's own samples (:func:`reward_examples`, :func:`probe_model`), and the analysis says it has no steps.
"""
from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from rlkit import params as P
from rlkit import reward as RW
from rlkit.env import REPO_ROOT
from rlkit.experiments import experiment_main
from rlkit.learning_curves import ENTROPY_COLLAPSE, analyze, analyze_before_collapse, curves

NOTEBOOK = "07_does_it_learn"
HOW_TO_RUN = ("run `python -m rlkit.experiments.learning --profile h200` on a GPU node (it launches the runs missing "
              "from runs_dir), then render outputs/07_does_it_learn/h200 with results_dir")


@dataclass(frozen=True)
class Config:
    """Parameters of notebook 07 (nbs/params/07_does_it_learn.*.yaml)."""

    model: str  # rlkit.models preset (random-init, written offline) or a local checkpoint (real weights)
    model_seed: int  # seed of the random weights and of the data order, the same in every run
    data: str  # "synthetic" or a DAPO-Math-17k parquet (its rows become target-task rows)
    data_rows: int  # synthetic rows / cap on unique real rows (0 = all)
    reward: Literal["target_chars", "dapo_math", "synthetic_hash"]  # target_chars: the learnable task
    baseline_arm: str  # rlkit.recipe.ARMS: the reference (run `repeats` times)
    compare_arm: str  # rlkit.recipe.ARMS: compared against the baseline's run-to-run noise
    repeats: int  # runs of the baseline arm (>= 2: their spread is the noise)
    steps: int  # GRPO steps per run
    max_prompt_length: int
    max_response_length: int
    train_batch_size: int  # prompts per step (one on-policy mini-batch)
    rollout_n: int  # group size
    lr: float  # actor learning rate (random init needs far more than the real-weights 1e-6)
    ppo_max_token_len_per_gpu: int  # tokens per micro-batch (dynamic bsz)
    gpu_memory_utilization: float
    enforce_eager: bool  # vLLM without CUDA graphs (a faster start for a small model)
    ray_num_cpus: int
    verify_before_launch: bool  # false: skip the separate verl config check when launching
    launch: Literal["auto", "always", "never"]  # auto: launch when a CUDA GPU is visible
    timeout_s: int  # wall-clock limit of one verl run
    window: int  # steps averaged at the start and at the end of a reward curve
    min_gain: float  # reward rise (last window - first window) a run needs to count as learning
    noise_factor: float  # compared arm within noise: its distance <= noise_factor x the repeats' distance
    noise_floor: float  # ... or <= this (reward units), when the repeats agree more closely
    probe_groups: int  # prompts whose samples from the untrained model are scored on the CPU (0: none)
    runs_dir: str  # "" : the runs go inside the results folder; else a folder whose launched runs are reused
    launch_limit: int  # launch at most this many runs in one invocation (0: no limit)
    parallel: int  # launch up to this many runs at once, side by side on the one GPU (1: one after the other)
    attn_implementation: Literal["sdpa", "rlkit_varlen"]  # the recipe's attention (rlkit_varlen: packed, unpadded)
    use_remove_padding: bool  # verl's packed path (needs rlkit_varlen without flash-attn)

    def __post_init__(self) -> None:
        from rlkit.recipe import ARMS

        def bad(key: str, why: str, fix: str) -> None:
            raise P.ParamError(f"Config.{key}: {why}. Fix: {fix}")

        for key in ("baseline_arm", "compare_arm"):
            if getattr(self, key) not in ARMS or ARMS[getattr(self, key)].get("expect_failure"):
                bad(key, f"{getattr(self, key)!r} is not an arm that trains", f"one of {[a for a in ARMS if a != '0-stock']}")
        if self.baseline_arm == self.compare_arm:
            bad("compare_arm", "is the baseline arm", "compare another arm, e.g. 5-master-on-host-cast-once")
        if self.repeats < 2:
            bad("repeats", f"{self.repeats} baseline run(s) measure no noise", "use 2 or more")
        if self.window < 1 or 2 * self.window > self.steps:
            bad("window", f"{self.window} does not give two disjoint windows in {self.steps} steps",
                "use 1 <= window <= steps / 2")
        for key in ("min_gain", "noise_floor", "noise_factor", "lr"):
            if not getattr(self, key) > 0:
                bad(key, f"{getattr(self, key)} is not positive", "use a positive value")
        for key in ("probe_groups", "launch_limit"):
            if getattr(self, key) < 0:
                bad(key, f"{getattr(self, key)} is negative", "use 0 (off / no limit) or a positive count")
        if self.parallel < 1:
            bad("parallel", f"{self.parallel} runs at once", "use 1 (one after the other) or more")


def run_plan(cfg: Config) -> list[tuple[str, str]]:
    """``(run name, arm)`` in launch order: baseline, compared arm, then the baseline's repeats."""
    names = [(f"{cfg.baseline_arm}.r1", cfg.baseline_arm), (f"{cfg.compare_arm}.r1", cfg.compare_arm)]
    return names + [(f"{cfg.baseline_arm}.r{i}", cfg.baseline_arm) for i in range(2, cfg.repeats + 1)]


def build_recipe(cfg: Config, arm: str):
    """The GRPO recipe of one run: the profile's workload on one GPU with the arm's patches and optimizer."""
    from rlkit.recipe import GRPORecipe, arm_values

    values = {"model": cfg.model, "model_seed": cfg.model_seed, "data": cfg.data, "data_rows": cfg.data_rows,
              "reward": cfg.reward, "max_prompt_length": cfg.max_prompt_length,
              "max_response_length": cfg.max_response_length, "train_batch_size": cfg.train_batch_size,
              "rollout_n": cfg.rollout_n, "ppo_mini_batch_size": cfg.train_batch_size, "lr": cfg.lr,
              "ppo_max_token_len_per_gpu": cfg.ppo_max_token_len_per_gpu, "n_gpus": 1,
              "gpu_memory_utilization": cfg.gpu_memory_utilization, "enforce_eager": cfg.enforce_eager,
              "steps": cfg.steps, "ray_num_cpus": cfg.ray_num_cpus, "verify_before_launch": cfg.verify_before_launch,
              "launch": cfg.launch, "timeout_s": cfg.timeout_s, "attn_implementation": cfg.attn_implementation,
              "use_remove_padding": cfg.use_remove_padding, **arm_values(arm)}
    return P.build(GRPORecipe, values, where=f"the recipe of arm {arm}")


# ----------------------------------------------------------------------------------------------
# the reward on real rows and on the untrained model's own samples


def reward_examples(rows: list[dict[str, Any]], n_rows: int = 3) -> list[dict[str, Any]]:
    """:func:`rlkit.reward.target_chars` on hand-made responses to the first ``n_rows`` rows, each with the score
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
    whether each set is the one :func:`rlkit.reward.target_set_of` derives from the row's prompt before the naming line."""
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
# the runs


def _runs_root(cfg: Config, out: Path) -> Path:
    if not cfg.runs_dir:
        return out / "runs"
    path = Path(cfg.runs_dir)
    return path if path.is_absolute() else REPO_ROOT / path


def saved_run(run_dir: Path, recipe) -> dict[str, Any] | None:
    """The metrics of a launched run saved in ``run_dir`` for this very recipe; None when there is none (a CPU pass
    that launched nothing is not a run to keep). A launched run of another recipe raises: it is not overwritten."""
    from rlkit.recipe import GRPORecipe
    from rlkit.results import read_metrics

    if not (run_dir / "metrics.json").exists():
        return None
    metrics = read_metrics(run_dir)
    if not metrics.get("launched"):
        return None
    if P.build(GRPORecipe, metrics["recipe"], where=f"{run_dir}/metrics.json") != recipe:
        raise P.ParamError(f"{run_dir} holds a launched run of another recipe. Fix: point runs_dir at another folder, "
                           "or move that run away if it is to be replaced")
    return metrics


def run_all(cfg: Config, out: Path) -> tuple[dict[str, dict[str, Any]], list[str]]:
    """Every planned run, read back from ``runs_dir`` or run by :func:`rlkit.grpo.run` into its own results folder;
    returns ``{name: {"arm", "folder", "reused", "metrics"}}`` and the names left for a later invocation. Up to
    ``parallel`` runs go at once (threads, each waiting on its own verl session); where nothing is launched (no
    GPU), a repeat whose identical recipe was already checked is not checked again (before the launch nothing
    differs). One run's failure lets the runs beside it finish and be saved, then is raised."""
    from rlkit import verl_job

    root = _runs_root(cfg, out)
    where = f"{cfg.runs_dir.rstrip('/')}/" if cfg.runs_dir else "runs/"  # as the results folder says it
    done, queue = {}, []
    for name, arm in run_plan(cfg):
        recipe = build_recipe(cfg, arm)
        metrics = saved_run(root / name, recipe)
        if metrics is not None:
            done[name] = {"arm": arm, "folder": where + name, "reused": "read back", "metrics": metrics}
        else:
            queue.append((name, arm, recipe))
    will_launch = bool(queue) and verl_job.launch_decision(queue[0][2].launch, queue[0][2].n_gpus, HOW_TO_RUN)[0]
    dry, launches, pending = {}, 0, []
    while queue:
        batch, rest = [], []
        for name, arm, recipe in queue:
            if recipe in dry:
                done[name] = {"arm": arm, "folder": where + dry[recipe], "reused": f"not launched, as {dry[recipe]}",
                              "metrics": done[dry[recipe]]["metrics"]}
            elif cfg.launch_limit and launches + len(batch) >= cfg.launch_limit:
                pending.append(name)
            elif len(batch) < cfg.parallel and (will_launch or all(recipe != r for _, _, r in batch)):
                batch.append((name, arm, recipe))
            else:
                rest.append((name, arm, recipe))
        for (name, arm, recipe), metrics in zip(batch, _run_batch(root, batch)):
            launches += bool(metrics["launched"])
            if not metrics["launched"]:
                dry[recipe] = name
            done[name] = {"arm": arm, "folder": where + name, "reused": None, "metrics": metrics}
        queue = rest
    return {name: done[name] for name, _ in run_plan(cfg) if name in done}, pending


def _run_batch(root: Path, batch: list[tuple[str, str, Any]]) -> list[dict[str, Any]]:
    """The metrics of each ``(name, arm, recipe)`` of ``batch``, run side by side, each written whole into
    ``root/name`` (or left ``.failed``); the first failure is raised once every run of the batch has ended. An
    interrupt while waiting stops the runs' verl sessions first (they wait in the pool's threads)."""
    from concurrent.futures import ThreadPoolExecutor, wait

    from rlkit import grpo, verl_job
    from rlkit.results import ResultsFolder

    def one(name: str, recipe) -> dict[str, Any]:
        folder = ResultsFolder(root.name, name, root=root.parent)
        with folder.writing() as work:
            folder.write_params(P.as_dict(recipe))
            folder.write_env()
            metrics = grpo.run(recipe, out_dir=work, how_to_run=HOW_TO_RUN)
            folder.write_metrics(metrics)
        return metrics

    pool = ThreadPoolExecutor(max_workers=len(batch))
    futures = [pool.submit(one, name, recipe) for name, _, recipe in batch]
    try:
        wait(futures)
    except BaseException:
        verl_job.stop_running_sessions()
        raise
    finally:
        pool.shutdown(wait=True)
    return [f.result() for f in futures]


def run_row(name: str, entry: dict[str, Any]) -> dict[str, Any]:
    """One run in a few fields: arm, folder, whether it was launched (or read back) and how it ended; ``patches``
    are the ones the run applies (the arm's and its workload levers', :attr:`rlkit.recipe.GRPORecipe.active_patches`)."""
    from rlkit import grpo
    from rlkit.recipe import GRPORecipe

    m = entry["metrics"]
    recipe = P.build(GRPORecipe, m["recipe"], where=f"the recipe of {name}")
    summary = m.get("summary") or {}
    return {"run": name, "arm": entry["arm"], "folder": entry["folder"], "reused": entry["reused"],
            "launched": m["launched"], "outcome": grpo.outcome(m), "launch_reason": m["launch_reason"],
            "patches": list(recipe.active_patches), "optimizer": m["recipe"]["optimizer"],
            "verified_patches": (m.get("verify") or {}).get("active_patches"), "step_s": summary.get("step_s"),
            "update_actor_mfu": (((m.get("limits") or {}).get("phases") or {}).get("update_actor") or {}).get("fraction"),
            "sanity_passed": (m.get("sanity") or {}).get("passed")}


def run(cfg: Config, out_dir: str | Path | None = None) -> dict[str, Any]:
    """The whole experiment; returns ``metrics.json`` content."""
    from rlkit import data, grpo
    from rlkit.results import notebook_out_dir

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
    from rlkit.results import read_metrics

    return read_metrics(results_dir)


# ----------------------------------------------------------------------------------------------
# in words (the figures and the explorer: rlkit.viz.learning)


def _f(value, spec: str = ".3f") -> str:
    return "-" if value is None else format(value, spec)


def describe(metrics: dict[str, Any]) -> str:
    """What the experiment found, in words, every number taken from ``metrics``."""
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
    if not metrics["launched"]:
        lines.append(f"No run was launched: {metrics['launch_reason']}")
        return "\n".join(lines)
    if metrics["pending"]:
        lines.append(f"Not run yet (launch_limit {cfg['launch_limit']}): {', '.join(metrics['pending'])}; run the same "
                     "command again to add them.")
    a = metrics["analysis"]
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
    mfu = [r["update_actor_mfu"] for r in metrics["runs"].values() if r.get("update_actor_mfu") is not None]
    if mfu:
        lines.append(f"Speed is not what this measures: the runs shared one GPU, and a model this small leaves it idle "
                     f"(update_actor at {min(mfu):.2%}-{max(mfu):.2%} of the GPU's dense bf16 peak, rlkit.roofline).")
    v = a["verdict"]
    lines.append("Result: " + ("every run learns and the compared arm's curve is within the run-to-run noise of the "
                               "baseline's, in the mean and at every step: the patches do not change what GRPO learns "
                               "here." if v["passed"] else
                               f"not shown (every run learns: {v['all_learned']}; compared arm within the noise: "
                               f"{v['compare_within_noise']}; at every step: {v['compare_every_step_within_band']})."))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    return experiment_main(Config, run, NOTEBOOK, argv)


if __name__ == "__main__":
    sys.exit(main())
