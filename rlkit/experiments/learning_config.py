"""Notebook 07's parameters (nbs/params/07_does_it_learn.*.yaml), checked when built: read by the experiment
(:mod:`rlkit.experiments.learning`) and by its runs (:mod:`rlkit.experiments.learning_runs`).
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Literal

from rlkit.core import params as P


@dataclass(frozen=True)
class Config:
    """Parameters of notebook 07 (nbs/params/07_does_it_learn.*.yaml)."""

    model: str  # rlkit.models.qwen preset (random-init, written offline) or a local checkpoint (real weights)
    model_seed: int  # seed of the random weights and of the data order, the same in every run
    data: str  # "synthetic" or a DAPO-Math-17k parquet (its rows become target-task rows)
    data_rows: int  # synthetic rows / cap on unique real rows (0 = all)
    reward: Literal["target_chars", "dapo_math", "synthetic_hash"]  # target_chars: the learnable task
    baseline_arm: str  # rlkit.recipes.grpo.ARMS: the reference (run `repeats` times)
    compare_arm: str  # rlkit.recipes.grpo.ARMS: the arm the compared variant starts from
    compare_overrides: dict[str, Any]  # GRPORecipe fields set on top of compare_arm's (the variant's levers)
    compare_name: str  # the compared variant's name: its runs are <compare_name>.r1, .r2, ...
    repeats: int  # runs of the baseline arm (>= 2: their spread is the noise)
    compare_repeats: int  # runs of the compared variant (>= 2: so that it has a spread too)
    steps: int  # GRPO steps per run
    max_prompt_length: int
    max_response_length: int
    train_batch_size: int  # prompts per step (one on-policy mini-batch)
    rollout_n: int  # group size
    lr: float  # actor learning rate (random init needs far more than the real-weights 1e-6)
    ppo_max_token_len_per_gpu: int  # tokens per micro-batch (dynamic bsz)
    gpu_memory_utilization: float  # vLLM's share of each GPU, per run (side-by-side runs add up on each card)
    n_gpus: int  # GPUs per run, every run of both sides (1: one GPU; 2: two ranks, one per GPU of a 2-GPU node)
    enforce_eager: bool  # vLLM without CUDA graphs (a faster start for a small model)
    ray_num_cpus: int
    verify_before_launch: bool  # false: skip the separate verl config check when launching
    launch: Literal["auto", "always", "never"]  # auto: launch when a CUDA GPU is visible
    timeout_s: int  # wall-clock limit of one verl run
    window: int  # steps averaged at the start and at the end of a reward curve
    min_gain: float  # reward rise (last window - first window) a run needs to count as learning
    noise_factor: float  # compared run within noise: its distance <= noise_factor x the repeats' distance (the band:
    # noise_factor x their range at each step, at least their measured mean range per step; no fixed floor)
    probe_groups: int  # prompts whose samples from the untrained model are scored on the CPU (0: none)
    runs_dir: str  # "" : the runs go inside the results folder; else a folder whose launched runs are reused
    launch_limit: int  # launch at most this many runs in one invocation (0: no limit)
    parallel: int  # launch up to this many runs at once, side by side on the same GPU(s) (1: one after the other)
    attn_implementation: Literal["sdpa", "rlkit_varlen"]  # the recipe's attention (rlkit_varlen: packed, unpadded)
    use_remove_padding: bool  # verl's packed path (needs rlkit_varlen without flash-attn)

    def __post_init__(self) -> None:
        from rlkit.recipes.grpo import ARMS

        for key in ("baseline_arm", "compare_arm"):
            if getattr(self, key) not in ARMS or ARMS[getattr(self, key)].get("expect_failure"):
                _bad(key, f"{getattr(self, key)!r} is not an arm that trains", f"one of {[a for a in ARMS if a != '0-stock']}")
        self._check_gpus()
        self._check_variant()
        for key in ("repeats", "compare_repeats"):
            if getattr(self, key) < 2:
                _bad(key, f"{getattr(self, key)} run(s) have no run-to-run spread", "use 2 or more")
        if self.window < 1 or 2 * self.window > self.steps:
            _bad("window", f"{self.window} does not give two disjoint windows in {self.steps} steps",
                 "use 1 <= window <= steps / 2")
        for key in ("min_gain", "noise_factor", "lr"):
            if not getattr(self, key) > 0:
                _bad(key, f"{getattr(self, key)} is not positive", "use a positive value")
        for key in ("probe_groups", "launch_limit"):
            if getattr(self, key) < 0:
                _bad(key, f"{getattr(self, key)} is negative", "use 0 (off / no limit) or a positive count")
        if self.parallel < 1:
            _bad("parallel", f"{self.parallel} runs at once", "use 1 (one after the other) or more")

    def _check_gpus(self) -> None:
        """GPUs per run: a positive count over which each step's sequences split evenly (GRPORecipe's rule, named here
        as this Config's key rather than as the compared variant's)."""
        n, sequences = self.n_gpus, self.train_batch_size * self.rollout_n
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            _bad("n_gpus", f"{n!r} is not a positive number of GPUs per run", "use 1 (one GPU per run) or 2 (two ranks "
                 "per run, on a node with two GPUs)")
        if sequences % n:
            _bad("n_gpus", f"{self.train_batch_size}x{self.rollout_n} sequences per step do not split over {n} ranks",
                 "use a count that divides train_batch_size * rollout_n, e.g. 1 or 2")

    def _check_variant(self) -> None:
        """The compared variant: a name of its own, levers that are recipe fields not shared by every run, and
        values its recipe accepts."""
        from rlkit.recipes.grpo import GRPORecipe

        if not isinstance(self.compare_overrides, dict):
            _bad("compare_overrides", f"{self.compare_overrides!r} is not a mapping", "a mapping of GRPORecipe "
                 "fields to values, e.g. {rmsnorm: compiled}, or {} for the arm as it is")
        fields = P.field_names(GRPORecipe)
        for key in self.compare_overrides:
            if key not in fields:
                _bad("compare_overrides", f"{key!r} is not a field of rlkit.recipes.grpo.GRPORecipe",
                     f"correct the spelling or remove it (the fields it may set: {[f for f in fields if f not in SHARED]})")
            if key in SHARED:
                _bad("compare_overrides", f"{key!r} is the workload every run shares, set by Config.{SHARED[key]}",
                     f"remove it; to change it for both sides set {SHARED[key]}")
        if not _SAFE_NAME.fullmatch(self.compare_name) or self.compare_name == self.baseline_arm:
            _bad("compare_name", f"{self.compare_name!r} is not a name of its own for the compared runs' folders",
                 "letters, digits, '.', '_' or '-', other than baseline_arm, e.g. 5-fastest")
        if self.compare_arm == self.baseline_arm and not self.compare_overrides:
            _bad("compare_arm", "is the baseline arm with no overrides", "compare another arm, e.g. "
                 "5-master-on-host-cast-once, or give compare_overrides")
        try:
            P.build(GRPORecipe, compare_recipe_values(self), where="the compared variant's recipe")
        except P.ParamError as err:
            _bad("compare_overrides", f"its recipe is refused ({err})", "change the value the message names")


# Recipe fields every run shares, set from the Config field named: not a lever of the compared variant.
SHARED = {key: key for key in (
    "model", "model_seed", "data", "data_rows", "reward", "max_prompt_length", "max_response_length",
    "train_batch_size", "rollout_n", "lr", "ppo_max_token_len_per_gpu", "gpu_memory_utilization", "enforce_eager",
    "steps", "ray_num_cpus", "verify_before_launch", "launch", "timeout_s", "attn_implementation",
    "use_remove_padding", "n_gpus")} | {"ppo_mini_batch_size": "train_batch_size"}
_SAFE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")


def _bad(key: str, why: str, fix: str) -> None:
    raise P.ParamError(f"Config.{key}: {why}. Fix: {fix}")


def workload_values(cfg: Config) -> dict[str, Any]:
    """The recipe fields every run shares (:data:`SHARED`), from ``cfg``: the profile's workload on ``cfg.n_gpus``
    GPUs per run."""
    values = {key: getattr(cfg, key) for key, source in SHARED.items() if source == key}
    return {**values, "ppo_mini_batch_size": cfg.train_batch_size}


def recipe_values(cfg: Config, arm: str) -> dict[str, Any]:
    """The recipe fields of one run of ``arm`` as it is (the baseline's): the workload and the arm's fields."""
    from rlkit.recipes.grpo import arm_values

    return {**workload_values(cfg), **arm_values(arm)}


def compare_recipe_values(cfg: Config) -> dict[str, Any]:
    """The recipe fields of one run of the compared variant: compare_arm's, then compare_overrides on top."""
    return {**recipe_values(cfg, cfg.compare_arm), **cfg.compare_overrides}
