"""The gen phase's ceiling (issue 24 item 1): standalone vLLM at a notebook-05 profile's batch and lengths.

    python -m rlkit.experiments.vllm_ceiling --profile h200-seed [-p key=value] [--tag TAG] [--out ROOT] [--dry-run]

writes ``<ROOT>/_node/vllm_standalone/<tag>/`` (``params.yaml``, ``env.json``, ``metrics.json``; tag defaults to the
profile; ROOT defaults to ``outputs/``). Whoever commits a measurement adds the ``COMMAND.txt`` beside them.
:func:`rlkit.planning.roofline.vllm_ceiling` reads the newest committed one whose ``shape`` matches a run, and gen's limit
is the run's generated tokens per replica over its ``output_tok_s``.

**What is the same as in the run.** :func:`rlkit.experiments.vllm_ceiling_config.config_from_profile` reads
notebook 05's profile into :class:`rlkit.recipes.grpo.GRPORecipe`, so the model is the very checkpoint the run trains (:func:`rlkit.recipes.grpo.default_paths`:
the random-init preset with the same synthetic length model, written by :func:`rlkit.recipes.grpo.prepare_inputs` if it
is missing) and the prompts are the same synthetic rows (:mod:`rlkit.experiments.vllm_ceiling_requests`): verl's
first batch (``torch.randperm`` of the rows with a generator seeded by ``data.seed`` = ``model_seed``, what
torchdata's ``RandomSampler`` draws in verl's ``create_rl_sampler``), after verl's over-long prompt filter, each
rendered as verl's agent loop renders it (verl's own continuous-token builder, ``build_initial_tokens``: the chat
template with ``add_generation_prompt``), each repeated ``rollout_n`` times side by side (verl's
``repeat(interleave=True)``) and sent as one request of ``n=1``.
One vLLM replica serves ``train_batch_size x rollout_n / (n_gpus / rollout_tp)`` of them, which is what is measured.
The engine is built with the arguments verl 0.9.1's ``vLLMHttpServer.launch_server`` passes
(verl/workers/rollout/vllm_rollout/vllm_async_server.py), from verl's rollout defaults
(:data:`rlkit.experiments.vllm_ceiling_config.VERL_ROLLOUT`; ``tests/test_vllm_ceiling.py`` compares them with verl's own config) and the profile's
``gpu_memory_utilization``, ``enforce_eager`` and ``rollout_tp``: bf16, chunked prefill at 8192 tokens, 256
sequences at most, prefix caching, sleep mode enabled, ``max_model_len`` the model's ``max_position_embeddings``,
CUDA graphs ``FULL_AND_PIECEWISE``, seed 42, the multiprocessing executor and verl's worker extension class. That
class imports verl in vLLM's worker process, which loads the rlkit plugin, which installs
:mod:`rlkit.patches.instruments.emulate_card` there when ``RLKIT_EMULATE_GPU_GIB`` is set, exactly as in the run: vLLM sizes its KV
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
import sys
import time
from pathlib import Path
from typing import Any

from rlkit.core import params as P
from rlkit.experiments.vllm_ceiling_config import PROFILE_NOTEBOOK, Config, config_from_profile
from rlkit.experiments.vllm_ceiling_requests import prepare_isolated
from rlkit.measure.environment import environment_report

NOTEBOOK = "_node/vllm_standalone"  # results: outputs/_node/vllm_standalone/<tag>/
GIB = 2**30


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
    from rlkit.core.env import REPO_ROOT
    from rlkit.recipes.job import OFFLINE_ENV, PLUGIN_MODULE

    modules = [m for m in os.environ.get("VERL_USE_EXTERNAL_MODULES", "").split(",") if m]
    return {**OFFLINE_ENV, "VERL_USE_EXTERNAL_MODULES": ",".join(dict.fromkeys([*modules, PLUGIN_MODULE])),
            "RLKIT_PATCHES": "", "RLKIT_RECORD_DIR": str(record_dir),
            "RLKIT_EMULATE_GPU_GIB": f"{cfg.emulate_gpu_gib:g}" if cfg.emulate_gpu_gib else "",
            "VLLM_LOGGING_LEVEL": os.environ.get("VLLM_LOGGING_LEVEL", "INFO"),
            "PYTHONPATH": os.pathsep.join(p for p in (str(REPO_ROOT), os.environ.get("PYTHONPATH", "")) if p)}


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
    from rlkit.recipes.job import read_plugin_records

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

    from rlkit.core.env import gpu_name
    from rlkit.measure.environment import gpus
    from rlkit.models import lengths as length_model
    from rlkit.models import shape as model_shape

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
    from rlkit.core.results import ProfileError, ResultsFolder, parse_overrides

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
        folder.write_env(environment_report())
        folder.write_metrics(run(cfg, work_dir))
    print(f"results: {folder.path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
