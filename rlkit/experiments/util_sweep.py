"""The gpu_memory_utilization sweep source document 003 never ran: planner vs measured (notebook 06).

One call of :func:`run` is one point of the sweep: the GRPO recipe of :mod:`rlkit.grpo` for one case
and one ``gpu_memory_utilization`` value, launched as ``python -m verl.trainer.main_ppo`` with a
:class:`rlkit.measure.MemorySampler` (NVML / nvidia-smi, 1 Hz) running beside it. From verl's console
and vLLM's log it reads the KV pool and concurrency vLLM reported, the size of its weights and CUDA
graphs, verl's per-step timings and memory metrics, vLLM's throughput statistics and any OOM; it
cuts the sampled device memory into verl's phases, and puts the derived planner's estimate
(:func:`rlkit.budget.plan`, same settings, the emulated card) next to every measured number with
their ratio. The document's cost metric is computed per run at a stated price per GPU-hour.

The sweep is a grid over ``gpu_memory_utilization``, one fresh verl job per value::

    rlkit run nbs/06_util_sweep.ipynb --profile h200 --grid gpu_memory_utilization=[0.4,0.5,0.6,0.7]
    # on a node without papermill, one folder per point:
    python -m rlkit.experiments.util_sweep --profile h200 -p case=doc_small -p gpu_memory_utilization=0.4 \
        --tag doc_small-u0.4

Emulating a smaller card: :mod:`rlkit.emulate_card` (``GRPORecipe.emulate_gpu_gib``). In every verl and
vLLM process ``torch.cuda.mem_get_info`` reports the emulated card (total ``E``; free = ``E`` minus what
all processes hold on the real device) and the allocator is capped at ``E``. vLLM 0.24 reserves
``ceil(total x gpu_memory_utilization)`` of that total (``request_memory`` in vllm/v1/worker/utils.py), so
``u`` keeps the document's meaning (a fraction of the small card) and is launched unchanged; weights,
profiling peak, CUDA graphs and the KV pool are sized as on the small card, its start-up check reads the
small card's free memory, and an actor that needs more than ``E`` raises a real OOM. The cap is per
process; the 1 Hz device-wide samples show what all processes held together, and the "exceeds the
emulated card" verdict is also read from them.

Without a CUDA GPU everything before the launch runs for real (inputs, overrides, verl's own config
validation, the planner); the measured side says "no GPU: not measured". Nothing is invented.
"""
from __future__ import annotations

import math
import os
import re
import sys
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, Literal

from rlkit import budget
from rlkit import params as P

NOTEBOOK = "06_util_sweep"
VLLM_STATS_INTERVAL_S = 2.0  # VLLM_LOG_STATS_INTERVAL for the launch (vLLM's default is 10 s)
# verl 0.9.1's V1 trainer waits for finished rollouts in polls of this period (verl/trainer/ppo/v1/replay_buffer.py
# ReplayBuffer poll_interval=2.0, _wait_for_next_poll), so timing_s/gen is known only to it: every gen time in
# outputs/06_util_sweep/ is 2k + 0.07-0.11 s.
VERL_ROLLOUT_POLL_S = 2.0
RELEASE_WAIT_S = 90.0  # after verl exits, wait this long at most for the device to return to idle


# ---------------------------------------------------------------------------------------------------
# cases and parameters
# ---------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Case:
    """What a case holds fixed across the sweep (every field also goes into metrics.json)."""

    description: str
    model: str  # rlkit.models preset, launched as a random-init checkpoint (no downloads)
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


# ---------------------------------------------------------------------------------------------------
# emulation
# ---------------------------------------------------------------------------------------------------

def emulation_info(cfg: Config) -> dict[str, Any]:
    case = cfg.case_spec
    return {
        "emulated_total_gib": case.emulated_total_gib,
        "gpu_memory_utilization": cfg.gpu_memory_utilization,
        "vllm_requested_gib": cfg.gpu_memory_utilization * case.emulated_total_gib,
        "rule": "rlkit.emulate_card: every verl / vLLM process sees and is capped at the emulated card; "
                "vLLM reserves ceil(emulated_total x util)",
    }


# ---------------------------------------------------------------------------------------------------
# recipe and planner for one point
# ---------------------------------------------------------------------------------------------------

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


