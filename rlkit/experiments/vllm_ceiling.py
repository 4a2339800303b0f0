"""The gen phase's ceiling (issue 24 item 1): standalone vLLM at a notebook-05 profile's batch and lengths.

    python -m rlkit.experiments.vllm_ceiling --profile h200-seed [-p key=value] [--tag TAG] [--out ROOT] [--dry-run]

writes ``<ROOT>/_node/vllm_standalone/<tag>/`` (``params.yaml``, ``env.json``, ``metrics.json``; tag defaults to the
profile; ROOT defaults to ``outputs/``). Whoever commits a measurement adds the ``COMMAND.txt`` beside them.
:func:`rlkit.roofline.vllm_ceiling` reads the newest committed one whose ``shape`` matches a run, and gen's limit
is the run's generated tokens per replica over its ``output_tok_s``.

**What is the same as in the run.** :func:`config_from_profile` reads notebook 05's profile into
:class:`rlkit.recipe.GRPORecipe`, so the model is the very checkpoint the run trains (:func:`rlkit.recipe.default_paths`:
the random-init preset with the same synthetic length model, written by :func:`rlkit.recipe.prepare_inputs` if it
is missing) and the prompts are the same synthetic rows: verl's first batch (``torch.randperm`` of the rows with a
generator seeded by ``data.seed`` = ``model_seed``, what torchdata's ``RandomSampler`` draws in verl's
``create_rl_sampler``), after verl's over-long prompt filter, each rendered as verl's agent loop renders it (verl's
own continuous-token builder, ``build_initial_tokens``: the chat template with ``add_generation_prompt``), each
repeated ``rollout_n`` times side by side (verl's ``repeat(interleave=True)``) and sent as one request of ``n=1``.
One vLLM replica serves ``train_batch_size x rollout_n / (n_gpus / rollout_tp)`` of them, which is what is measured.
The engine is built with the arguments verl 0.9.1's ``vLLMHttpServer.launch_server`` passes
(verl/workers/rollout/vllm_rollout/vllm_async_server.py), from verl's rollout defaults (:data:`VERL_ROLLOUT`;
``tests/test_vllm_ceiling.py`` compares them with verl's own config) and the profile's
``gpu_memory_utilization``, ``enforce_eager`` and ``rollout_tp``: bf16, chunked prefill at 8192 tokens, 256
sequences at most, prefix caching, sleep mode enabled, ``max_model_len`` the model's ``max_position_embeddings``,
CUDA graphs ``FULL_AND_PIECEWISE``, seed 42, the multiprocessing executor and verl's worker extension class. That
class imports verl in vLLM's worker process, which loads the rlkit plugin, which installs
:mod:`rlkit.emulate_card` there when ``RLKIT_EMULATE_GPU_GIB`` is set, exactly as in the run: vLLM sizes its KV
cache for the emulated card (the plugin's records, kept in ``plugin_records/``, must show it, or the run fails).
Each request's sampling is verl's: temperature 1, top-p 1, top-k -1, repetition penalty 1, the sampled token's
log-prob (``calculate_log_probs``), no ignore-EOS, ``max_tokens`` = min(response cap, prompt cap + response cap -
prompt length).

**What differs, on purpose.** The weights are loaded from the checkpoint (``load_format auto``); verl starts vLLM
with dummy weights and syncs the actor's, which equal the checkpoint's before the first update. The frontend is
the offline ``LLM`` (its engine core in a process of its own, as verl's ``AsyncLLM`` has) instead of verl's HTTP
server. Nothing else runs on the GPU: no actor, no sleeping and waking.

**What the ceiling includes** and verl's ``timing_s/gen`` also holds: prefill, decode, sampling and log-probs,
detokenisation. **What it leaves out** that ``timing_s/gen`` holds (verl 0.9.1, ``ray_trainer.py``'s ``gen`` timer):
the agent loop (Ray dispatch to its workers, the chat template, per-request async calls through the server
manager, padding the batch back) and ``sleep_replicas()`` after the rollout. Waking vLLM and the weight sync are
timed as ``update_weights`` in verl 0.9.1, so neither is in either number. Engine start-up and the warm-up
(``warmup_sequences`` other prompts, ``warmup_max_tokens`` each; then the prefix cache is reset) are timed apart.

Importing this module needs neither vLLM nor a GPU; :func:`run` imports vLLM.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from rlkit import params as P

NOTEBOOK = "_node/vllm_standalone"  # results: outputs/_node/vllm_standalone/<tag>/
PROFILE_NOTEBOOK = "05_grpo_qwen3_4b"  # the profiles a ceiling is built from
GIB = 2**30

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
    # the workload: notebook 05's fields, same meaning (rlkit.recipe.GRPORecipe)
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
        """The :class:`rlkit.recipe.GRPORecipe` whose inputs (model, data) this measures."""
        from rlkit.recipe import GRPORecipe

        return GRPORecipe(**{k: getattr(self, k) for k in RECIPE_KEYS}, ppo_mini_batch_size=self.train_batch_size)

    def shape(self, gpu_name: str | None) -> dict[str, Any]:
        """The keys :func:`rlkit.roofline.vllm_ceiling` matches a run on."""
        from rlkit import roofline

        return roofline.ceiling_shape(P.as_dict(self), gpu_name)


def config_from_profile(profile: str, overrides: dict[str, Any] | None = None) -> Config:
    """The ceiling of notebook 05's ``profile`` (a name under nbs/params/ or a YAML path): its workload fields, verl's
    rollout settings, the measurement's defaults, then ``overrides`` (keys of :class:`Config`)."""
    from rlkit.recipe import GRPORecipe
    from rlkit.results import load_profile

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


