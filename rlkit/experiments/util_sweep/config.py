"""The sweep's cases and parameters, and the recipe and planner inputs of one point."""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Literal

from rlkit.core import params as P
from rlkit.planning import budget, run_terms, verdict
from rlkit.planning.vllm_terms import cuda_graphs_term
from rlkit.recipes.grpo import GRPORecipe

NOTEBOOK = "06_util_sweep"


# verl 0.9.1's V1 trainer waits for finished rollouts in polls of this period (verl/trainer/ppo/v1/replay_buffer.py
# ReplayBuffer poll_interval=2.0, _wait_for_next_poll), so timing_s/gen is known only to it: every gen time in
# outputs/06_util_sweep/ is 2k + 0.07-0.11 s.
VERL_ROLLOUT_POLL_S = 2.0


@dataclass(frozen=True)
class Case:
    """What a case holds fixed across the sweep (every field also goes into metrics.json)."""

    description: str
    model: str  # rlkit.models.qwen preset, launched as a random-init checkpoint (no downloads)
    emulated_total_gib: float  # the card vLLM's gpu_memory_utilization refers to (CUDA's total)
    max_prompt_length: int
    max_response_length: int
    train_batch_size: int  # prompts per step
    rollout_n: int  # samples per prompt
    ppo_mini_batch_size: int
    use_dynamic_bsz: bool
    ppo_max_token_len_per_gpu: int  # tokens per micro-batch (dynamic bsz)
    micro_batch_size_per_gpu: int  # sequences per micro-batch (fixed bsz)
    param_offload: bool
    optimizer_offload: bool
    optimizer: str  # AdamW (torch, on the device) or HostAdamW (rlkit.optim, the step on the host)
    patches: tuple[str, ...]  # rlkit patches (each must be one the planner models)
    max_num_batched_tokens: int  # vLLM's chunked-prefill token budget; 0 keeps verl's default (8192)
    data_rows: int  # synthetic prompts generated

    @property
    def seq_len(self) -> int:
        return self.max_prompt_length + self.max_response_length

    @property
    def samples_per_step(self) -> int:
        return self.train_batch_size * self.rollout_n


CASES: dict[str, Case] = {
    # Seed 003's small case ("target config ... small-model sanity pass"): Qwen2.5-0.5B-Instruct, 256 + 256
    # tokens, 32 prompts x 8, mini-batch 16, 4 sequences per micro-batch, param + optimizer offload,
    # chunked prefill with max_num_batched_tokens 4096, on its 80 GiB card (its script's TOTAL = 80.0).
    # The launched model is a random-init Qwen2.5-0.5B built from its published config (the node cannot
    # download weights); the planner is run for the same preset. Full fine-tune, as the document's command
    # line (no LoRA keys); its log-prob micro-batch 16 becomes 4 here (one key in the recipe sets both).
    "doc_small": Case(
        description="seed 003's small case (random-init Qwen2.5-0.5B) on an emulated 80 GiB card",
        model="qwen2.5-0.5b", emulated_total_gib=80.0, max_prompt_length=256, max_response_length=256,
        train_batch_size=32, rollout_n=8, ppo_mini_batch_size=16, use_dynamic_bsz=False,
        ppo_max_token_len_per_gpu=2048, micro_batch_size_per_gpu=4, param_offload=True, optimizer_offload=True,
        optimizer="AdamW", patches=(), max_num_batched_tokens=4096, data_rows=2048,
    ),
    # The first working arm of notebook 05 on one emulated RTX A6000 (47.4 GiB, the A6000's total as CUDA
    # reports it): 256 + 256 tokens as notebook 05's h200 profile (outputs/05_grpo_qwen3_4b/1-fixes-hostadamw), 32 x 8,
    # one on-policy mini-batch, param offload with the offload_views fix, the AdamW step on the host (a device
    # AdamW step cannot fit the card, seed Step 2), dynamic bsz of 8192 tokens (16384 ran out of the card in
    # outputs/05_grpo_qwen3_4b/1-fixes-hostadamw-resp512-tok16384; 8192 trained). Here the whole batch is on one
    # GPU, so a point's update is about twice the two-GPU arm's (which took 495 s from launch to exit).
    "qwen3_4b_48g": Case(
        description="the first working Qwen3-4B arm (notebook 05) on an emulated 48 GB card (47.4 GiB CUDA total)",
        model="qwen3-4b", emulated_total_gib=47.4, max_prompt_length=256, max_response_length=256,
        train_batch_size=32, rollout_n=8, ppo_mini_batch_size=32, use_dynamic_bsz=True,
        ppo_max_token_len_per_gpu=8192, micro_batch_size_per_gpu=4, param_offload=True, optimizer_offload=False,
        optimizer="HostAdamW", patches=("offload_views",), max_num_batched_tokens=0, data_rows=2048,
    ),
    # CPU profile: the tiny random Qwen3; everything up to the launch runs, the launch needs a GPU.
    "tiny": Case(
        description="tiny random Qwen3 (CPU smoke: planner side and verl config validation only)",
        model="tiny", emulated_total_gib=47.4, max_prompt_length=512, max_response_length=64,
        train_batch_size=4, rollout_n=2, ppo_mini_batch_size=4, use_dynamic_bsz=True,
        ppo_max_token_len_per_gpu=4096, micro_batch_size_per_gpu=2, param_offload=True, optimizer_offload=True,
        optimizer="AdamW", patches=(), max_num_batched_tokens=0, data_rows=64,
    ),
}