def build_recipe(cfg: Config):
    from rlkit.grpo import GRPORecipe

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

    Micro-batch tokens: the dynamic-bsz token budget, or sequences per micro-batch x padded length (the
    node runs without remove-padding). Logits: the pure-torch path (no flash-attn on the node). CUDA
    graphs: the planner's default assumption unless enforce_eager.
    """
    case = cfg.case_spec
    micro = case.ppo_max_token_len_per_gpu if case.use_dynamic_bsz else case.micro_batch_size_per_gpu * case.seq_len
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
    options = [PATCH_PLANNER_OPTION[p] for p in case.patches if PATCH_PLANNER_OPTION[p]]
    if case.optimizer == "HostAdamW":
        options.append("cpu_optimizer_step")
    return budget.with_options(spec, options)


def planner_sweep(cfg: Config) -> list[dict[str, Any]]:
    """The planner at every value of ``sweep_utils``: KV pool, concurrency, GiB per phase, verdict."""
    rows = []
    for u in cfg.sweep_utils:
        p = budget.plan(planner_spec(cfg, u))
        rows.append({"gpu_memory_utilization": u, "kv_pool_gib": p.kv_pool_gib,
                     "max_concurrent_seqs": p.max_concurrent_seqs, "rollout_waves": p.rollout_waves,
                     **{f"{ph}_gib": v for ph, v in p.device_total_gib.items()},
                     "peak_phase": p.peak_phase, "peak_gib": p.peak_gib, "verdict": p.verdict})
    return rows


# ---------------------------------------------------------------------------------------------------
# log parsers (formats verified against the sources named; fixture: tests/fixtures/util_sweep_logs.txt)
# ---------------------------------------------------------------------------------------------------

_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_NUM = r"([0-9][0-9,]*(?:\.[0-9]+)?)"
# vLLM 0.24.0, vllm/v1/worker/gpu_model_runner.py load_model ("... GiB memory and %.6f seconds") and
# vllm/v1/worker/gpu/model_runner.py load_model ("... GiB and %.6f seconds"); format_gib rounds to 0.01.
_MODEL_LOADING = re.compile(r"Model loading took " + _NUM + r" GiB(?: memory)? and " + _NUM + " seconds")
# vllm/v1/worker/gpu_worker.py determine_available_memory: "Available KV cache memory: %s GiB".
_KV_MEMORY = re.compile(r"Available KV cache memory: " + _NUM + " GiB")
# vllm/v1/core/kv_cache_utils.py get_kv_cache_configs: "GPU KV cache size: %s tokens" (f"{n:,}") and
# "Maximum concurrency for %s tokens per request: %.2fx" (max_model_len as f"{n:,}").
_KV_TOKENS = re.compile(r"GPU KV cache size: " + _NUM + " tokens")
_CONCURRENCY = re.compile(r"Maximum concurrency for " + _NUM + r" tokens per request: " + _NUM + "x")
# gpu_model_runner.py capture_model / gpu/model_runner.py: "Graph capturing finished in %.0f secs, took %.2f GiB".
_GRAPHS = re.compile(r"Graph capturing finished in " + _NUM + r" secs, took " + _NUM + " GiB")
# vllm/v1/metrics/loggers.py LoggingStatLogger.log: "Engine 000: Avg prompt throughput: %.1f tokens/s,
# Avg generation throughput: %.1f tokens/s, Running: %d reqs, Waiting: %d reqs[, ...], GPU KV cache
# usage: %.1f%%, Prefix cache hit rate: %.1f%%".
_STATS = re.compile(r"Avg prompt throughput: " + _NUM + r" tokens/s, Avg generation throughput: " + _NUM
                    + r" tokens/s, Running: (\d+) reqs, Waiting: (\d+) reqs")
_KV_USAGE = re.compile(r"GPU KV cache usage: " + _NUM + "%")
# Sleep mode, one pair per sleep: vllm/device_allocator/cumem.py CuMemAllocator.sleep "CuMemAllocator: sleep
# freed %.2f GiB memory in total, ..." (the pool gpu_memory_utilization sizes: weights, KV cache), then
# vllm/v1/worker/gpu_worker.py Worker.sleep "Sleep mode freed %.2f GiB memory, %.2f GiB memory is still in
# use." (torch.cuda.mem_get_info before and after: the whole device, after the allocator's sleep has emptied
# PyTorch's cache). verl sleeps the engine once after start-up and once after every rollout.
_SLEEP_POOL = re.compile(r"CuMemAllocator: sleep freed " + _NUM + " GiB")
_SLEEP_DEVICE = re.compile(r"Sleep mode freed " + _NUM + " GiB memory, " + _NUM + " GiB memory is still in use")
# verl 0.9.1 verl/utils/profiler/performance.py log_gpu_memory_usage: "{head}, memory allocated (GB): {a},
# memory reserved (GB): {r}, device memory used/total (GB): {u}/{t}" (GB there = 2**30 bytes).
_VERL_MEMORY = re.compile(r"^(?:\([^)]*pid=\d+[^)]*\)\s*)?(.*?), memory allocated \(GB\): " + _NUM
                          + r", memory reserved \(GB\): " + _NUM + r", device memory used/total \(GB\): "
                          + _NUM + "/" + _NUM)
# torch c10/cuda/CUDACachingAllocator.cpp: "CUDA out of memory. Tried to allocate <size>. GPU <n> has a
# total capacity of ..." raised as torch.OutOfMemoryError.
_TORCH_OOM = re.compile(r"CUDA out of memory\. Tried to allocate ([0-9.]+ [KMGT]?i?B)")
_TORCH_OOM_TYPE = re.compile(r"torch\.(?:cuda\.)?OutOfMemoryError")
# vLLM 0.24.0 vllm/v1/worker/utils.py request_memory: "Free memory on device <d> (<free>/<total> GiB) on
# startup is less than desired GPU memory utilization (<u>, <r> GiB)".
_VLLM_STARTUP = re.compile(r"Free memory on device \S+ \(" + _NUM + "/" + _NUM + r" GiB\) on startup is less "
                           r"than desired GPU memory utilization \(" + _NUM + ", " + _NUM + r" GiB\)")
# vllm/v1/core/kv_cache_utils.py _check_enough_kv_cache_memory: "No available memory for the cache blocks."
_NO_KV = re.compile(r"No available memory for the cache blocks")


def _f(text: str) -> float:
    return float(text.replace(",", ""))


def parse_vllm_log(text: str) -> dict[str, Any]:
    """What vLLM reported at start-up (one entry per engine, in log order), its throughput statistics and
    what each sleep freed (in log order: after start-up, then after each rollout)."""
    text = _ANSI.sub("", text)
    stats = []
    for line in text.splitlines():
        m = _STATS.search(line)
        if m:
            usage = _KV_USAGE.search(line)
            stats.append({"prompt_tok_s": _f(m.group(1)), "generation_tok_s": _f(m.group(2)),
                          "running_reqs": int(m.group(3)), "waiting_reqs": int(m.group(4)),
                          "kv_cache_usage_pct": _f(usage.group(1)) if usage else None})
    return {
        "model_loading_gib": [_f(m.group(1)) for m in _MODEL_LOADING.finditer(text)],
        "kv_cache_gib": [_f(m.group(1)) for m in _KV_MEMORY.finditer(text)],
        "kv_cache_tokens": [int(_f(m.group(1))) for m in _KV_TOKENS.finditer(text)],
        "max_concurrency": [{"max_model_len": int(_f(m.group(1))), "concurrency": _f(m.group(2))}
                            for m in _CONCURRENCY.finditer(text)],
        "cuda_graphs": [{"seconds": _f(m.group(1)), "gib": _f(m.group(2))} for m in _GRAPHS.finditer(text)],
        "stats": stats,
        "sleeps": [{"pool_freed_gib": _f(pool.group(1)), "device_freed_gib": _f(dev.group(1)),
                    "still_in_use_gib": _f(dev.group(2))}
                   for pool, dev in zip(_SLEEP_POOL.finditer(text), _SLEEP_DEVICE.finditer(text))],
    }


def parse_verl_memory(text: str) -> list[dict[str, Any]]:
    """verl's ``log_gpu_memory_usage`` lines: label, allocated / reserved GiB of the process, device used/total."""
    rows = []
    for line in _ANSI.sub("", text).splitlines():
        m = _VERL_MEMORY.search(line.strip())
        if m:
            rows.append({"label": m.group(1).strip(), "allocated_gib": _f(m.group(2)), "reserved_gib": _f(m.group(3)),
                         "device_used_gib": _f(m.group(4)), "device_total_gib": _f(m.group(5))})
    return rows


# Which verl phase a failure belongs to, from names in the traceback (Ray task-error lines name the remote
# method, e.g. ``ray::WorkerDict.actor_rollout_update_actor()``). Checked in this order.
_FAILURE_PHASES = (
    ("update_actor", ("update_actor", "train_batch", "train_mini_batch", "optimizer_step")),
    ("ref", ("compute_ref_log_prob",)),
    ("old_log_prob", ("compute_log_prob", "infer_batch")),
    ("update_weights", ("update_weights", "checkpoint_engine", "wake_up")),
    ("gen", ("generate", "execute_model", "EngineCore")),
    ("init", ("init_model", "profile_run", "determine_available_memory", "initialize_kv_cache", "load_model")),
)


def _failure_phase(window: list[str]) -> str:
    ray_lines = [line for line in window if "ray::" in line or "RayTaskError" in line]
    for lines in (ray_lines, window):
        for phase, keys in _FAILURE_PHASES:
            if any(k in line for line in lines for k in keys):
                return phase
    return "unknown"


def find_failure(text: str, context: int = 80) -> dict[str, Any] | None:
    """The first memory failure in a verl/vLLM log: kind, phase, the message line; None when there is none.

    Kinds: ``vllm_startup`` (vLLM refused: not enough free memory for its reservation), ``no_kv_cache``
    (reservation smaller than weights + profile peak), ``torch_oom`` (a CUDA allocation failed).
    """
    lines = _ANSI.sub("", text).splitlines()
    for i, line in enumerate(lines):
        m = _VLLM_STARTUP.search(line)
        if m:
            return {"kind": "vllm_startup", "phase": "init", "line": line.strip(),
                    "free_gib": _f(m.group(1)), "total_gib": _f(m.group(2)), "requested_gib": _f(m.group(4))}
        if _NO_KV.search(line):
            return {"kind": "no_kv_cache", "phase": "init", "line": line.strip()}
        m = _TORCH_OOM.search(line)
        if m or _TORCH_OOM_TYPE.search(line):
            window = lines[max(0, i - context): i + context]
            return {"kind": "torch_oom", "phase": _failure_phase(window), "line": line.strip(),
                    "tried_to_allocate": m.group(1) if m else None}
    return None


# ---------------------------------------------------------------------------------------------------
# phases: verl's step timings placed on the sampler's clock
# ---------------------------------------------------------------------------------------------------

def phase_intervals(steps: list[dict[str, Any]], logged_at: dict[int, float]) -> list[dict[str, Any]]:
    """Where each phase of each trained step lay on the sampler's clock.

    verl prints a step's metrics when the step has ended; ``logged_at[step]`` is when that line reached us.
    The step is placed to end there and to last ``timing_s/step``. In the sync V1 trainer
    (verl/trainer/ppo/v1/trainer_base.py ``_step_once`` and trainer_sync.py ``on_step_end``) the phases run
    gen, reward, old_log_prob, ref, adv, update_actor and update_weights last. They are laid backward from
    the step's end, and gen runs from the step's start to the next phase: the part of a step no timer
    covers lies in the rollout. Measured: the first step of every run in outputs/06_util_sweep/ has 21-23 s
    outside its timed phases (0.12-0.14 s in step 2), and vLLM logged "wake up" that long before its first request while
    ``timing_s/gen`` counted only the generation (the agent loop's start-up; the device samples show the
    awake KV pool through it). Laid forward, that gap pushed every later phase of step 1 early by its
    length. Accuracy: Ray's log forwarding delay plus the small untimed parts between later phases
    (batch balancing, metrics).
    """
    from rlkit.grpo import PHASES

    out = []
    for s in steps:
        n, total = s.get("step"), s.get("timing_s/step")
        if n not in logged_at or not isinstance(total, (int, float)):
            continue
        end = logged_at[n]
        start = end - float(total)
        cursor = end
        laid = []
        for phase in reversed(PHASES[1:]):
            seconds = s.get(f"timing_s/{phase}")
            if isinstance(seconds, (int, float)):
                laid.append({"step": n, "phase": phase, "start": max(start, cursor - float(seconds)), "end": cursor})
                cursor = laid[-1]["start"]
        if isinstance(s.get(f"timing_s/{PHASES[0]}"), (int, float)):
            laid.append({"step": n, "phase": PHASES[0], "start": start, "end": cursor})
        out.extend(reversed(laid))
        out.append({"step": n, "phase": "step", "start": start, "end": end})
    return out


