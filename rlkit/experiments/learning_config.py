"""Notebook 07's parameters (nbs/params/07_does_it_learn.*.yaml), checked when built: read by the experiment
(:mod:`rlkit.experiments.learning`) and by its runs (:mod:`rlkit.experiments.learning_runs`).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

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
    compare_arm: str  # rlkit.recipes.grpo.ARMS: compared against the baseline's run-to-run noise
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
        from rlkit.recipes.grpo import ARMS

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

