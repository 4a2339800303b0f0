"""The gen ceiling's parameters (:mod:`rlkit.experiments.vllm_ceiling`): notebook 05's workload fields, verl 0.9.1's
rollout settings for vLLM and the measurement's own, built from a notebook-05 profile by :func:`config_from_profile`.
The ceiling and its requests (:mod:`rlkit.experiments.vllm_ceiling_requests`) both read this :class:`Config`.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from rlkit.core import params as P

PROFILE_NOTEBOOK = "05_grpo_qwen3_4b"  # the profiles a ceiling is built from

# verl 0.9.1's rollout settings for vLLM (verl/trainer/config/rollout/rollout.yaml, verl.workers.config.RolloutConfig,
# and what vLLMHttpServer.launch_server adds: the CUDA-graph mode, the executor, the worker extension class).
VERL_ROLLOUT: dict[str, Any] = {
    "temperature": 1.0,
    "top_p": 1.0,
    "top_k": -1,
    "ignore_eos": False,
    "calculate_log_probs": True,
    "dtype": "bfloat16",
    "max_num_batched_tokens": 8192,
    "max_num_seqs": 256,
    "max_model_len": None,  # None: the model's max_position_embeddings (vLLMHttpServer._validate_configs)
    "enable_chunked_prefill": True,
    "enable_prefix_caching": True,
    "enable_sleep_mode": True,
    "logprobs_mode": "processed_logprobs",
    "scheduling_policy": "fcfs",
    "disable_log_stats": True,
    "seed": 42,  # replica 0: replica_rank + rollout.seed
    "cudagraph_mode": "FULL_AND_PIECEWISE",
    "distributed_executor_backend": "mp",
    "worker_extension_cls": "verl.workers.rollout.vllm_rollout.utils.vLLMColocateWorkerExtension",
}
MEASUREMENT: dict[str, Any] = {"warmup_sequences": 8, "warmup_max_tokens": 32}
# Notebook 05's fields that decide what vLLM generates (the rest of a profile trains; it does not change gen).
RECIPE_KEYS = ("model", "model_seed", "response_length_mean", "data", "data_rows", "reward", "max_prompt_length",
               "max_response_length", "train_batch_size", "rollout_n", "n_gpus", "rollout_tp",
               "gpu_memory_utilization", "enforce_eager", "emulate_gpu_gib")


@dataclass(frozen=True)
class Config:
    profile: str  # the notebook-05 profile this was built from (recorded)
    # the workload: notebook 05's fields, same meaning (rlkit.recipes.grpo.GRPORecipe)
    model: str
    model_seed: int
    response_length_mean: int
    data: str
    data_rows: int
    reward: Literal["auto", "synthetic_hash", "dapo_math", "target_chars"]  # decides the rows (target_chars)
    max_prompt_length: int
    max_response_length: int
    train_batch_size: int
    rollout_n: int
    n_gpus: int
    rollout_tp: int
    gpu_memory_utilization: float
    enforce_eager: bool
    emulate_gpu_gib: float
    # verl 0.9.1's rollout settings (VERL_ROLLOUT)
    temperature: float
    top_p: float
    top_k: int
    ignore_eos: bool
    calculate_log_probs: bool
    dtype: str
    max_num_batched_tokens: int
    max_num_seqs: int
    max_model_len: int | None
    enable_chunked_prefill: bool
    enable_prefix_caching: bool
    enable_sleep_mode: bool
    logprobs_mode: str
    scheduling_policy: str
    disable_log_stats: bool
    seed: int
    cudagraph_mode: str
    distributed_executor_backend: str
    worker_extension_cls: str
    # the measurement
    warmup_sequences: int  # prompts of the warm-up generate (not in the batch)
    warmup_max_tokens: int  # tokens each warm-up response may have

    def __post_init__(self):
        def bad(key: str, why: str, fix: str) -> None:
            raise P.ParamError(f"Config.{key}: {why}. Fix: {fix}")

        for key in ("train_batch_size", "rollout_n", "n_gpus", "rollout_tp", "max_prompt_length", "max_response_length",
                    "max_num_batched_tokens", "max_num_seqs", "warmup_sequences", "warmup_max_tokens"):
            if getattr(self, key) < 1:
                bad(key, f"{getattr(self, key)} is not positive", "use a value >= 1")
        if self.n_gpus % self.rollout_tp:
            bad("rollout_tp", f"{self.rollout_tp} does not divide n_gpus={self.n_gpus}", "use 1")
        if (self.train_batch_size * self.rollout_n) % self.replicas:
            bad("n_gpus", f"{self.train_batch_size}x{self.rollout_n} sequences do not split over {self.replicas} "
                "vLLM replicas", "choose n_gpus / rollout_tp dividing train_batch_size * rollout_n")
        if self.data == "synthetic" and self.data_rows < self.train_batch_size + self.warmup_sequences:
            bad("warmup_sequences", f"{self.data_rows} rows hold no {self.warmup_sequences} warm-up prompts beside the "
                f"batch of {self.train_batch_size}", "lower warmup_sequences or raise data_rows")
        if not 0.0 < self.gpu_memory_utilization <= 1.0:
            bad("gpu_memory_utilization", f"{self.gpu_memory_utilization} is outside (0, 1]", "e.g. 0.85")
        if self.max_model_len is not None and self.max_model_len < self.max_prompt_length + self.max_response_length:
            bad("max_model_len", f"{self.max_model_len} < max_prompt_length + max_response_length", "null (verl's "
                "default: the model's max_position_embeddings) or at least their sum")

    @property
    def replicas(self) -> int:
        """vLLM replicas of the run (verl starts one per ``rollout_tp`` GPUs)."""
        return self.n_gpus // self.rollout_tp

    @property
    def sequences_per_replica(self) -> int:
        return self.train_batch_size * self.rollout_n // self.replicas

    def recipe(self):
        """The :class:`rlkit.recipes.grpo.GRPORecipe` whose inputs (model, data) this measures."""
        from rlkit.recipes.grpo import GRPORecipe

        return GRPORecipe(**{k: getattr(self, k) for k in RECIPE_KEYS}, ppo_mini_batch_size=self.train_batch_size)

    def shape(self, gpu_name: str | None) -> dict[str, Any]:
        """The keys :func:`rlkit.planning.roofline.vllm_ceiling` matches a run on."""
        from rlkit.planning import roofline

        return roofline.ceiling_shape(P.as_dict(self), gpu_name)


def config_from_profile(profile: str, overrides: dict[str, Any] | None = None) -> Config:
    """The ceiling of notebook 05's ``profile`` (a name under nbs/params/ or a YAML path): its workload fields, verl's
    rollout settings, the measurement's defaults, then ``overrides`` (keys of :class:`Config`)."""
    from rlkit.core.results import load_profile
    from rlkit.recipes.grpo import GRPORecipe

    values = load_profile(PROFILE_NOTEBOOK, profile)
    values.pop("results_dir", None)
    recipe = P.build(GRPORecipe, values, where=f"parameters of {PROFILE_NOTEBOOK} profile {profile!r}")
    rollout = [o for o in recipe.extra_overrides if "rollout." in o.split("=", 1)[0]]
    if rollout:
        raise P.ParamError(f"profile {profile!r} sets verl rollout options in extra_overrides {rollout}: the ceiling "
                           f"would not run the engine the profile does. Fix: give the same values as -p overrides "
                           f"of {sorted(VERL_ROLLOUT)}, or drop them from the profile")
    overrides = dict(overrides or {})
    trains = sorted(k for k in overrides if k in P.field_names(GRPORecipe) and k not in P.field_names(Config))
    if trains:
        raise P.ParamError(f"-p {trains}: notebook 05 parameters that do not change what vLLM generates. Fix: drop "
                           f"them (a ceiling's keys: {P.field_names(Config)})")
    name = Path(profile).stem.split(".")[-1] if profile.endswith((".yaml", ".yml")) else profile
    base = {"profile": name, **{k: getattr(recipe, k) for k in RECIPE_KEYS}, **VERL_ROLLOUT, **MEASUREMENT}
    return P.build(Config, {**base, **overrides}, where="parameters of rlkit.experiments.vllm_ceiling")