def label_samples(samples: list[tuple[float, list[float]]], intervals: list[dict[str, Any]],
                  launch_t: float) -> list[dict[str, Any]]:
    """Timeline rows: t, used GiB (the most loaded GPU), phase and step.

    Phase ``idle`` before the launch, ``init`` from the launch to the first step, the verl phase inside a
    step (``other`` in its untimed gaps), ``shutdown`` after the last step.
    """
    steps = [iv for iv in intervals if iv["phase"] == "step"]
    inner = [iv for iv in intervals if iv["phase"] != "step"]
    first = min((iv["start"] for iv in steps), default=math.inf)
    last = max((iv["end"] for iv in steps), default=math.inf)
    rows = []
    for t, used in samples:
        phase, step = "other", None
        if t < launch_t:
            phase = "idle"
        elif t < first:
            phase = "init"
        elif t > last:
            phase = "shutdown"
        else:
            for iv in steps:
                if iv["start"] <= t <= iv["end"]:
                    step = iv["step"]
            for iv in inner:
                if iv["start"] <= t <= iv["end"]:
                    phase, step = iv["phase"], iv["step"]
                    break
        rows.append({"t": round(t, 3), "used_gib": max(used) if used else None, "phase": phase, "step": step})
    return rows


def phase_peaks(timeline: list[dict[str, Any]], baseline_gib: float) -> dict[str, dict[str, Any]]:
    """Per phase: peak device GiB (all processes), the same minus the idle baseline, sample count, and the
    peak per step. A phase shorter than the sampling period may have no sample (then it is absent)."""
    out: dict[str, dict[str, Any]] = {}
    for row in timeline:
        if row["used_gib"] is None:
            continue
        entry = out.setdefault(row["phase"], {"peak_used_gib": -math.inf, "samples": 0, "by_step": {}})
        entry["samples"] += 1
        entry["peak_used_gib"] = max(entry["peak_used_gib"], row["used_gib"])
        if row["step"] is not None:
            key = str(row["step"])
            entry["by_step"][key] = max(entry["by_step"].get(key, -math.inf), row["used_gib"])
    for entry in out.values():
        entry["peak_job_gib"] = entry["peak_used_gib"] - baseline_gib
    return out


# ---------------------------------------------------------------------------------------------------
# the measured side of one run
# ---------------------------------------------------------------------------------------------------

def process_peaks(process_samples: list[tuple[float, list[list]]], intervals: list[dict[str, Any]],
                  launch_t: float) -> dict[str, dict[str, float]]:
    """Per phase, the peak GiB each process held (``"<title> [pid]"``), from per-process samples
    (:func:`rlkit.measure.gpu_process_memory_reader`) on the device sampler's clock."""
    rows = label_samples([(t, [0.0]) for t, _ in process_samples], intervals, launch_t)
    out: dict[str, dict[str, float]] = {}
    for row, (_, held) in zip(rows, process_samples):
        entry = out.setdefault(row["phase"], {})
        for pid, gib, name in held:
            key = f"{name or 'process'} [{pid}]"
            entry[key] = max(entry.get(key, 0.0), gib)
    return out


def measure_from_logs(log_text: str, samples: list[tuple[float, list[float]]], marks: list[tuple[float, str]],
                      case: Case, wall_s: float, returncode: Any,
                      process_samples: list[tuple[float, list[list]]] | None = None) -> dict[str, Any]:
    """Everything measured about one verl job, from its log and the sampler's samples and marks.

    ``marks``: ``(t, "launch")`` when verl started and ``(t, "logged:step<N>")`` when step N's metrics line
    arrived (the sampler's clock). ``process_samples``: ``(t, [[pid, GiB, title], ...])`` on the same clock,
    where per-process memory could be read.
    """
    from rlkit.grpo import parse_console_metrics, summarize, training_steps

    steps = parse_console_metrics(log_text)
    trained = training_steps(steps)
    launch_t = next((t for t, name in marks if name == "launch"), 0.0)
    logged_at = {int(name.split("step", 1)[1]): t for t, name in marks if name.startswith("logged:step")}
    intervals = phase_intervals(trained, logged_at)
    timeline = label_samples(samples, intervals, launch_t)
    idle = [r["used_gib"] for r in timeline if r["phase"] == "idle" and r["used_gib"] is not None]
    baseline = min(idle) if idle else 0.0
    summary = summarize(steps)
    vllm = parse_vllm_log(log_text)
    verl_mem_keys = ("actor/perf/max_memory_allocated_gb", "actor/perf/max_memory_reserved_gb")
    verl_memory = {k.rsplit("/", 1)[-1]: max((s[k] for s in trained if isinstance(s.get(k), (int, float))), default=None)
                   for k in verl_mem_keys}
    gen_s = summary.get("gen_s")
    gen_tok = [s["generation_tok_s"] for s in vllm["stats"] if s["generation_tok_s"] > 0]
    failure = find_failure(log_text)
    return {
        "returncode": returncode,
        "wall_s": wall_s,
        "steps_logged": len(trained),
        "steps": steps,
        "summary": summary,
        "step_s": summary.get("step_s"),
        "rollout_samples_per_s": case.samples_per_step / gen_s if gen_s else None,
        "vllm": vllm,
        "vllm_generation_tok_s_peak": max(gen_tok) if gen_tok else None,
        "verl_memory": verl_memory,
        "verl_memory_log": parse_verl_memory(log_text),
        "failure": failure,
        "update_oom": bool(failure and failure["kind"] == "torch_oom" and failure["phase"] == "update_actor"),
        "baseline_used_gib": baseline,
        "phase_intervals": intervals,
        "phase_peaks": phase_peaks(timeline, baseline),
        "timeline": timeline,
        "marks": [[t, name] for t, name in marks],
        "process_samples": [[t, held] for t, held in process_samples] if process_samples is not None else None,
        "process_phase_peaks": process_peaks(process_samples, intervals, launch_t) if process_samples else None,
    }


def launch_measured(recipe, overrides: list[str], out_dir: Path, cfg: Config) -> dict[str, Any]:
    """Run verl with the GPU sampler beside it; returns :func:`measure_from_logs` plus launch facts.

    A memory failure (OOM, vLLM refusing to start) is a result and is returned; any other failure raises.
    """
    from rlkit.grpo import check_plugin_records, clear_plugin_records, command, launch_env, run_in_own_session
    from rlkit.measure import MemorySampler

    record_dir = out_dir / "plugin_records"
    clear_plugin_records(record_dir)
    log_path = out_dir / "verl.log"
    env = launch_env(recipe, record_dir)
    env["VLLM_LOG_STATS_INTERVAL"] = str(VLLM_STATS_INTERVAL_S)
    step_line = re.compile(r"(?:^|[\s)])step:(\d+) - .*timing_s/step:")
    sampler = MemorySampler(interval_s=cfg.sample_interval_s).start()
    processes, process_source = _process_sampler(cfg.sample_interval_s, sampler.origin)
    time.sleep(3 * cfg.sample_interval_s)  # idle samples: the baseline the job's memory is measured from
    sampler.mark("launch")

    def mark_step(line: str) -> None:
        m = step_line.search(_ANSI.sub("", line))
        if m:
            sampler.mark(f"logged:step{m.group(1)}")

    returncode, wall = run_in_own_session(command(overrides), env=env, cwd=out_dir, log_path=log_path,
                                          timeout_s=cfg.timeout_s, on_line=mark_step)
    sampler.mark("exited")
    released = _wait_for_release(sampler, RELEASE_WAIT_S)
    sampler.stop()
    if processes is not None:
        processes.stop()
    text = log_path.read_text(errors="replace")
    measured = measure_from_logs(text, sampler.samples, sampler.marks, cfg.case_spec, wall, returncode,
                                 processes.samples if processes is not None else None)
    measured.update(log_path=str(log_path), sampler={"source": sampler.source, "interval_s": sampler.interval_s,
                    "samples": len(sampler.samples), "per_process": process_source}, device_released_after_s=released)
    if measured["failure"] is None and (returncode != 0 or measured["steps_logged"] < cfg.steps):
        tail = "\n".join(text.splitlines()[-40:])
        raise RuntimeError(f"verl exited with {measured['returncode']} after {wall:.0f} s having logged "
                           f"{measured['steps_logged']}/{cfg.steps} steps and no memory failure; log {log_path}; "
                           f"last lines:\n{tail}")
    if measured["failure"] is None:
        measured["plugin_records"] = check_plugin_records(record_dir, recipe.patches, require_worker=True)
    return measured