# rlkit patch -> the planner option that models it (None: no effect on one GPU's memory).
PATCH_PLANNER_OPTION = {"offload_views": "offload_views", "skip_old_logprob": "skip_old_logprob", "no_shard": None}


@dataclass(frozen=True)
class Config:
    """Parameters of notebook 06_util_sweep (one point of the sweep per run)."""

    case: Literal["doc_small", "qwen3_4b_48g", "tiny"]  # see CASES
    gpu_memory_utilization: float  # vLLM's fraction of the EMULATED card's memory (the document's knob)
    sweep_utils: tuple[float, ...]  # the planner is evaluated at each of these
    steps: int  # GRPO steps per run; step 1 carries one-off start-up, steps 2.. are averaged
    enforce_eager: bool  # true: vLLM without CUDA graphs
    price_per_gpu_hour: float  # USD, for the document's cost metric
    sample_interval_s: float  # GPU memory sampling period
    launch: Literal["auto", "always", "never"]  # auto: launch verl when a CUDA GPU is visible
    timeout_s: int  # wall-clock limit of one verl job

    def __post_init__(self) -> None:
        def bad(key: str, why: str, fix: str) -> None:
            raise P.ParamError(f"Config.{key}: {why}. Fix: {fix}")

        if self.case not in CASES:
            bad("case", f"{self.case!r} is not a case", f"choose one of {sorted(CASES)}")
        if not 0.0 < self.gpu_memory_utilization <= 1.0:
            bad("gpu_memory_utilization", f"{self.gpu_memory_utilization} is outside (0, 1]", "e.g. 0.6")
        if not self.sweep_utils:
            bad("sweep_utils", "empty", "list the utilization values, e.g. [0.4, 0.5, 0.6, 0.7]")
        for u in self.sweep_utils:
            if not 0.0 < u <= 1.0:
                bad("sweep_utils", f"{u} is outside (0, 1]", "use fractions such as 0.4")
        if self.steps < 1:
            bad("steps", f"{self.steps} is not positive", "use 2 or more (step 1 includes start-up)")
        if self.price_per_gpu_hour < 0:
            bad("price_per_gpu_hour", f"{self.price_per_gpu_hour} is negative", "a price in USD, e.g. 2.5")
        if not self.sample_interval_s > 0:
            bad("sample_interval_s", f"{self.sample_interval_s} is not positive", "use 1.0 (1 Hz)")
        if self.timeout_s < 1:
            bad("timeout_s", f"{self.timeout_s} is not positive", "seconds, e.g. 560")
        unmodelled = [p for p in CASES[self.case].patches if p not in PATCH_PLANNER_OPTION]
        if unmodelled:
            bad("case", f"case {self.case!r} applies patches {unmodelled} the planner cannot model here",
                f"use patches among {sorted(PATCH_PLANNER_OPTION)}")

    @property
    def case_spec(self) -> Case:
        return CASES[self.case]


def emulation_info(cfg: Config) -> dict[str, Any]:
    case = cfg.case_spec
    return {
        "emulated_total_gib": case.emulated_total_gib,
        "gpu_memory_utilization": cfg.gpu_memory_utilization,
        "vllm_requested_gib": cfg.gpu_memory_utilization * case.emulated_total_gib,
        "rule": "rlkit.patches.instruments.emulate_card: every verl / vLLM process sees and is capped at the emulated card; "
                "vLLM reserves ceil(emulated_total x util)",
    }


def extra_overrides(case: Case) -> list[str]:
    """verl keys the sweep sets beyond the recipe: vLLM's statistics on, max_model_len = prompt + response
    (so vLLM's "Maximum concurrency" counts whole sequences of this run, as the planner does; verl's
    default is the model's max_position_embeddings, 40,960 for the Qwen3 presets) and the case's
    chunked-prefill budget."""
    arr = "actor_rollout_ref.rollout"
    out = [f"{arr}.disable_log_stats=False", f"{arr}.max_model_len={case.seq_len}"]
    if case.max_num_batched_tokens:
        out.append(f"{arr}.max_num_batched_tokens={case.max_num_batched_tokens}")
    return out