# ------------------------------------------------------------------------------ what verl passes to vLLM
def engine_kwargs(cfg: Config, model_path: str, max_model_len: int) -> dict[str, Any]:
    """``vllm.LLM`` arguments: verl 0.9.1's ``launch_server`` args for this config (``load_format`` aside: the
    checkpoint, not verl's dummy weights that the actor's sync then overwrites)."""
    return {
        "model": model_path, "tokenizer": model_path, "dtype": cfg.dtype, "load_format": "auto",
        "skip_tokenizer_init": False, "distributed_executor_backend": cfg.distributed_executor_backend,
        "worker_extension_cls": cfg.worker_extension_cls, "trust_remote_code": False, "max_model_len": max_model_len,
        "max_num_seqs": cfg.max_num_seqs, "enable_chunked_prefill": cfg.enable_chunked_prefill,
        "max_num_batched_tokens": cfg.max_num_batched_tokens, "enable_prefix_caching": cfg.enable_prefix_caching,
        "enable_sleep_mode": cfg.enable_sleep_mode, "logprobs_mode": cfg.logprobs_mode, "enforce_eager": cfg.enforce_eager,
        "gpu_memory_utilization": cfg.gpu_memory_utilization, "disable_log_stats": cfg.disable_log_stats,
        "tensor_parallel_size": cfg.rollout_tp, "seed": cfg.seed, "scheduling_policy": cfg.scheduling_policy,
        "override_generation_config": {"temperature": cfg.temperature, "top_k": cfg.top_k, "top_p": cfg.top_p,
                                       "repetition_penalty": 1.0, "max_new_tokens": cfg.max_response_length},
        "compilation_config": {"cudagraph_mode": cfg.cudagraph_mode},
    }


def sampling_kwargs(cfg: Config, prompt_len: int, max_model_len: int, max_tokens: int | None = None) -> dict[str, Any]:
    """``vllm.SamplingParams`` of one request, as verl 0.9.1's agent loop and ``vLLMHttpServer.generate`` build them."""
    if max_tokens is None:
        max_tokens = min(cfg.max_response_length, cfg.max_prompt_length + cfg.max_response_length - prompt_len)
    return {"max_tokens": max(1, min(max_tokens, max_model_len - prompt_len)), "temperature": cfg.temperature,
            "top_p": cfg.top_p, "top_k": cfg.top_k, "repetition_penalty": 1.0,
            "logprobs": 0 if cfg.calculate_log_probs else None, "ignore_eos": cfg.ignore_eos}