def _process_sampler(interval_s: float, origin: float):
    """A started per-process sampler on the device sampler's clock and its source, or ``(None, why not)``."""
    from rlkit.measure import MemorySampler, SamplerUnavailable, gpu_process_memory_reader

    try:
        reader = gpu_process_memory_reader()
    except SamplerUnavailable as err:
        return None, f"unavailable: {err}"
    return MemorySampler(interval_s=interval_s, reader=reader, source="per-process", origin=origin).start(), "per-process"


def _wait_for_release(sampler, limit_s: float) -> float | None:
    """Seconds until the device is back within 1 GiB of its idle baseline (None: not within ``limit_s``).

    The next point of the sweep must start on an idle device: vLLM's memory profiling fails when another
    process frees memory meanwhile (notes/gpu-node.md).
    """
    idle = [max(u) for t, u in sampler.samples if u and t < sampler.marks[0][0]]
    baseline = min(idle) if idle else 0.0
    start = time.time()
    while time.time() - start < limit_s:
        if sampler.samples and max(sampler.samples[-1][1] or [0.0]) <= baseline + 1.0:
            return time.time() - start
        time.sleep(sampler.interval_s)
    return None


# ---------------------------------------------------------------------------------------------------
# planner vs measured, cost
# ---------------------------------------------------------------------------------------------------

# verl phase (sampled) -> planner phases it covers.
PHASE_MAP = {"gen": ("rollout",), "old_log_prob": ("log_prob",), "update_actor": ("update_fwd_bwd", "optimizer_step"),
             "update_weights": ("weight_sync",)}
TOLERANCE = 0.10  # the issue's bar: planner within 10% of the measurement
# A phase's peak is compared only when the sampler saw it this many times: update_weights lasts about 1 s, and
# at 1 Hz its one or two samples fall on either side of vLLM waking up (29.1 vs 42.2 GiB in two runs of one case).
MIN_PHASE_SAMPLES = 3


def _first(values: list) -> Any:
    return values[0] if values else None


def comparison_rows(plan: dict[str, Any], measured: dict[str, Any] | None, case: Case) -> list[dict[str, Any]]:
    """Planner | measured | ratio (measured / planner) for every quantity both sides have.

    ``measured`` None (no GPU): the rows carry the planner's numbers and ``measured`` None.
    """
    m = measured or {}
    vllm = m.get("vllm") or {}
    peaks = m.get("phase_peaks") or {}
    concurrency = _first(vllm.get("max_concurrency", []))
    graphs = _first(vllm.get("cuda_graphs", []))
    rollout = plan["device_gib"]["rollout"]
    actor_peak = max(sum(v for c, v in comps.items() if c in budget.ACTOR_ALLOCATED_COMPONENTS)
                     for comps in plan["device_gib"].values())
    rows = [
        ("vllm_weights_gib", rollout.get("vllm_weights_bf16", 0.0), _first(vllm.get("model_loading_gib", [])),
         "vLLM 'Model loading took'"),
        ("cuda_graphs_gib", rollout.get("cuda_graphs", 0.0), graphs["gib"] if graphs else None,
         "vLLM 'Graph capturing finished ... took'"),
        ("kv_pool_gib", plan["kv_pool_gib"], _first(vllm.get("kv_cache_gib", [])), "vLLM 'Available KV cache memory'"),
        ("max_concurrent_seqs", plan["max_concurrent_seqs"],
         concurrency["concurrency"] if concurrency and concurrency["max_model_len"] == case.seq_len else None,
         f"vLLM 'Maximum concurrency for {case.seq_len:,} tokens per request'"),
        ("actor_peak_allocated_gib", actor_peak, (m.get("verl_memory") or {}).get("max_memory_allocated_gb"),
         "verl actor/perf/max_memory_allocated_gb (process peak since start)"),
    ]
    too_short = set()
    for verl_phase, planner_phases in PHASE_MAP.items():
        estimate = max((plan["device_total_gib"].get(p, 0.0) for p in planner_phases), default=0.0)
        entry = peaks.get(verl_phase, {})
        source = f"device used during {verl_phase} minus idle baseline ({'+'.join(planner_phases)})"
        if entry and entry["samples"] < MIN_PHASE_SAMPLES:
            too_short.add(f"peak_{verl_phase}_gib")
            source += f"; {entry['samples']} samples: too short to compare at this sampling rate"
        rows.append((f"peak_{verl_phase}_gib", estimate, entry.get("peak_job_gib"), source))
    out = []
    for quantity, estimate, value, source in rows:
        ratio = value / estimate if value is not None and estimate and quantity not in too_short else None
        out.append({"quantity": quantity, "planner": estimate, "measured": value, "ratio": ratio,
                    "off_by_more_than_10pct": None if ratio is None else abs(ratio - 1.0) > TOLERANCE,
                    "measured_source": source})
    return out


def update_breakdown(measured: dict[str, Any] | None, plan: dict[str, Any]) -> dict[str, Any] | None:
    """The update phase's device peak split by what verl reports for the actor process, next to the planner.

    verl's ``max_memory_allocated_gb`` / ``max_memory_reserved_gb`` are the actor process's peaks since start
    (the update holds both in these runs). ``allocator_cache_gib`` = reserved - allocated: blocks torch's
    caching allocator keeps after freeing them, which the device sees and the planner (a model of allocated
    bytes) does not. ``rest_gib`` = device peak - actor reserved: what the other holders kept meanwhile (the
    actor's CUDA context, the sleeping vLLM engine with its CUDA graphs), against the planner's
    non-allocated parts.
    """
    if not measured:
        return None
    peak = (measured.get("phase_peaks") or {}).get("update_actor", {}).get("peak_job_gib")
    verl = measured.get("verl_memory") or {}
    allocated, reserved = verl.get("max_memory_allocated_gb"), verl.get("max_memory_reserved_gb")
    if peak is None or allocated is None or reserved is None:
        return None
    phase = max(PHASE_MAP["update_actor"], key=lambda p: plan["device_total_gib"].get(p, 0.0))
    comps = plan["device_gib"][phase]
    planner_actor = sum(v for c, v in comps.items() if c in budget.ACTOR_ALLOCATED_COMPONENTS)
    planner_rest = sum(v for c, v in comps.items() if c not in budget.ACTOR_ALLOCATED_COMPONENTS)
    return {"device_peak_gib": peak, "actor_allocated_gib": allocated, "actor_reserved_gib": reserved,
            "allocator_cache_gib": reserved - allocated, "rest_gib": peak - reserved,
            "needed_without_cache_gib": allocated + peak - reserved,
            "planner_phase": phase, "planner_actor_allocated_gib": planner_actor, "planner_rest_gib": planner_rest,
            "planner_device_gib": planner_actor + planner_rest}


