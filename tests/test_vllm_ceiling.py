"""rlkit.experiments.vllm_ceiling (the gen ceiling's measurement, issue 24 item 1) and rlkit.planning.roofline's reading of it.

CPU only: the Config from notebook 05's profiles, verl 0.9.1's rollout settings read from verl's own config, the
request and result helpers on stand-ins for vLLM's outputs, and the roofline against ceilings written into a
temporary repository. No vLLM, nothing under outputs/."""
import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from rlkit.core import params as P
from rlkit.core.results import load_profile
from rlkit.experiments import vllm_ceiling as V
from rlkit.experiments import vllm_ceiling_config as VC
from rlkit.experiments.vllm_ceiling_requests import first_batch
from rlkit.models import shape as model_shape
from rlkit.planning import roofline


# --------------------------------------------------------------------------------------------- Config
@pytest.mark.parametrize("profile", ["h200-seed", "h200"])
def test_config_takes_the_profiles_workload_and_verls_rollout_settings(profile):
    cfg = VC.config_from_profile(profile)
    values = load_profile(VC.PROFILE_NOTEBOOK, profile)
    assert cfg.profile == profile
    assert {k: getattr(cfg, k) for k in VC.RECIPE_KEYS} == {k: values[k] for k in VC.RECIPE_KEYS}
    assert {k: getattr(cfg, k) for k in VC.VERL_ROLLOUT} == VC.VERL_ROLLOUT
    assert cfg.sequences_per_replica == values["train_batch_size"] * values["rollout_n"] * values["rollout_tp"] // values["n_gpus"]
    recipe = cfg.recipe()  # the very inputs the run uses
    from rlkit.recipes.grpo import GRPORecipe, default_paths

    run_recipe = P.build(GRPORecipe, {k: v for k, v in values.items() if k != "results_dir"})
    assert default_paths(recipe) == default_paths(run_recipe)
    assert cfg.shape("NVIDIA H200") == roofline.ceiling_shape(P.as_dict(run_recipe), "NVIDIA H200")


def test_h200_profile_measures_one_of_its_two_replicas():
    cfg = VC.config_from_profile("h200")
    assert (cfg.n_gpus, cfg.replicas, cfg.sequences_per_replica) == (2, 2, 128)
    assert VC.config_from_profile("h200-seed").sequences_per_replica == 256


def test_overrides_are_strict_and_say_the_fix():
    with pytest.raises(P.ParamError, match=r"unknown .*\['temprature'\].*Fix: correct the spelling"):
        VC.config_from_profile("h200-seed", {"temprature": 0.5})
    with pytest.raises(P.ParamError, match=r"\['lr'\].*do not change what vLLM generates\. Fix: drop them"):
        VC.config_from_profile("h200-seed", {"lr": 0.0})
    with pytest.raises(P.ParamError, match=r"Config\.top_k: expected int"):
        VC.config_from_profile("h200-seed", {"top_k": "all"})
    with pytest.raises(P.ParamError, match=r"Config\.n_gpus: .*Fix: choose n_gpus"):
        VC.config_from_profile("h200-seed", {"n_gpus": 3})
    with pytest.raises(P.ParamError, match=r"Config\.max_model_len: .*Fix: null"):
        VC.config_from_profile("h200-seed", {"max_model_len": 1024})
    cfg = VC.config_from_profile("h200-seed", {"train_batch_size": 4, "warmup_sequences": 2})
    assert cfg.sequences_per_replica == 32 and cfg.recipe().ppo_mini_batch_size == 4


def test_a_profile_that_changes_verls_rollout_is_refused(tmp_path):
    values = load_profile(VC.PROFILE_NOTEBOOK, "h200-seed")
    values["extra_overrides"] = ["actor_rollout_ref.rollout.max_num_seqs=64"]
    path = tmp_path / "changed.yaml"
    path.write_text(json.dumps(values))  # JSON is YAML
    with pytest.raises(P.ParamError, match=r"extra_overrides .*max_num_seqs=64.*Fix: give the same values as -p"):
        VC.config_from_profile(str(path))