def engine_env(cfg: Config, record_dir: str | os.PathLike) -> dict[str, str]:
    """What vLLM's processes must inherit: the rlkit plugin (loaded when verl's worker extension imports verl, also
    where rlkit is on PYTHONPATH but not installed), the emulated card, and vLLM's INFO lines (KV cache size)."""
    from rlkit.env import REPO_ROOT
    from rlkit.verl_job import OFFLINE_ENV, PLUGIN_MODULE

    modules = [m for m in os.environ.get("VERL_USE_EXTERNAL_MODULES", "").split(",") if m]
    return {**OFFLINE_ENV, "VERL_USE_EXTERNAL_MODULES": ",".join(dict.fromkeys([*modules, PLUGIN_MODULE])),
            "RLKIT_PATCHES": "", "RLKIT_RECORD_DIR": str(record_dir),
            "RLKIT_EMULATE_GPU_GIB": f"{cfg.emulate_gpu_gib:g}" if cfg.emulate_gpu_gib else "",
            "VLLM_LOGGING_LEVEL": os.environ.get("VLLM_LOGGING_LEVEL", "INFO"),
            "PYTHONPATH": os.pathsep.join(p for p in (str(REPO_ROOT), os.environ.get("PYTHONPATH", "")) if p)}


# ------------------------------------------------------------------------------------- the requests
def first_batch(n_rows: int, batch: int, extra: int, seed: int) -> tuple[list[int], list[int]]:
    """Row indices of verl's first batch (``batch``) and the next ``extra`` (warm-up): torchdata's ``RandomSampler``
    with a generator seeded ``seed`` draws ``torch.randperm(n_rows, generator)`` for its first epoch."""
    import torch

    order = torch.randperm(n_rows, generator=torch.Generator().manual_seed(seed)).tolist()
    return order[:batch], order[batch:batch + extra]


def prepare_requests(cfg: Config) -> dict[str, Any]:
    """The recipe's inputs (written if missing) and the prompt token ids: the replica's requests and the warm-up's."""
    from transformers import AutoConfig, AutoTokenizer
    from verl.utils.tokenizer.continuous_token_wiring import create_continuous_token_builder

    from rlkit import data
    from rlkit import recipe as R

    recipe = cfg.recipe()
    paths, data_info, model_info = R.prepare_inputs(recipe)
    tokenizer = AutoTokenizer.from_pretrained(paths.model)
    hf_config = AutoConfig.from_pretrained(paths.model)
    builder = create_continuous_token_builder(tokenizer, hf_model_type=getattr(hf_config, "model_type", None),
                                              chat_template_kwargs={})
    rows = data.read_parquet_rows(paths.train_file)
    rendered = [list(builder.build_initial_tokens(list(row["prompt"]))) for row in rows]
    kept = [ids for ids in rendered if len(ids) <= cfg.max_prompt_length]  # data.filter_overlong_prompts
    batch, warm = first_batch(len(kept), cfg.train_batch_size, cfg.warmup_sequences, recipe.model_seed)
    requests = [kept[i] for i in batch for _ in range(cfg.rollout_n)]  # repeat(interleave=True)
    return {"model_path": paths.model, "train_file": paths.train_file, "data": data_info, "model_info": model_info,
            "max_position_embeddings": hf_config.max_position_embeddings, "rows": len(rows),
            "rows_over_prompt_cap": len(rows) - len(kept), "batch_rows": batch,
            "requests": requests[:cfg.sequences_per_replica], "warmup": [kept[i] for i in warm]}


_PREPARE_CHILD = """
import json, sys
from rlkit import params
from rlkit.experiments import vllm_ceiling as V
cfg = params.build(V.Config, json.loads(sys.argv[1]))
with open(sys.argv[2], "w") as f:
    json.dump(V.prepare_requests(cfg), f, default=str)
"""


def prepare_isolated(cfg: Config, work_dir: Path) -> dict[str, Any]:
    """:func:`prepare_requests` in a child process: writing a random-init model uses the GPU, and this process must
    hold nothing on it (nor have imported verl) when vLLM starts."""
    out = work_dir / "requests.json"
    done = subprocess.run([sys.executable, "-c", _PREPARE_CHILD, json.dumps(P.as_dict(cfg)), str(out)], check=False,
                          capture_output=True, text=True, timeout=1800)
    if done.returncode != 0:
        raise RuntimeError(f"preparing the inputs failed (exit {done.returncode}):\n{done.stderr[-3000:]}")
    prepared = json.loads(out.read_text())
    out.unlink()
    return prepared