def emulated_verdict(measured: dict[str, Any] | None, emulated_total_gib: float,
                     plan: dict[str, Any] | None = None) -> dict[str, Any] | None:
    """Whether the run would fit the emulated card (inferred, not an observed OOM).

    The cap is per process, so the device-wide samples can exceed the card: the actor's allocator may fill
    its own cap with cache while the sleeping vLLM engine holds more beside it. The update is judged on what
    it needs without that cache (``needed_without_cache_gib`` of :func:`update_breakdown`; torch frees
    cached blocks and retries before it raises an OOM); other phases on their device peaks.
    """
    if not measured or not measured.get("phase_peaks"):
        return None
    over = {ph: e["peak_job_gib"] for ph, e in measured["phase_peaks"].items()
            if ph in PHASE_MAP and e["peak_job_gib"] > emulated_total_gib}
    breakdown = update_breakdown(measured, plan) if plan else None
    update_fits = None if breakdown is None else breakdown["needed_without_cache_gib"] <= emulated_total_gib
    failing = [ph for ph in over if ph != "update_actor" or update_fits is not True]
    if not over:
        verdict = "fits the emulated card"
    elif failing:
        verdict = "exceeds the emulated card in " + ", ".join(failing)
    else:
        verdict = (f"fits the emulated card without the actor's allocator cache (update needs "
                   f"{breakdown['needed_without_cache_gib']:.2f} GiB; device-wide peak {over['update_actor']:.2f} GiB "
                   f"with {breakdown['allocator_cache_gib']:.2f} GiB cached)")
    return {"emulated_total_gib": emulated_total_gib, "phases_over": over, "update_fits": update_fits,
            "update_breakdown": breakdown, "verdict": verdict}


def cost_summary(measured: dict[str, Any] | None, case: Case, price_per_gpu_hour: float,
                 n_gpus: int = 1) -> dict[str, Any] | None:
    """The document's metric, cost per million rollout samples = n_gpus x price x hours / samples_millions:
    at steady state (one step's time for one step's samples) and for the whole job (launch to exit,
    start-up included, for every logged step's samples)."""
    if not measured or not measured.get("step_s"):
        return None
    samples = case.samples_per_step
    steady = budget.cost_per_million_samples(n_gpus, price_per_gpu_hour, measured["step_s"] / 3600, samples)
    whole = budget.cost_per_million_samples(n_gpus, price_per_gpu_hour, measured["wall_s"] / 3600,
                                            samples * measured["steps_logged"])
    return {"price_per_gpu_hour": price_per_gpu_hour, "n_gpus": n_gpus, "samples_per_step": samples,
            "steady_state_usd_per_million_samples": steady, "whole_job_usd_per_million_samples": whole,
            "formula": "n_gpus x price_per_gpu_hour x wallclock_hours / samples_millions"}


# ---------------------------------------------------------------------------------------------------
# one run
# ---------------------------------------------------------------------------------------------------

def point_metrics(cfg: Config, emulation: dict[str, Any], measured: dict[str, Any] | None,
                  launch_reason: str) -> dict[str, Any]:
    """The planner and measured side of one point: planner at this and every sweep value, the measurement
    (None without a GPU), planner-vs-measured rows, the emulated-card verdict and the cost metric."""
    case = cfg.case_spec
    plan = budget.plan(planner_spec(cfg)).as_dict()
    return {
        "units": "GiB",
        "config": P.as_dict(cfg),
        "case": {"name": cfg.case, **{k: list(v) if isinstance(v, tuple) else v for k, v in asdict(case).items()}},
        "emulation": emulation,
        "planner": plan,
        "planner_sweep": planner_sweep(cfg),
        "launched": measured is not None,
        "launch_reason": launch_reason,
        "measured": measured,
        "comparison": comparison_rows(plan, measured, case),
        "emulated_verdict": emulated_verdict(measured, case.emulated_total_gib, plan),
        "cost": cost_summary(measured, case, cfg.price_per_gpu_hour),
    }


def run(cfg: Config, out_dir: str | os.PathLike | None = None) -> dict[str, Any]:
    """One point of the sweep; returns ``metrics.json`` content (keys: :data:`METRICS_KEYS`)."""
    from rlkit import grpo
    from rlkit.results import notebook_out_dir

    out = Path(out_dir) if out_dir else notebook_out_dir(NOTEBOOK)
    out.mkdir(parents=True, exist_ok=True)
    emulation = emulation_info(cfg)
    recipe = build_recipe(cfg)
    have = grpo.gpu_count()
    paths, data_info, model_info = grpo.prepare_inputs_isolated(recipe) if have else grpo.prepare_inputs(recipe)
    overrides = grpo.render_overrides(recipe, paths, out)
    preflight = grpo.preflight_findings(recipe, overrides)
    verify = grpo.verify_subprocess(recipe, overrides, out)
    launched = cfg.launch == "always" or (cfg.launch == "auto" and have >= 1)
    reason = (f"launched on {have} CUDA GPU(s)" if launched else
              f"no GPU: not measured ({have} CUDA GPUs visible, launch={cfg.launch}). Run "
              f"`python -m rlkit.experiments.util_sweep --profile h200` on a GPU node, then render its results "
              f"folder with results_dir")
    print(reason)
    measured = launch_measured(recipe, overrides, out, cfg) if launched else None
    return {
        **point_metrics(cfg, emulation, measured, reason),
        "recipe": P.as_dict(recipe),
        "data": data_info,
        "model": model_info,
        "overrides": overrides,
        "command": grpo.shell_command(recipe, overrides),
        "preflight": preflight,
        "verify": verify,
    }


def saved_samples_and_marks(measured: dict[str, Any]) -> tuple[list[tuple[float, list[float]]], list[tuple[float, str]]]:
    """The sampler's samples and marks of a saved run, for analysing it again.

    Runs saved before ``marks`` was stored: the launch mark is the first sample not labelled idle (the
    labels depend on it only through that comparison) and each step's logged mark is its interval's end.
    The timeline stores the most loaded GPU's GiB, which is what the labels and peaks are computed from.
    """
    timeline = measured["timeline"]
    samples = [(row["t"], [] if row["used_gib"] is None else [row["used_gib"]]) for row in timeline]
    if measured.get("marks"):
        return samples, [(float(t), str(name)) for t, name in measured["marks"]]
    launch = next((row["t"] for row in timeline if row["phase"] != "idle"), math.inf)
    marks = [(launch, "launch")] + [(iv["end"], f"logged:step{iv['step']}") for iv in measured["phase_intervals"]
                                    if iv["phase"] == "step"]
    return samples, marks