def build_recipe(cfg: Config) -> GRPORecipe:
    case = cfg.case_spec
    return GRPORecipe(
        model=case.model, data_rows=case.data_rows, max_prompt_length=case.max_prompt_length,
        max_response_length=case.max_response_length, train_batch_size=case.train_batch_size,
        rollout_n=case.rollout_n, ppo_mini_batch_size=case.ppo_mini_batch_size, use_dynamic_bsz=case.use_dynamic_bsz,
        ppo_max_token_len_per_gpu=case.ppo_max_token_len_per_gpu, micro_batch_size_per_gpu=case.micro_batch_size_per_gpu,
        n_gpus=1, param_offload=case.param_offload, optimizer_offload=case.optimizer_offload,
        optimizer=case.optimizer, gpu_memory_utilization=cfg.gpu_memory_utilization, enforce_eager=cfg.enforce_eager,
        patches=case.patches, steps=cfg.steps, extra_overrides=tuple(extra_overrides(case)),
        planner_gpu_gib=case.emulated_total_gib, emulate_gpu_gib=case.emulated_total_gib,
        launch=cfg.launch, timeout_s=cfg.timeout_s,
    )


def planner_spec(cfg: Config, util: float | None = None) -> budget.PlanSpec:
    """The planner's inputs for the same settings as the launch, on the emulated card.

    Micro-batch tokens: the dynamic-bsz token budget, or sequences per micro-batch x their padded length (the
    node runs without remove-padding): the longest prompt verl logged for the data
    (:func:`rlkit.planning.run_terms.longest_prompt_term`) + max_response_length, verl padding to the longest
    sequence without the prompts' left padding. Logits: the pure-torch path (no flash-attn on the node). CUDA
    graphs: none with enforce_eager, else what vLLM took for the model in the committed runs
    (:func:`rlkit.planning.vllm_terms.cuda_graphs_term`). The actor's non-torch memory and vLLM's sleeping worker:
    what the committed runs measured (:mod:`rlkit.planning.run_terms`). Each is the planner's default where no
    run measured it.
    """
    case = cfg.case_spec
    prompt = run_terms.longest_prompt_term(case.model, build_recipe(cfg).data, case.data_rows)["tokens"] or case.max_prompt_length
    micro = (case.ppo_max_token_len_per_gpu if case.use_dynamic_bsz
             else case.micro_batch_size_per_gpu * (min(prompt, case.max_prompt_length) + case.max_response_length))
    spec = budget.PlanSpec(
        model=case.model, gpu_gib=case.emulated_total_gib, n_gpus=1,
        gpu_memory_utilization=cfg.gpu_memory_utilization if util is None else util,
        max_prompt_length=case.max_prompt_length, max_response_length=case.max_response_length,
        train_batch_size=case.train_batch_size, group_size=case.rollout_n, micro_batch_tokens=micro,
        log_prob_micro_batch_tokens=micro, lora_rank=0, gradient_checkpointing=True,
        param_offload=case.param_offload, optimizer_offload=case.optimizer_offload,
        logits_path="torch_fp32",
    )
    if cfg.enforce_eager:
        spec = replace(spec, cudagraph_gib=0.0)
    elif (graphs := cuda_graphs_term(case.model)["gib"]) is not None:  # what vLLM took for this model
        spec = replace(spec, cudagraph_gib=graphs)
    if (actor := run_terms.actor_non_torch_term(n_gpus=1)["gib"]) is not None:
        spec = replace(spec, actor_non_torch_gib=actor)
    if not cfg.enforce_eager and (asleep := run_terms.vllm_asleep_term(case.model)["gib"]) is not None:
        spec = replace(spec, vllm_asleep_gib=asleep)
    options = [PATCH_PLANNER_OPTION[p] for p in case.patches if PATCH_PLANNER_OPTION[p]]
    if case.optimizer == "HostAdamW":
        options.append("cpu_optimizer_step")
    return budget.with_options(spec, options)


def planner_sweep(cfg: Config) -> list[dict[str, Any]]:
    """The planner at every value of ``sweep_utils``: KV pool, concurrency, GiB per phase, verdict."""
    rows = []
    for u in cfg.sweep_utils:
        p = verdict.plan(planner_spec(cfg, u))
        rows.append({"gpu_memory_utilization": u, "kv_pool_gib": p.kv_pool_gib,
                     "max_concurrent_seqs": p.max_concurrent_seqs, "rollout_waves": p.rollout_waves,
                     **{f"{ph}_gib": v for ph, v in p.device_total_gib.items()},
                     "peak_phase": p.peak_phase, "peak_gib": p.peak_gib, "verdict": p.verdict})
    return rows