# ------------------------------------------------------------------------------------------ the run
def _lengths(values: list[int]) -> dict[str, float]:
    return {"mean": sum(values) / len(values), "min": min(values), "max": max(values)}


def kv_cache_info(llm, shape) -> dict[str, Any]:
    """The KV cache vLLM allocated, from the block count its engine core reported to the frontend."""
    cache = getattr(getattr(getattr(llm, "llm_engine", None), "vllm_config", None), "cache_config", None)
    blocks, block_size = getattr(cache, "num_gpu_blocks", None), getattr(cache, "block_size", None)
    if not blocks or not block_size:
        return {"num_gpu_blocks": None, "reason": "vLLM's cache_config did not carry the block count"}
    per_token = 2 * shape.layers * shape.kv_dim * 2  # K and V, bf16
    return {"num_gpu_blocks": blocks, "block_size": block_size, "tokens": blocks * block_size,
            "gib": blocks * block_size * per_token / GIB, "bytes_per_token": per_token}


def emulation_check(cfg: Config, record_dir: Path) -> dict[str, Any]:
    """Whether vLLM's worker process ran on the emulated card (the rlkit plugin's records say so)."""
    from rlkit.verl_job import read_plugin_records

    records = read_plugin_records(record_dir)
    emulated = [r for r in records if (r.get("instruments") or {}).get("emulated_card")]
    errors = [r["error"] for r in records if r.get("error")]
    if errors:
        raise RuntimeError(f"the rlkit plugin failed in a vLLM process: {errors}")
    if cfg.emulate_gpu_gib and not emulated:
        raise RuntimeError(f"emulate_gpu_gib={cfg.emulate_gpu_gib:g} but no vLLM process recorded the emulated card "
                           f"({len(records)} plugin records in {record_dir}): vLLM sized its KV cache for the real GPU. "
                           "Fix: check that verl's worker extension imports verl and that rlkit is on PYTHONPATH")
    return {"emulate_gpu_gib": cfg.emulate_gpu_gib or None, "plugin_records": len(records),
            "processes_emulated": len(emulated)}


def summarize(outputs, wall_s: float) -> dict[str, Any]:
    """Token counts and rates of one ``LLM.generate`` (its ``RequestOutput`` list)."""
    lengths = [len(o.outputs[0].token_ids) for o in outputs]
    prompts = [len(o.prompt_token_ids) for o in outputs]
    cached = [getattr(o, "num_cached_tokens", None) for o in outputs]
    reasons: dict[str, int] = {}
    for o in outputs:
        reasons[str(o.outputs[0].finish_reason)] = reasons.get(str(o.outputs[0].finish_reason), 0) + 1
    return {"sequences": len(outputs), "output_tokens": sum(lengths), "prompt_tokens": sum(prompts),
            "cached_prompt_tokens": sum(cached) if None not in cached else None, "wall_s": wall_s,
            "output_tok_s": sum(lengths) / wall_s, "total_tok_s": (sum(lengths) + sum(prompts)) / wall_s,
            "response_length": _lengths(lengths), "prompt_length": _lengths(prompts), "finish_reasons": reasons,
            "response_lengths": lengths}