def reanalyze(folder: str | os.PathLike) -> dict[str, Any]:
    """A saved run analysed again by this code: its ``verl.log`` and saved samples, the current planner.

    Rewrites ``metrics.json`` in place (atomically). What the node measured (log, samples, wall time,
    return code, plugin records) is kept; what is derived from it (phase placement, peaks, planner, the
    comparison, verdict, cost) is recomputed, and ``analysis`` records the commit that did it.
    """
    from rlkit.env import git_sha
    from rlkit.measure import write_json_atomic
    from rlkit.results import read_metrics

    path = Path(folder)
    metrics = read_metrics(path)
    old = metrics.get("measured")
    if not old:
        raise ValueError(f"{path}/metrics.json has no measurement to analyse again (launched: "
                         f"{metrics.get('launched')}); run the point on a GPU node first")
    log_path = path / "verl.log"
    if not log_path.exists():
        raise FileNotFoundError(f"{log_path} is missing: the run's console log is the input of the analysis")
    cfg = P.build(Config, metrics["config"], where=f"{path}/metrics.json config")
    samples, marks = saved_samples_and_marks(old)
    process_samples = [(t, held) for t, held in old["process_samples"]] if old.get("process_samples") else None
    measured = measure_from_logs(log_path.read_text(errors="replace"), samples, marks, cfg.case_spec,
                                 old["wall_s"], old["returncode"], process_samples)
    for kept in ("log_path", "sampler", "device_released_after_s", "plugin_records"):
        if kept in old:
            measured[kept] = old[kept]
    history = list((metrics.get("analysis") or {}).get("history", []))
    history.append({"rlkit_sha": git_sha(), "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())})
    metrics.update(point_metrics(cfg, metrics["emulation"], measured, metrics["launch_reason"]))
    metrics["analysis"] = {"source": "verl.log and the saved 1 Hz samples, analysed again", "history": history}
    write_json_atomic(path / "metrics.json", metrics)
    return metrics


METRICS_KEYS = ("units", "config", "case", "emulation", "recipe", "data", "model", "overrides", "command",
                "preflight", "verify", "planner", "planner_sweep", "launched", "launch_reason", "measured",
                "comparison", "emulated_verdict", "cost")


# ---------------------------------------------------------------------------------------------------
# rendering a sweep (notebook side)
# ---------------------------------------------------------------------------------------------------

def read_results(results_dir: str | os.PathLike) -> dict[str, Any]:
    """Saved results: one run's folder (its ``metrics.json``) or a folder of run folders (the notebook's
    scratch folder ``interactive`` is skipped).

    Returns ``{"units", "runs": [metrics, ...]}`` sorted by case then utilization; a run folder gets its
    folder name as ``tag``.
    """
    from rlkit.env import REPO_ROOT
    from rlkit.results import read_metrics

    path = Path(results_dir)
    path = path if path.is_absolute() else REPO_ROOT / path
    folders = [path] if (path / "metrics.json").exists() else (
        sorted(p for p in path.iterdir() if (p / "metrics.json").exists() and p.name != "interactive")
        if path.is_dir() else [])
    if not folders:
        raise FileNotFoundError(f"{path} holds no metrics.json, directly or in sub-folders; fix results_dir")
    runs = []
    for folder in folders:
        metrics = read_metrics(folder)
        if "runs" in metrics:  # a notebook's rendering of saved runs: as such when named, else its runs are elsewhere
            if folder == path:
                return metrics
        elif "emulation" in metrics:
            runs.append({**metrics, "tag": folder.name})
    runs.sort(key=lambda m: (m["case"]["name"], m["config"]["gpu_memory_utilization"]))
    return {"units": "GiB", "runs": runs}


def runs_of(metrics: dict[str, Any]) -> list[dict[str, Any]]:
    """The runs in ``metrics``: a rendering of saved results, or one fresh run."""
    return metrics.get("runs", [metrics])


def sweep_rows(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per run: the issue's columns (KV pool, concurrency, peaks, samples/s, step time, OOM, cost).

    ``rollout_samples_per_s`` divides by verl's rollout time, which moves in polls of
    :data:`VERL_ROLLOUT_POLL_S`; the rollout may have ended up to one poll earlier, so
    ``rollout_samples_per_s_upper`` is the rate if it ended right after the previous poll."""
    rows = []
    for r in runs:
        m = r.get("measured") or {}
        vllm = m.get("vllm") or {}
        peaks = m.get("phase_peaks") or {}
        conc = _first(vllm.get("max_concurrency", []))
        failure = m.get("failure") or {}
        cost = r.get("cost") or {}
        gen_s = (m.get("summary") or {}).get("gen_s")
        rows.append({
            "case": r["case"]["name"], "util": r["config"]["gpu_memory_utilization"],
            "emulated_gib": r["emulation"]["emulated_total_gib"], "measured": bool(m),
            "kv_pool_gib": _first(vllm.get("kv_cache_gib", [])), "kv_tokens": _first(vllm.get("kv_cache_tokens", [])),
            "max_concurrency": conc["concurrency"] if conc else None,
            **{f"peak_{ph}_gib": peaks.get(ph, {}).get("peak_job_gib") for ph in PHASE_MAP},
            "kv_use_peak_pct": max((s["kv_cache_usage_pct"] for s in vllm.get("stats", [])
                                    if s["kv_cache_usage_pct"] is not None), default=None),
            "waiting_reqs_max": max((s["waiting_reqs"] for s in vllm.get("stats", [])), default=None),
            "rollout_samples_per_s": m.get("rollout_samples_per_s"), "gen_s": gen_s,
            "rollout_samples_per_s_upper": (m["rollout_samples_per_s"] * gen_s / (gen_s - VERL_ROLLOUT_POLL_S)
                                            if m.get("rollout_samples_per_s") and gen_s and gen_s > VERL_ROLLOUT_POLL_S else None),
            "step_s": m.get("step_s"),
            "failure": f"{failure['kind']} in {failure['phase']}" if failure else None,
            "update_oom": m.get("update_oom"),
            "emulated": (r.get("emulated_verdict") or {}).get("verdict"),
            "actor_allocated_gib": (m.get("verl_memory") or {}).get("max_memory_allocated_gb"),
            "update_needed_without_cache_gib": ((r.get("emulated_verdict") or {}).get("update_breakdown") or {}).get(
                "needed_without_cache_gib"),
            "usd_per_M_samples": cost.get("steady_state_usd_per_million_samples"),
            "planner_kv_pool_gib": r["planner"]["kv_pool_gib"], "planner_verdict": r["planner"]["verdict"],
        })
    return rows


def comparison_table(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every run's planner-vs-measured rows, labelled by case and utilization."""
    return [{"case": r["case"]["name"], "util": r["config"]["gpu_memory_utilization"], **row}
            for r in runs for row in r["comparison"]]


def first_update_oom(runs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per case: the smallest utilization whose update phase OOMed (observed) and whose update would not fit
    the emulated card (inferred by :func:`emulated_verdict`); None where no run did."""
    out: dict[str, dict[str, Any]] = {}
    for r in sorted(runs, key=lambda r: r["config"]["gpu_memory_utilization"]):
        entry = out.setdefault(r["case"]["name"], {"observed": None, "inferred": None, "measured_runs": 0})
        m = r.get("measured")
        if not m:
            continue
        entry["measured_runs"] += 1
        util = r["config"]["gpu_memory_utilization"]
        if m.get("update_oom") and entry["observed"] is None:
            entry["observed"] = util
        verdict = r.get("emulated_verdict") or {}
        update_fits = verdict.get("update_fits")
        over_card = update_fits is False or (update_fits is None and "update_actor" in verdict.get("phases_over", {}))
        if over_card and entry["inferred"] is None:
            entry["inferred"] = util
    return out


def describe(runs: list[dict[str, Any]]) -> str:
    """Findings in words; every number comes from ``runs``."""
    lines = []
    for r in runs:
        e, p = r["emulation"], r["planner"]
        lines.append(
            f"{r['case']['name']} at util {e['gpu_memory_utilization']} of an emulated {e['emulated_total_gib']} GiB "
            f"card (vLLM asks for {e['vllm_requested_gib']:.2f} GiB): planner KV pool {p['kv_pool_gib']:.2f} GiB, {p['max_concurrent_seqs']} "
            f"concurrent sequences, peak {p['peak_phase']} {p['peak_gib']:.2f} GiB -> {p['verdict']}.")
        m = r.get("measured")
        if not m:
            lines.append(f"  measured: {r['launch_reason']}")
            continue
        off = [c for c in r["comparison"] if c["off_by_more_than_10pct"]]
        off_text = ", ".join(f"{c['quantity']} x{c['ratio']:.2f}" for c in off) or "none"
        lines.append(
            f"  measured: step {m['step_s'] or float('nan'):.1f} s, {m['rollout_samples_per_s'] or float('nan'):.1f} "
            f"rollout samples/s, failure: {m['failure']['kind'] + ' in ' + m['failure']['phase'] if m['failure'] else 'none'}; "
            f"{len(off)} of {sum(c['ratio'] is not None for c in r['comparison'])} compared quantities off by >10% "
            f"({off_text}).")
        if r.get("cost"):
            lines.append(f"  cost: ${r['cost']['steady_state_usd_per_million_samples']:,.2f} per million rollout "
                         f"samples at ${r['cost']['price_per_gpu_hour']}/GPU-hour (steady state).")
    for case, first in first_update_oom(runs).items():
        if first["measured_runs"]:
            lines.append(f"{case}: first utilization with an update-phase OOM: observed {first['observed']}, "
                         f"inferred on the emulated card {first['inferred']} ({first['measured_runs']} measured runs).")
    return "\n".join(lines)


def vllm_outside_pool_by_step(measured: dict[str, Any]) -> dict[str, float]:
    """Per step (``"1"``, ``"2"``, ...): GiB the device freed across vLLM's sleep after that step's rollout
    beyond the sleep-mode pool (``Sleep mode freed`` - ``CuMemAllocator: sleep freed``, :func:`parse_vllm_log`).

    That pool is what ``gpu_memory_utilization`` sizes (weights and KV cache); the rest is what vLLM's
    PyTorch allocator held beside it, which the allocator's sleep empties, plus anything another process
    freed in the same instant (none does in verl's sequence: the actor waits for the rollout). The first
    sleep follows start-up, so step k's rollout is sleep k.
    """
    sleeps = (measured.get("vllm") or {}).get("sleeps") or []
    return {str(k): s["device_freed_gib"] - s["pool_freed_gib"] for k, s in enumerate(sleeps) if k >= 1}


def _holder(process: str) -> str:
    """Which side of the card a per-process key (``"<title> [pid]"``) is: verl's actor worker or vLLM's."""
    if "WorkerDict" in process:
        return "actor"
    return "vllm" if "vllm" in process.lower() else "other"


def process_phase_peak(measured: dict[str, Any], phase: str, holder: str) -> float | None:
    """The largest per-process peak of ``holder`` (see :func:`_holder`) in a verl phase; None without
    per-process samples."""
    held = ((measured.get("process_phase_peaks") or {}).get(phase) or {})
    values = [gib for process, gib in held.items() if _holder(process) == holder]
    return max(values) if values else None


def gap_rows(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Where the planner's per-phase device estimate and the samples part, with what explains it (numbers
    only, from each run): the update split by verl's actor numbers (:func:`update_breakdown`) and by process,
    the rollout peak step by step with vLLM's memory outside its sleep-mode pool
    (:func:`vllm_outside_pool_by_step`), and old_log_prob by process against the planner's actor share."""
    rows = []
    for r in runs:
        m = r.get("measured")
        if not m:
            continue
        b = (r.get("emulated_verdict") or {}).get("update_breakdown") or {}
        gen = (m["phase_peaks"].get("gen") or {}).get("by_step", {})
        base = m["baseline_used_gib"]
        rollout = r["planner"]["device_total_gib"]["rollout"]
        outside = vllm_outside_pool_by_step(m)
        log_prob = r["planner"]["device_gib"].get("log_prob", {})
        actor_update = process_phase_peak(m, "update_actor", "actor")
        rows.append({"case": r["case"]["name"], "util": r["config"]["gpu_memory_utilization"],
                     "update_device_peak_gib": b.get("device_peak_gib"), "planner_update_gib": b.get("planner_device_gib"),
                     "actor_allocated_gib": b.get("actor_allocated_gib"),
                     "planner_actor_allocated_gib": b.get("planner_actor_allocated_gib"),
                     "allocator_cache_gib": b.get("allocator_cache_gib"), "rest_gib": b.get("rest_gib"),
                     "planner_rest_gib": b.get("planner_rest_gib"),
                     "planner_update_plus_cache_gib": (b["planner_device_gib"] + b["allocator_cache_gib"]) if b else None,
                     "update_ratio_with_cache": (b["device_peak_gib"] / (b["planner_device_gib"] + b["allocator_cache_gib"]))
                     if b else None,
                     "update_actor_process_gib": actor_update,
                     "actor_non_torch_gib": actor_update - b["actor_reserved_gib"] if actor_update and b else None,
                     "update_vllm_process_gib": process_phase_peak(m, "update_actor", "vllm"),
                     **{f"rollout_step{k}_gib": v - base for k, v in sorted(gen.items())},
                     "planner_rollout_gib": rollout,
                     **{f"rollout_step{k}_ratio": (v - base) / rollout for k, v in sorted(gen.items())},
                     **{f"vllm_outside_pool_step{k}_gib": v for k, v in sorted(outside.items())},
                     **{f"rollout_step{k}_ratio_without_outside_pool": (v - base - outside[k]) / rollout
                        for k, v in sorted(gen.items()) if k in outside},
                     "log_prob_actor_process_gib": process_phase_peak(m, "old_log_prob", "actor"),
                     "planner_log_prob_actor_gib": sum(log_prob.get(c, 0.0) for c in
                                                       (*budget.ACTOR_ALLOCATED_COMPONENTS, "actor_non_torch")),
                     "log_prob_vllm_process_gib": process_phase_peak(m, "old_log_prob", "vllm")})
    return rows


def process_rows(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per run, verl phase and process: the peak GiB that process held (runs with per-process samples only)."""
    rows = []
    for r in runs:
        peaks = (r.get("measured") or {}).get("process_phase_peaks") or {}
        for phase in PHASE_MAP:
            for process, gib in sorted(peaks.get(phase, {}).items(), key=lambda kv: -kv[1]):
                rows.append({"case": r["case"]["name"], "util": r["config"]["gpu_memory_utilization"], "phase": phase,
                             "process": process, "peak_gib": gib})
    return rows


def answer_lines(runs: list[dict[str, Any]], source: str = "outputs/06_util_sweep/<case>-u<util>/metrics.json") -> list[str]:
    """The answer seed 003 was missing, in Markdown: a table of the measured sweep and one sentence per case.
    Every number comes from ``runs``."""
    from rlkit.report import _fmt  # the README's cell format

    measured = [r for r in runs if r.get("measured")]
    if not measured:
        return ["*No measured runs (no GPU): nothing to answer from.*"]
    header = ("case", "util", "KV pool GiB", "concurrent 512-token seqs", "peak KV use %", "max waiting reqs",
              "rollout samples/s", "step s", "rollout peak GiB", "update peak GiB", "actor allocated GiB", "update OOM",
              "$ per M samples")
    lines = [(f"**gpu_memory_utilization sweep** (notebook 06; one fresh verl + vLLM job per point on one H200, every "
              f"process capped at the case's emulated card; `{source}`). Steps 2.. for times; peaks are device-wide "
              "minus the idle baseline:"), "",
             "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    rows = sweep_rows(measured)
    for row in rows:
        cells = (row["case"], f"{row['util']:g}", _fmt(row["kv_pool_gib"], ".2f"), _fmt(row["max_concurrency"], ",.0f"),
                 _fmt(row["kv_use_peak_pct"]), _fmt(row["waiting_reqs_max"], "d"), _fmt(row["rollout_samples_per_s"]),
                 _fmt(row["step_s"]), _fmt(row["peak_gen_gib"], ".2f"), _fmt(row["peak_update_actor_gib"], ".2f"),
                 _fmt(row["actor_allocated_gib"], ".2f"), "yes" if row["update_oom"] else "no",
                 _fmt(row["usd_per_M_samples"], ".0f"))
        lines.append("| " + " | ".join(cells) + " |")
    lines.append("")
    oom = first_update_oom(runs)
    for case in dict.fromkeys(r["case"]["name"] for r in measured):
        lines.append(_case_answer(case, [row for row in rows if row["case"] == case],
                                  next(r for r in measured if r["case"]["name"] == case), oom[case]))
    lines.append(_rollout_answer(measured))
    within = sum(1 for r in measured for c in r["comparison"] if c["ratio"] is not None and not c["off_by_more_than_10pct"])
    compared = sum(1 for r in measured for c in r["comparison"] if c["ratio"] is not None)
    lines.append(f"- Planner vs measured: {within} of {compared} compared quantities within 10%; notebook 06 shows the "
                 "others and what they are missing.")
    return lines


UPDATE_FLAT_GIB = 0.5  # an update peak that moves less than this across the sweep "does not move" (1 Hz samples)


def _span(values: list[float], spec: str) -> str:
    """``lo-hi`` in ``spec``, or one value where both print the same."""
    lo, hi = f"{min(values):{spec}}", f"{max(values):{spec}}"
    return lo if lo == hi else f"{lo}-{hi}"


def _case_answer(case: str, pts: list[dict[str, Any]], run: dict[str, Any], oom: dict[str, Any]) -> str:
    """One case's sentence of :func:`answer_lines` (its measured rows ``pts``, one of its runs, its OOM entry)."""
    def span(key: str, spec: str = ".1f") -> str:
        return _span([p[key] for p in pts], spec)

    def moves(key: str) -> bool:
        values = [p[key] for p in pts if p[key] is not None]
        return bool(values) and max(values) - min(values) > UPDATE_FLAT_GIB

    utils = [p["util"] for p in pts]
    missing = [u for u in run["config"]["sweep_utils"] if u not in utils]
    if not moves("peak_update_actor_gib"):
        update_text = (f"the update's device peak stays at {span('peak_update_actor_gib', '.2f')} GiB: it does not move "
                       "with util (vLLM's sleep frees its KV pool before the update)")
    elif not moves("actor_allocated_gib"):
        top, low = max(pts, key=lambda p: p["peak_update_actor_gib"]), min(pts, key=lambda p: p["peak_update_actor_gib"])
        update_text = (f"the actor's update does not move with util (allocated peak {span('actor_allocated_gib', '.2f')} GiB "
                       f"at every point; vLLM's sleep frees its KV pool before the update); the device-wide update peak is "
                       f"{span('peak_update_actor_gib', '.2f')} GiB, highest at {top['util']:g} and lowest at {low['util']:g}, "
                       "the difference held by the other processes on the card")
    else:
        lo, hi = min(pts, key=lambda p: p["util"]), max(pts, key=lambda p: p["util"])
        update_text = (f"the update's device peak goes from {lo['peak_update_actor_gib']:.2f} GiB at {lo['util']:g} to "
                       f"{hi['peak_update_actor_gib']:.2f} GiB at {hi['util']:g}")
    oom_text = ("no update OOM at any measured util" if oom["observed"] is None
                else f"the update first OOMs at {oom['observed']:g}")
    needed = [p["update_needed_without_cache_gib"] for p in pts if p["update_needed_without_cache_gib"] is not None]
    if needed:
        oom_text += (f"; without the actor's allocator cache the update needs {span('update_needed_without_cache_gib', '.2f')} "
                     f"GiB of the {run['emulation']['emulated_total_gib']:g} GiB card")
    waiting = max(p["waiting_reqs_max"] for p in pts)
    queue_text = ("never queued a request (Waiting: 0 in every statistics line)" if waiting == 0
                  else f"queued up to {waiting} requests")
    return (f"- {case} (util {', '.join(f'{u:g}' for u in utils)}"
            + (f"; {', '.join(f'{u:g}' for u in missing)} not measured" if missing else "")
            + f"): {update_text}; {oom_text}. What util buys is the KV pool ({span('kv_pool_gib', '.2f')} GiB, "
            f"{span('max_concurrency', ',.0f')} concurrent 512-token sequences for a batch of {CASES[case].samples_per_step}) "
            f"at a higher rollout peak ({span('peak_gen_gib', '.2f')} GiB); vLLM used at most {span('kv_use_peak_pct')}% "
            f"of its pool and {queue_text}. Rollout samples/s {span('rollout_samples_per_s')} (rollout {span('gen_s', '.2f')} s, "
            f"which verl counts in {VERL_ROLLOUT_POLL_S:g}-s polls: a difference of one poll is not engine speed), "
            f"step {span('step_s')} s, ${span('usd_per_M_samples', '.0f')} per million samples at "
            f"${run['cost']['price_per_gpu_hour']:g}/GPU-hour.")


def _rollout_answer(measured: list[dict[str, Any]]) -> str:
    """The rollout's device peak against util x card, from vLLM's own sleep lines (:func:`gap_rows`)."""
    gaps = gap_rows(measured)
    per_case = []
    for case in dict.fromkeys(r["case"]["name"] for r in measured):
        by_step: dict[str, list[float]] = {}
        for r in measured:
            if r["case"]["name"] == case:
                for step, gib in vllm_outside_pool_by_step(r["measured"]).items():
                    by_step.setdefault(step, []).append(gib)
        if not by_step:
            continue
        held = "; ".join(f"after step {k}'s rollout {_span(by_step[k], '.2f')} GiB" for k in sorted(by_step, key=int))
        ratios = [v for g in gaps if g["case"] == case for k, v in g.items() if k.endswith("_ratio_without_outside_pool")]
        per_case.append(f"{case}: {held} (the rollout peak without it is x{_span(ratios, '.2f')} the planner's)")
    if not per_case:
        return "- Rollout: vLLM's sleep lines are absent from these logs, so its memory outside the pool is not split."
    return ("- Rollout: util does not cap vLLM's process. Beside the sleep-mode pool that util sizes, vLLM's PyTorch "
            "allocator held memory that its sleep gave back (vLLM's `Sleep mode freed` minus `CuMemAllocator: sleep "
            "freed`, per rollout): " + "; ".join(per_case) + ". It is gone before old_log_prob and the update, so it "
            "raises the rollout's peak only; leave it as headroom above util x card.")


def timeline_figure(run_metrics: dict[str, Any]):
    """Plotly: device GiB over time for one run, one colour per verl phase (plotly imported here only)."""
    import plotly.graph_objects as go

    m = run_metrics.get("measured") or {}
    fig = go.Figure()
    timeline = m.get("timeline") or []
    for phase in dict.fromkeys(row["phase"] for row in timeline):
        pts = [row for row in timeline if row["phase"] == phase]
        fig.add_scatter(x=[p["t"] for p in pts], y=[p["used_gib"] for p in pts], mode="markers", name=phase)
    fig.add_scatter(x=[row["t"] for row in timeline], y=[row["used_gib"] for row in timeline], mode="lines",
                    line={"color": "lightgrey"}, showlegend=False)
    card = run_metrics["emulation"]["emulated_total_gib"] + (m.get("baseline_used_gib") or 0.0)
    fig.add_hline(y=card, line_dash="dash", annotation_text=f"emulated card ({run_metrics['emulation']['emulated_total_gib']} GiB)")
    fig.update_layout(title=f"{run_metrics['case']['name']} util {run_metrics['config']['gpu_memory_utilization']}: "
                      f"device memory at {1 / (m.get('sampler') or {}).get('interval_s', 1.0):.0f} Hz",
                      xaxis_title="seconds since the sampler started", yaxis_title="GiB used (device)", height=380)
    return fig


def throughput_figure(runs: list[dict[str, Any]]):
    """Plotly: rollout samples/s vs utilization per case (measured runs only), planner KV pool alongside."""
    from plotly.subplots import make_subplots

    fig = make_subplots(specs=[[{"secondary_y": True}]])
    rows = sweep_rows(runs)
    for case in dict.fromkeys(r["case"] for r in rows):
        pts = [r for r in rows if r["case"] == case]
        done = [r for r in pts if r["rollout_samples_per_s"] is not None]
        if done:
            upper = [(r["rollout_samples_per_s_upper"] or r["rollout_samples_per_s"]) - r["rollout_samples_per_s"] for r in done]
            fig.add_scatter(x=[r["util"] for r in done], y=[r["rollout_samples_per_s"] for r in done],
                            error_y={"type": "data", "array": upper, "arrayminus": [0.0] * len(done)},
                            mode="lines+markers", name=f"{case}: rollout samples/s (measured; bar: up to one "
                                                       f"{VERL_ROLLOUT_POLL_S:g}-s poll earlier)")
        fig.add_scatter(x=[r["util"] for r in pts], y=[r["planner_kv_pool_gib"] for r in pts], mode="lines+markers",
                        line={"dash": "dot"}, name=f"{case}: KV pool GiB (planner)", secondary_y=True)
    fig.update_layout(title="throughput and KV pool vs gpu_memory_utilization", xaxis_title="gpu_memory_utilization "
                      "(emulated card)", height=400)
    fig.update_yaxes(title_text="rollout samples/s", secondary_y=False)
    fig.update_yaxes(title_text="KV pool GiB", secondary_y=True)
    return fig


def main(argv: list[str] | None = None) -> int:
    """One point (``--profile``/``-p``, see :func:`rlkit.experiments.experiment_main`), or
    ``reanalyze FOLDER...``: saved points analysed again by this code (:func:`reanalyze`)."""
    from rlkit.experiments import experiment_main

    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["reanalyze"]:
        if len(argv) < 2:
            print("error: reanalyze needs results folders, e.g. outputs/06_util_sweep/h200/doc_small-u0.4", file=sys.stderr)
            return 2
        for folder in argv[1:]:
            reanalyze(folder)
            print(f"analysed again: {folder}")
        return 0

    return experiment_main(Config, run, NOTEBOOK, argv,
                           default_tag=lambda cfg: f"{cfg.case}-u{cfg.gpu_memory_utilization}")


if __name__ == "__main__":
    sys.exit(main())