def test_cli_dry_run_and_a_bad_key(capsys):
    assert V.main(["--profile", "h200-seed", "--dry-run"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["params"]["temperature"] == 1.0 and shown["replica_sequences"] == 256
    assert V.main(["--profile", "h200-seed", "-p", "tempreature=1", "--dry-run"]) == 2
    assert "tempreature" in capsys.readouterr().err


def test_the_module_imports_and_builds_its_config_without_vllm():
    code = ("import sys; sys.modules['vllm'] = None\n"  # any `import vllm` now raises ImportError
            "from rlkit.experiments import vllm_ceiling as V, vllm_ceiling_config as VC\n"
            "cfg = VC.config_from_profile('h200-seed')\n"
            "V.engine_kwargs(cfg, 'm', 40960); V.sampling_kwargs(cfg, 100, 40960)\n"
            "assert sys.modules['vllm'] is None\n")
    done = subprocess.run([sys.executable, "-c", code], check=False, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr


# ------------------------------------------------------------------------------ verl's own settings
def _verl_source(relative: str) -> str:
    import importlib.util

    root = Path(importlib.util.find_spec("verl").submodule_search_locations[0])
    return (root / relative).read_text()


@pytest.mark.verl
@pytest.mark.parametrize("profile", ["h200-seed", "h200"])
def test_rollout_settings_are_verls_own(profile):
    """The engine and sampling settings equal what verl 0.9.1 composes for the same profile: this fails when verl's
    defaults drift from rlkit.experiments.vllm_ceiling_config.VERL_ROLLOUT."""
    from verl.utils.config import omega_conf_to_dataclass

    from rlkit.recipes.check import compose_verl_config
    from rlkit.recipes.overrides import render_overrides

    cfg = VC.config_from_profile(profile)
    rollout = compose_verl_config(render_overrides(cfg.recipe())).actor_rollout_ref.rollout
    config = omega_conf_to_dataclass(rollout)  # verl.workers.config.RolloutConfig: the dataclass's own defaults too
    from_verl = {k: getattr(config, k) for k in VC.VERL_ROLLOUT
                 if k not in ("cudagraph_mode", "distributed_executor_backend", "worker_extension_cls")}
    assert from_verl == {k: VC.VERL_ROLLOUT[k] for k in from_verl}
    assert (config.gpu_memory_utilization, config.enforce_eager, config.tensor_model_parallel_size) == (
        cfg.gpu_memory_utilization, cfg.enforce_eager, cfg.rollout_tp)
    assert (config.prompt_length, config.response_length, config.n) == (
        cfg.max_prompt_length, cfg.max_response_length, cfg.rollout_n)
    assert not config.full_determinism and config.load_format == "dummy"  # no per-request seed; weights synced in

    # what vLLMHttpServer.launch_server adds by itself (its module imports vllm, so its source is read)
    server = _verl_source("workers/rollout/vllm_rollout/vllm_async_server.py")
    assert f'compilation_config.setdefault("cudagraph_mode", "{cfg.cudagraph_mode}")' in server
    assert f'"distributed_executor_backend": "{cfg.distributed_executor_backend}"' in server
    assert f'return "{cfg.worker_extension_cls}"' in server
    assert '"seed": self.replica_rank + self.config.seed' in server
    for arg in ("max_model_len", "max_num_seqs", "enable_chunked_prefill", "max_num_batched_tokens",
                "enable_prefix_caching", "enable_sleep_mode", "logprobs_mode", "enforce_eager",
                "gpu_memory_utilization", "disable_log_stats", "scheduling_policy"):
        assert f'"{arg}": self.config.{arg}' in server, arg
    kwargs = V.engine_kwargs(cfg, "/m", 40960)
    assert {k: kwargs[k] for k in ("max_num_seqs", "enable_chunked_prefill", "max_num_batched_tokens",
                                   "enable_prefix_caching", "enable_sleep_mode", "logprobs_mode", "scheduling_policy",
                                   "disable_log_stats", "dtype", "seed")} == {
        "max_num_seqs": config.max_num_seqs, "enable_chunked_prefill": config.enable_chunked_prefill,
        "max_num_batched_tokens": config.max_num_batched_tokens, "enable_prefix_caching": config.enable_prefix_caching,
        "enable_sleep_mode": config.enable_sleep_mode, "logprobs_mode": config.logprobs_mode,
        "scheduling_policy": config.scheduling_policy, "disable_log_stats": config.disable_log_stats,
        "dtype": config.dtype, "seed": config.seed}

    # each request's sampling: the agent loop's dict, then generate()'s max_tokens and defaults
    loop = _verl_source("experimental/agent_loop/agent_loop.py")
    assert ("temperature=config.temperature,\n            top_p=config.top_p,\n            top_k=config.top_k,\n"
            "            repetition_penalty=1.0,\n            logprobs=config.calculate_log_probs,") in loop
    assert "self.config.response_length, self.config.prompt_length + self.config.response_length - len(prompt_ids)" in server
    assert 'sampling_params["logprobs"] = 0 if sampling_params.pop("logprobs", False) else None' in server
    sampling = V.sampling_kwargs(cfg, 200, 40960)
    assert sampling == {"max_tokens": cfg.max_response_length, "temperature": config.temperature, "top_p": config.top_p,
                        "top_k": config.top_k, "repetition_penalty": 1.0, "logprobs": 0, "ignore_eos": config.ignore_eos}
    assert V.sampling_kwargs(cfg, 200, 300)["max_tokens"] == 100  # clamped to the context left


@pytest.mark.verl
def test_first_batch_is_what_verls_sampler_draws():
    """verl's create_rl_sampler: torchdata's RandomSampler with a generator seeded data.seed (= model_seed)."""
    import torch
    from torchdata.stateful_dataloader.sampler import RandomSampler

    sampler = RandomSampler(data_source=list(range(100)), generator=torch.Generator().manual_seed(3))
    drawn = list(sampler)
    batch, warm = first_batch(100, 32, 8, seed=3)
    assert batch == drawn[:32] and warm == drawn[32:40]


# ---------------------------------------------------------------------------- results on stand-ins
def _output(prompt_len: int, tokens: int, reason: str, cached: int = 0):
    return SimpleNamespace(prompt_token_ids=[1] * prompt_len, num_cached_tokens=cached,
                           outputs=[SimpleNamespace(token_ids=[2] * tokens, finish_reason=reason)])


def test_summarize_counts_tokens_and_rates():
    out = V.summarize([_output(100, 10, "stop", 0), _output(100, 30, "length", 96)], wall_s=2.0)
    assert (out["output_tokens"], out["prompt_tokens"], out["cached_prompt_tokens"]) == (40, 200, 96)
    assert out["output_tok_s"] == 20.0 and out["total_tok_s"] == 120.0
    assert out["response_length"] == {"mean": 20.0, "min": 10, "max": 30}
    assert out["finish_reasons"] == {"stop": 1, "length": 1} and out["response_lengths"] == [10, 30]


def test_kv_cache_from_the_block_count_or_a_reason():
    shape = model_shape.resolve_model("qwen3-4b")
    llm = SimpleNamespace(llm_engine=SimpleNamespace(vllm_config=SimpleNamespace(
        cache_config=SimpleNamespace(num_gpu_blocks=1000, block_size=16))))
    kv = V.kv_cache_info(llm, shape)
    assert kv["tokens"] == 16000 and kv["bytes_per_token"] == 2 * 36 * 8 * 128 * 2  # 144 KiB per token
    assert kv["gib"] == pytest.approx(16000 * 147456 / 2**30)
    assert V.kv_cache_info(SimpleNamespace(), shape)["num_gpu_blocks"] is None


def test_an_unemulated_vllm_is_an_error(tmp_path):
    cfg = VC.config_from_profile("h200-seed")
    with pytest.raises(RuntimeError, match="no vLLM process recorded the emulated card"):
        V.emulation_check(cfg, tmp_path)
    (tmp_path / "w.json").write_text(json.dumps({"instruments": {"emulated_card": {"gib": 47.4}}, "error": None}))
    assert V.emulation_check(cfg, tmp_path)["processes_emulated"] == 1
    env = V.engine_env(cfg, tmp_path)
    assert env["RLKIT_EMULATE_GPU_GIB"] == "47.4" and "rlkit.patches.verl_plugin" in env["VERL_USE_EXTERNAL_MODULES"]


# --------------------------------------------------------------------------- the roofline's reading
GPU = "NVIDIA H200"


def _repo(tmp_path) -> Path:
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    return tmp_path


def _ceiling(root: Path, tag: str, cfg, tok_s: float, when: str, gpu: str = GPU, add: bool = True) -> Path:
    folder = root / roofline.VLLM_CEILINGS / tag
    folder.mkdir(parents=True)
    (folder / "metrics.json").write_text(json.dumps({"shape": cfg.shape(gpu), "output_tok_s": tok_s,
                                                     "measured_utc": when}))
    (folder / "env.json").write_text(json.dumps({"gpus": [{"name": gpu}]}))  # every run records where it ran
    if add:
        subprocess.run(["git", "-C", str(root), "add", str(folder / "metrics.json")], check=True)
    return folder


def _recipe(profile: str) -> dict:
    return load_profile(VC.PROFILE_NOTEBOOK, profile)


def test_the_newest_matching_committed_ceiling_is_read(tmp_path):
    root = _repo(tmp_path)
    seed = VC.config_from_profile("h200-seed")
    recipe = _recipe("h200-seed")
    assert "no standalone vLLM measurement committed" in roofline.vllm_ceiling(recipe, GPU, root=root)["reason"]
    _ceiling(root, "old", seed, 1000.0, "2026-12-01T10:00:00+00:00")
    _ceiling(root, "new", seed, 2000.0, "2026-12-02T10:00:00+00:00")
    _ceiling(root, "local", seed, 9999.0, "2026-12-03T10:00:00+00:00", add=False)  # on disk, not committed
    found = roofline.vllm_ceiling(recipe, GPU, root=root)
    assert found["output_tok_s"] == 2000.0 and found["source"] == f"{roofline.VLLM_CEILINGS}/new"
    assert roofline.vllm_ceiling(recipe, GPU, root=root, committed=False)["output_tok_s"] == 9999.0


def test_a_ceiling_of_another_shape_or_gpu_is_not_used_and_the_reason_says_why(tmp_path):
    root = _repo(tmp_path)
    _ceiling(root, "h200", VC.config_from_profile("h200"), 5000.0, "2026-12-01T10:00:00+00:00")
    _ceiling(root, "a100", VC.config_from_profile("h200-seed"), 3000.0, "2026-12-01T10:00:00+00:00", gpu="NVIDIA A100")
    found = roofline.vllm_ceiling(_recipe("h200-seed"), GPU, root=root)
    assert found["output_tok_s"] is None and found["source"] is None
    assert "h200: " in found["reason"] and "max_response_length 256 (run: 4096)" in found["reason"]
    assert "a100: gpu 'NVIDIA A100' (run: 'NVIDIA H200')" in found["reason"]


def test_outside_a_checkout_no_ceiling_counts_as_committed(tmp_path):
    _ceiling(tmp_path, "h200-seed", VC.config_from_profile("h200-seed"), 2000.0, "2026-12-01", add=False)
    found = roofline.vllm_ceiling(_recipe("h200-seed"), GPU, root=tmp_path)
    assert found["output_tok_s"] is None and "no committed ceiling can be read" in found["reason"]


def test_gen_limit_is_generated_tokens_per_replica_over_the_ceiling(tmp_path):
    root = _repo(tmp_path)
    recipe = _recipe("h200")  # 2 GPUs: each replica generates half of the 32 x 8 responses
    _ceiling(root, "h200", VC.config_from_profile("h200"), 4000.0, "2026-12-01T10:00:00+00:00")
    steps = [{"timing_s/step": 40.0, "timing_s/gen": 16.0, "prompt_length/mean": 100.0, "response_length/mean": 250.0}]
    shape = model_shape.resolve_model("qwen3-4b")
    ceiling = roofline.vllm_ceiling(recipe, GPU, root=root)
    gen = roofline.grpo_step_limits(recipe, steps, shape, GPU, pinned_gbps=None, gen_ceiling=ceiling)["phases"]["gen"]
    assert gen["tokens"] == 128 * 250.0 and gen["limit_s"] == 128 * 250.0 / 4000.0
    assert gen["fraction"] == pytest.approx(gen["limit_s"] / 16.0) and gen["ceiling"] == ceiling["source"]
    missing = roofline.grpo_step_limits(_recipe("h200-seed"), steps, shape, GPU, pinned_gbps=None,
                                        gen_ceiling=roofline.vllm_ceiling(_recipe("h200-seed"), GPU, root=root))
    gen = missing["phases"]["gen"]
    assert gen["limit_s"] is None and gen["fraction"] is None and "matches this run" in gen["reason"]