def run(cfg: Config, work_dir: str | os.PathLike) -> dict[str, Any]:
    """Prepare the requests, start vLLM as verl would, warm up, then time the replica's batch; ``metrics.json``."""
    from datetime import datetime, timezone

    from rlkit import length_model, model_shape
    from rlkit.env import gpu_name, gpus

    work_dir = Path(work_dir)
    t0 = time.perf_counter()
    prepared = prepare_isolated(cfg, work_dir)
    prepare_s = time.perf_counter() - t0
    record_dir = work_dir / "plugin_records"
    os.environ.update(engine_env(cfg, record_dir))  # before vLLM starts its processes: they inherit it
    import vllm
    from vllm import LLM, SamplingParams

    max_model_len = cfg.max_model_len or prepared["max_position_embeddings"]
    kwargs = engine_kwargs(cfg, prepared["model_path"], max_model_len)
    t0 = time.perf_counter()
    llm = LLM(**kwargs)
    engine_start_s = time.perf_counter() - t0
    emulation = emulation_check(cfg, record_dir)  # vLLM's worker has imported verl by now: fail before measuring

    def generate(prompts: list[list[int]], max_tokens: int | None = None):
        params = [SamplingParams(**sampling_kwargs(cfg, len(p), max_model_len, max_tokens)) for p in prompts]
        start = time.perf_counter()
        outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
        return outputs, time.perf_counter() - start

    warm_outputs, warm_s = generate(prepared["warmup"], cfg.warmup_max_tokens)
    if hasattr(llm, "reset_prefix_cache"):
        llm.reset_prefix_cache()  # the batch finds none of the warm-up's blocks
    outputs, wall_s = generate(prepared["requests"])
    measured = summarize(outputs, wall_s)
    shape = model_shape.resolve_model(prepared["model_path"])
    gpu = gpu_name({"gpus": gpus()})
    print(f"[vllm_ceiling] {measured['sequences']} sequences, {measured['output_tokens']} output tokens in "
          f"{wall_s:.1f} s: {measured['output_tok_s']:.0f} tokens/s on {gpu}", file=sys.stderr)
    return {
        "shape": cfg.shape(gpu), "gpu": gpu, "vllm_version": vllm.__version__,
        "measured_utc": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "output_tok_s": measured["output_tok_s"], "output_tokens": measured["output_tokens"],
        "prompt_tokens": measured["prompt_tokens"], "wall_s": wall_s, "response_length": measured["response_length"],
        "expected_response_length_mean": length_model.expected_response_tokens(cfg.response_length_mean,
                                                                                cfg.max_response_length),
        "generate": measured, "replica": {"replicas": cfg.replicas, "sequences": cfg.sequences_per_replica,
                                          "of_batch": cfg.train_batch_size * cfg.rollout_n},
        "warmup": {"sequences": len(warm_outputs), "max_tokens": cfg.warmup_max_tokens, "seconds": warm_s,
                   "output_tokens": sum(len(o.outputs[0].token_ids) for o in warm_outputs)},
        "engine_start_s": engine_start_s, "prepare_s": prepare_s, "kv_cache": kv_cache_info(llm, shape),
        "emulation": emulation,
        "engine_kwargs": kwargs, "sampling": sampling_kwargs(cfg, 0, max_model_len),
        "inputs": {k: prepared[k] for k in ("model_path", "train_file", "data", "model_info", "rows",
                                             "rows_over_prompt_cap", "batch_rows")},
    }


def main(argv=None) -> int:
    from rlkit.results import ProfileError, ResultsFolder, parse_overrides

    parser = argparse.ArgumentParser(prog="python -m rlkit.experiments.vllm_ceiling", description=__doc__.split("\n\n")[0])
    parser.add_argument("--profile", default="h200-seed", help=f"nbs/params/{PROFILE_NOTEBOOK}.<profile>.yaml or a YAML path")
    parser.add_argument("-p", "--param", action="append", default=[], metavar="KEY=VALUE", help="override one parameter")
    parser.add_argument("--tag", default=None, help="results folder name (default: the profile)")
    parser.add_argument("--out", default=None, help=f"results root (default: outputs/); results go to <out>/{NOTEBOOK}/<tag>/")
    parser.add_argument("--dry-run", action="store_true", help="print the parameters and vLLM's arguments; run nothing")
    ns = parser.parse_args(argv)
    try:
        cfg = config_from_profile(ns.profile, parse_overrides(ns.param))
    except (P.ParamError, ProfileError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    if ns.dry_run:
        print(json.dumps({"params": P.as_dict(cfg), "replica_sequences": cfg.sequences_per_replica,
                          "engine_kwargs": engine_kwargs(cfg, "<model dir>", cfg.max_model_len or 0),
                          "sampling": sampling_kwargs(cfg, 0, 10**9)}, indent=1))
        return 0
    folder = ResultsFolder.create(NOTEBOOK, ns.tag or cfg.profile, root=ns.out)
    with folder.writing() as work_dir:
        folder.write_params(P.as_dict(cfg))
        folder.write_env()
        folder.write_metrics(run(cfg, work_dir))
    print(f"results: {folder.path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
