"""The GRPO recipe: Qwen3-4B on DAPO-Math-17k with verl 0.9.1 and a colocated vLLM rollout.

:class:`GRPORecipe` (a frozen dataclass, the fields of notebook 05's parameters cell) renders the
exact Hydra overrides for ``python -m verl.trainer.main_ppo``. Defaults are the mission's run
(seed 000, Setup and Step -1): batch 32 prompts x group 8, fully on-policy (one PPO mini-batch of
all 256 sequences, ppo_epochs 1), FSDP1 with fsdp_size=1 on 2 GPUs, param (+ optimizer) offload, vLLM
sleep mode (``free_cache_engine``), gpu_memory_utilization 0.85, rlkit patches switchable one by
one, console logging. The node-needed knobs found on the offline H200 node (notes/gpu-node.md: sdpa
attention, no remove-padding, Ray CPU count, small helper pools) are fields with those defaults.

:func:`run` does the whole recipe: data, model, overrides, ``rlkit preflight``, the planner's
verdict, a verification subprocess that imports verl (so the rlkit plugin loads and applies the
chosen patches, recorded per process) and validates the overrides with verl's own Hydra config and
``validate_config``, then launches verl when GPUs are present and parses verl's console metrics
into ``metrics.json``.

Command line: ``rlkit grpo render|launch|parse`` (also ``python -m rlkit.grpo``).
"""
from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import os
import re
import shlex
import subprocess
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from rlkit import params as P
from rlkit.env import REPO_ROOT

NOTEBOOK = "05_grpo_qwen3_4b"
PLUGIN_MODULE = "rlkit.verl_plugin"
# verl's console logger line (verl/utils/logger/aggregate_logger.py concat_dict_to_str):
# "step:<n> - key:value - key:value", numbers formatted with pprint.pformat (numpy scalars appear as
# np.float64(x)); printed inside the TaskRunner Ray actor, so the driver shows a Ray prefix.
_STEP_LINE = re.compile(r"(?:^|[\s)])step:(\d+) - (.*)$")
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_NUMBER = re.compile(r"^(?:np\.\w+\()?\s*([^()]*?)\s*\)?$")
# Phases of one V1-trainer step (marked_timer names in verl/trainer/ppo/v1), in execution order.
PHASES = ("gen", "reward", "old_log_prob", "ref", "adv", "update_actor", "update_weights")
SUMMARY_KEYS = {
    "step_s": "timing_s/step",
    **{f"{p}_s": f"timing_s/{p}" for p in PHASES},
    "grad_norm": "actor/grad_norm",
    "pg_loss": "actor/pg_loss",
    "entropy": "actor/entropy",
    "score_mean": "critic/score/mean",
    "response_length_mean": "response_length/mean",
    "throughput_tok_s_per_gpu": "perf/throughput",
    "actor_max_allocated_gib": "actor/perf/max_memory_allocated_gb",
    "actor_max_reserved_gib": "actor/perf/max_memory_reserved_gb",
    "host_memory_used_gib": "actor/perf/cpu_memory_used_gb",
}
# The offline node's environment (notes/gpu-node.md); Ray actors inherit it from the driver.
OFFLINE_ENV = {
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "HF_DATASETS_OFFLINE": "1",
    "VLLM_NO_USAGE_STATS": "1",
    "VLLM_USE_FLASHINFER_SAMPLER": "0",
    "RAY_ENABLE_UV_RUN_RUNTIME_ENV": "0",
    "RAY_USAGE_STATS_ENABLED": "0",
    "WANDB_MODE": "disabled",
    "PYTHONUNBUFFERED": "1",
}


@dataclass(frozen=True)
class GRPORecipe:
    """One GRPO run; every field is a parameter of notebook 05 (nbs/params/05_grpo_qwen3_4b.*.yaml)."""

    model: str = "qwen3-4b"            # rlkit.models preset (random-init, written offline) or a hub id / local dir
    model_seed: int = 0                # seed of the random-init weights and of the synthetic data
    data: str = "synthetic"            # "synthetic", a local DAPO-Math-17k parquet, or its hub id
    data_rows: int = 2048              # synthetic rows / cap on unique real rows (0 = all)
    reward: Literal["auto", "synthetic_hash", "dapo_math"] = "auto"  # auto: hash reward for random weights
    max_prompt_length: int = 256
    max_response_length: int = 1024
    train_batch_size: int = 32         # prompts per step
    rollout_n: int = 8                 # group size
    ppo_mini_batch_size: int = 32      # prompts per mini-batch; == train_batch_size is fully on-policy
    ppo_epochs: int = 1
    use_dynamic_bsz: bool = True
    ppo_max_token_len_per_gpu: int = 24576
    micro_batch_size_per_gpu: int = 4  # used when use_dynamic_bsz is false
    lr: float = 1e-6
    n_gpus: int = 2
    fsdp_size: int = 1                 # 1: no sharding, DDP-like replicas (seed Step -1)
    param_offload: bool = True
    optimizer_offload: bool = True     # must be false with HostAdamW (its state lives on the host)
    optimizer: Literal["AdamW", "HostAdamW"] = "AdamW"  # HostAdamW: rlkit.optim, the step on the CPU
    host_pin_memory: bool = True       # HostAdamW: pinned, reused staging buffers (seed Step 4); false: pageable
    host_rank0_owner: bool = False     # HostAdamW: rank 0 alone holds Adam state and broadcasts (seed Step 5)
    gpu_memory_utilization: float = 0.85
    free_cache_engine: bool = True     # vLLM sleep mode between rollouts
    rollout_tp: int = 1
    enforce_eager: bool = False        # true: no CUDA graphs in vLLM
    patches: tuple[str, ...] = ()      # rlkit patches, applied in every verl process by the plugin
    steps: int = 4
    attn_implementation: str = "sdpa"  # the node has no flash-attn
    use_remove_padding: bool = False   # remove-padding needs flash-attn
    gradient_checkpointing: bool = True
    ray_num_cpus: int = 64             # verl's default actor CPU reservations hang on small hosts
    helper_workers: int = 2            # agent-loop workers, reward workers, transfer-queue storage units
    extra_overrides: tuple[str, ...] = ()  # further verl Hydra overrides, appended last
    planner_gpu_gib: float = 47.4      # device memory the planner checks against (A6000: 47.4, H200: 139.8)
    emulate_gpu_gib: float = 0.0       # >0: every verl process sees a card of this size (rlkit.emulate_card); 0: off
    check_rank_identity: bool = True   # after each optimizer step, record max |weights - rank 0's| (n_gpus > 1)
    launch: Literal["auto", "always", "never"] = "auto"  # auto: launch verl when n_gpus CUDA GPUs exist
    expect_failure: bool = False       # the stock arm: a memory failure of verl is the recorded result
    verify_before_launch: bool = True  # false: skip the separate verl config check (~25 s) when launching
    timeout_s: int = 3600

    def __post_init__(self) -> None:
        from rlkit.patches import KNOWN_PATCHES

        def bad(key: str, why: str, fix: str) -> None:
            raise P.ParamError(f"GRPORecipe.{key}: {why}. Fix: {fix}")

        for key in ("train_batch_size", "rollout_n", "ppo_mini_batch_size", "ppo_epochs", "steps", "n_gpus",
                    "max_prompt_length", "max_response_length", "rollout_tp", "helper_workers", "timeout_s"):
            if getattr(self, key) < 1:
                bad(key, f"{getattr(self, key)} is not positive", "use a value >= 1")
        if self.train_batch_size % self.ppo_mini_batch_size:
            bad("ppo_mini_batch_size", f"{self.ppo_mini_batch_size} does not divide train_batch_size "
                f"{self.train_batch_size}", "use a divisor (equal to it for a fully on-policy run)")
        if (self.train_batch_size * self.rollout_n) % self.n_gpus:
            bad("n_gpus", f"{self.train_batch_size}x{self.rollout_n} sequences do not split over {self.n_gpus} GPUs",
                "choose n_gpus dividing train_batch_size * rollout_n")
        if not 0.0 < self.gpu_memory_utilization <= 1.0:
            bad("gpu_memory_utilization", f"{self.gpu_memory_utilization} is outside (0, 1]", "e.g. 0.85")
        if self.fsdp_size != -1 and (self.fsdp_size < 1 or self.n_gpus % self.fsdp_size):
            bad("fsdp_size", f"{self.fsdp_size} must be -1 or divide n_gpus={self.n_gpus}", "use 1 (no sharding)")
        if self.n_gpus % self.rollout_tp:
            bad("rollout_tp", f"{self.rollout_tp} does not divide n_gpus={self.n_gpus}", "use 1")
        unknown = [p for p in self.patches if p not in KNOWN_PATCHES]
        if unknown:
            bad("patches", f"unknown {unknown}", f"choose from {list(KNOWN_PATCHES)}")
        if len(set(self.patches)) != len(self.patches):
            bad("patches", f"{list(self.patches)} repeats a name", "list each patch once")
        if "master_on_host" in self.patches and (self.optimizer != "HostAdamW" or not self.param_offload):
            bad("patches", "master_on_host keeps the fp32 master on the host through the update: it needs param_offload "
                "(the masters it adopts) and HostAdamW (which steps them in place there)",
                "set optimizer: HostAdamW, optimizer_offload: false and param_offload: true, or drop master_on_host")
        if self.optimizer != "HostAdamW" and self.host_rank0_owner:
            bad("host_rank0_owner", "is a HostAdamW option but optimizer is AdamW", "set optimizer: HostAdamW or "
                "host_rank0_owner: false")
        if self.emulate_gpu_gib < 0:
            bad("emulate_gpu_gib", f"{self.emulate_gpu_gib} is negative", "0 (off) or a card size in GiB, e.g. 47.4")
        if self.optimizer == "HostAdamW" and self.optimizer_offload:
            bad("optimizer_offload", "HostAdamW keeps its state on the host; verl's optimizer offload would "
                "ship it to the GPU every update", "set optimizer_offload: false")
        if not self.planner_gpu_gib > 0:
            bad("planner_gpu_gib", f"{self.planner_gpu_gib} is not positive", "the GPU's memory in GiB, e.g. 47.4")
        if self.data_rows < 0:
            bad("data_rows", f"{self.data_rows} is negative", "use 0 (all rows) or a positive cap")
        if self.data == "synthetic" and self.data_rows < self.train_batch_size:
            bad("data_rows", f"{self.data_rows} synthetic rows < train_batch_size {self.train_batch_size}",
                "generate at least one batch of rows")

    @property
    def random_init(self) -> bool:
        from rlkit.models import PRESETS

        return self.model in PRESETS

    @property
    def resolved_reward(self) -> str:
        if self.reward != "auto":
            return self.reward
        return "synthetic_hash" if self.random_init else "dapo_math"


@dataclass(frozen=True)
class Paths:
    """Where a run's inputs live (the model directory and the parquet verl reads)."""

    model: str
    train_file: str


def default_paths(recipe: GRPORecipe) -> Paths:
    """The model directory and data file :func:`prepare_inputs` writes (no files touched)."""
    from rlkit import data, offline_model

    model = str(offline_model.default_dir(recipe.model, recipe.model_seed)) if recipe.random_init else recipe.model
    if recipe.data == "synthetic":
        train = data.GENERATED_DIR / f"synthetic-dapo-{recipe.data_rows}-seed{recipe.model_seed}.parquet"
    else:
        train = data.GENERATED_DIR / "dapo-math-17k.dedup.parquet"
    return Paths(model=model, train_file=str(train))


def _b(value: bool) -> str:
    return "True" if value else "False"


def _onpolicy_overrides(recipe: GRPORecipe, overrides: list[str]) -> list[str]:
    """Extra overrides of the on-policy old-log-prob skip when that patch is chosen.

    ``rlkit.onpolicy.onpolicy_overrides`` reads the composed verl config; it returns ``[]`` (and
    prints why) when the run is not strictly on-policy, so verl then runs the pass unchanged.
    """
    if "skip_old_logprob" not in recipe.patches:
        return []
    try:
        onpolicy = importlib.import_module("rlkit.onpolicy")
    except ModuleNotFoundError as err:
        if err.name != "rlkit.onpolicy":
            raise
        raise P.ParamError("GRPORecipe.patches: skip_old_logprob needs rlkit.onpolicy, which this checkout "
                           "lacks. Fix: remove skip_old_logprob or add rlkit/onpolicy.py") from err
    return list(onpolicy.onpolicy_overrides(compose_verl_config(overrides)))


def render_overrides(recipe: GRPORecipe, paths: Paths | None = None, out_dir: str | os.PathLike | None = None) -> list[str]:
    """The exact Hydra overrides for ``python -m verl.trainer.main_ppo`` (verl 0.9.1)."""
    from rlkit import reward

    paths = paths or default_paths(recipe)
    arr = "actor_rollout_ref"
    optimizer_impl = "rlkit.optim" if recipe.optimizer == "HostAdamW" else "torch.optim"
    out = [
        "algorithm.adv_estimator=grpo",
        "algorithm.use_kl_in_reward=False",
        f"data.train_files={paths.train_file}",
        f"data.val_files={paths.train_file}",
        f"data.train_batch_size={recipe.train_batch_size}",
        f"data.max_prompt_length={recipe.max_prompt_length}",
        f"data.max_response_length={recipe.max_response_length}",
        "data.filter_overlong_prompts=True",
        "data.truncation=error",
        f"data.seed={recipe.model_seed}",
        f"{arr}.model.path={paths.model}",
        f"{arr}.model.use_remove_padding={_b(recipe.use_remove_padding)}",
        f"{arr}.model.enable_gradient_checkpointing={_b(recipe.gradient_checkpointing)}",
        f"+{arr}.model.override_config.attn_implementation={recipe.attn_implementation}",
        f"{arr}.actor.strategy=fsdp",
        f"{arr}.actor.ppo_mini_batch_size={recipe.ppo_mini_batch_size}",
        f"{arr}.actor.ppo_epochs={recipe.ppo_epochs}",
        f"{arr}.actor.use_dynamic_bsz={_b(recipe.use_dynamic_bsz)}",
        f"{arr}.actor.ppo_max_token_len_per_gpu={recipe.ppo_max_token_len_per_gpu}",
    ]
    if not recipe.use_dynamic_bsz:
        out += [
            f"{arr}.actor.ppo_micro_batch_size_per_gpu={recipe.micro_batch_size_per_gpu}",
            f"{arr}.rollout.log_prob_micro_batch_size_per_gpu={recipe.micro_batch_size_per_gpu}",
        ]
    out += [
        f"{arr}.actor.use_kl_loss=False",
        f"{arr}.actor.entropy_coeff=0",
        f"{arr}.actor.optim.lr={recipe.lr}",
        f"{arr}.actor.optim.optimizer_impl={optimizer_impl}",
        f"{arr}.actor.optim.optimizer={recipe.optimizer}",
        *([f"{arr}.actor.optim.override_optimizer_config={{pin_memory:{_b(recipe.host_pin_memory).lower()},"
           f"rank0_owner:{_b(recipe.host_rank0_owner).lower()}}}"] if recipe.optimizer == "HostAdamW" else []),
        f"{arr}.actor.fsdp_config.fsdp_size={recipe.fsdp_size}",
        f"{arr}.actor.fsdp_config.param_offload={_b(recipe.param_offload)}",
        f"{arr}.actor.fsdp_config.optimizer_offload={_b(recipe.optimizer_offload)}",
        f"{arr}.rollout.name=vllm",
        f"{arr}.rollout.n={recipe.rollout_n}",
        f"{arr}.rollout.tensor_model_parallel_size={recipe.rollout_tp}",
        f"{arr}.rollout.gpu_memory_utilization={recipe.gpu_memory_utilization}",
        f"{arr}.rollout.free_cache_engine={_b(recipe.free_cache_engine)}",
        f"{arr}.rollout.enforce_eager={_b(recipe.enforce_eager)}",
        f"{arr}.rollout.agent.num_workers={recipe.helper_workers}",
        f"reward.num_workers={recipe.helper_workers}",
        *reward.verl_overrides(recipe.resolved_reward),
        f"trainer.n_gpus_per_node={recipe.n_gpus}",
        "trainer.nnodes=1",
        f"trainer.total_training_steps={recipe.steps}",
        "trainer.logger=[console]",
        "trainer.val_before_train=False",
        "trainer.test_freq=-1",
        "trainer.save_freq=-1",
        "trainer.project_name=rlkit",
        f"trainer.experiment_name={NOTEBOOK}",
        f"trainer.default_local_dir={Path(out_dir) / 'checkpoints' if out_dir else 'checkpoints/rlkit'}",
        f"ray_kwargs.ray_init.num_cpus={recipe.ray_num_cpus}",
        "+ray_kwargs.ray_init.include_dashboard=False",
        f"transfer_queue.backend.SimpleStorage.num_data_storage_units={recipe.helper_workers}",
    ]
    out += _onpolicy_overrides(recipe, out)
    out += list(recipe.extra_overrides)
    return out


def command(overrides: list[str]) -> list[str]:
    return [sys.executable, "-m", "verl.trainer.main_ppo", *overrides]


def launch_env(recipe: GRPORecipe, record_dir: str | os.PathLike, base: dict | None = None) -> dict[str, str]:
    """Environment of the verl driver (Ray workers inherit it).

    The plugin is named in ``VERL_USE_EXTERNAL_MODULES`` as well as through the entry point, so it
    also loads where rlkit is on PYTHONPATH but not pip-installed (the offline node).
    """
    env = dict(os.environ if base is None else base)
    env.update(OFFLINE_ENV)
    modules = [m for m in env.get("VERL_USE_EXTERNAL_MODULES", "").split(",") if m]
    env["VERL_USE_EXTERNAL_MODULES"] = ",".join(dict.fromkeys([*modules, PLUGIN_MODULE]))
    # vLLM reports its KV cache, concurrency and CUDA-graph memory at INFO; verl's runtime env sets WARN
    # unless the launching environment sets the level (found in the first 2 x H200 run: no KV lines).
    env.setdefault("VLLM_LOGGING_LEVEL", "INFO")
    env["RLKIT_PATCHES"] = ",".join(recipe.patches)
    env["RLKIT_RECORD_DIR"] = str(record_dir)
    env["RLKIT_EMULATE_GPU_GIB"] = f"{recipe.emulate_gpu_gib:g}" if recipe.emulate_gpu_gib else ""
    env["RLKIT_CHECK_RANK_IDENTITY"] = "1" if recipe.check_rank_identity and recipe.n_gpus > 1 else ""
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH", "")) if p)
    return env


def shell_command(recipe: GRPORecipe, overrides: list[str]) -> str:
    """The launch as one copy-pasteable shell line (env vars the recipe sets + the command)."""
    env = {"RLKIT_PATCHES": ",".join(recipe.patches), "VERL_USE_EXTERNAL_MODULES": PLUGIN_MODULE, **OFFLINE_ENV}
    if recipe.emulate_gpu_gib:
        env["RLKIT_EMULATE_GPU_GIB"] = f"{recipe.emulate_gpu_gib:g}"
    env_part = " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items())
    return " \\\n  ".join([env_part, "python -m verl.trainer.main_ppo", *(shlex.quote(o) for o in overrides)])


# ----------------------------------------------------------------------------------------------
# verl's own config: Hydra composition (no verl import) and validation (in a verl subprocess)


def verl_config_dir() -> Path:
    """verl's ``trainer/config`` directory, found without importing verl."""
    spec = importlib.util.find_spec("verl")
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError("verl is not installed; install rlkit[verl] (verl 0.9.1)")
    return Path(next(iter(spec.submodule_search_locations))) / "trainer" / "config"


def compose_verl_config(overrides: list[str]):
    """Compose verl's ``ppo_trainer`` config with ``overrides`` (raises on unknown keys)."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(verl_config_dir()), version_base=None):
        return compose(config_name="ppo_trainer", overrides=list(overrides))


def verify_in_verl(overrides: list[str]) -> dict[str, Any]:
    """Inside a process that imported verl: compose + verl's validate_config + config dataclasses."""
    import verl  # noqa: F401 - loads the rlkit plugin through verl's entry points
    from omegaconf import OmegaConf
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import omega_conf_to_dataclass, validate_config

    from rlkit import patches

    config = compose_verl_config(overrides)
    validate_config(config, use_reference_policy=need_reference_policy(config), use_critic=need_critic(config))
    checked = []
    for section in ("actor_rollout_ref.actor", "actor_rollout_ref.rollout", "actor_rollout_ref.model",
                    "algorithm"):
        node = OmegaConf.select(config, section)
        omega_conf_to_dataclass(node)
        checked.append(section)
    return {"validated_sections": checked, "active_patches": patches.active(),
            "use_reference_policy": bool(need_reference_policy(config)), "use_critic": bool(need_critic(config))}


def verify_subprocess(recipe: GRPORecipe, overrides: list[str], out_dir: Path, timeout: float = 600) -> dict:
    """Run :func:`verify_in_verl` in a fresh process with the run's env; check the plugin records."""
    record_dir = out_dir / "plugin_records_verify"
    clear_plugin_records(record_dir)
    (out_dir / "overrides.json").write_text(json.dumps(overrides, indent=1))
    result_path = out_dir / "verify_result.json"
    result_path.unlink(missing_ok=True)
    cmd = [sys.executable, "-m", "rlkit.grpo", "verify", "--overrides", str(out_dir / "overrides.json"),
           "--result", str(result_path)]
    log_path = out_dir / "verify.log"
    with open(log_path, "w") as log:
        proc = subprocess.run(cmd, check=False, stdout=log, stderr=subprocess.STDOUT, env=launch_env(recipe, record_dir),
                              timeout=timeout, cwd=REPO_ROOT)
    if proc.returncode != 0 or not result_path.exists():
        tail = "\n".join(log_path.read_text(errors="replace").splitlines()[-30:])
        raise RuntimeError(f"verl rejected the rendered config or the rlkit plugin failed "
                           f"(exit {proc.returncode}); last lines of {log_path}:\n{tail}")
    result = json.loads(result_path.read_text())
    records = check_plugin_records(record_dir, recipe.patches)
    result["plugin_records"] = records
    if sorted(result["active_patches"]) != sorted(recipe.patches):  # active() lists them in registry order
        raise RuntimeError(f"verl process has active patches {result['active_patches']}, recipe asked for "
                           f"{list(recipe.patches)}")
    return result


def clear_plugin_records(record_dir: Path) -> None:
    """Empty ``record_dir`` of the records a previous launch's processes wrote (the plugin's *.json, the
    rank-identity checker's *.jsonl), creating it if needed."""
    from rlkit.patches import rank_identity

    record_dir.mkdir(parents=True, exist_ok=True)
    for old in [*record_dir.glob("*.json"), *record_dir.glob(f"{rank_identity.RECORD_PREFIX}*.jsonl")]:
        old.unlink()


def read_plugin_records(record_dir: str | os.PathLike) -> list[dict]:
    """All per-process records the rlkit verl plugin wrote into ``record_dir``."""
    path = Path(record_dir)
    return [json.loads(p.read_text()) for p in sorted(path.glob("*.json"))] if path.exists() else []


def check_plugin_records(record_dir: str | os.PathLike, expected, *, require_worker: bool = False) -> list[dict]:
    """Every recorded verl process applied exactly ``expected``; raise naming each offender otherwise.

    ``require_worker``: after a real launch at least one Ray worker must have recorded (the actors
    import verl, so a missing worker record means the plugin never loaded there).
    """
    records = read_plugin_records(record_dir)
    expected = list(expected)
    problems = []
    if not records:
        problems.append(f"no plugin records in {record_dir}: the rlkit plugin never loaded in a verl process")
    for r in records:
        if r.get("error"):
            problems.append(f"pid {r['pid']} ({r['role']}): {r['error']}")
        elif r.get("applied") != expected:
            problems.append(f"pid {r['pid']} ({r['role']}) applied {r.get('applied')}, the run asked for {expected}")
    if require_worker and records and not any(r.get("role") == "ray_worker" for r in records):
        problems.append("no Ray worker recorded: the plugin did not load in the worker processes")
    if problems:
        raise RuntimeError("rlkit plugin check failed:\n  " + "\n  ".join(problems))
    return records


# ----------------------------------------------------------------------------------------------
# verl console metrics


def _number(raw: str):
    match = _NUMBER.match(raw.strip())
    text = match.group(1) if match else raw.strip()
    try:
        return int(text)
    except ValueError:
        pass
    try:
        return float(text)
    except ValueError:
        return text


def parse_console_metrics(text: str) -> list[dict[str, Any]]:
    """Per-step metric dicts from verl's console logger output, ordered by step.

    Lines of the same step (verl logs validation and training metrics separately) are merged.
    """
    steps: dict[int, dict[str, Any]] = {}
    for line in _ANSI.sub("", text).splitlines():
        match = _STEP_LINE.search(line)
        if not match:
            continue
        row = steps.setdefault(int(match.group(1)), {})
        for item in match.group(2).split(" - "):
            key, sep, raw = item.partition(":")
            if sep:
                row[key.strip()] = _number(raw)
    return [{"step": step, **steps[step]} for step in sorted(steps)]


def training_steps(steps: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The steps that trained (a step timing is logged); drops validation-only lines such as step 0."""
    return [s for s in steps if "timing_s/step" in s]


def summarize(steps: list[dict[str, Any]]) -> dict[str, Any]:
    """Means of the headline metrics over training steps 2.. (step 1 carries one-off start-up);
    step 1 alone when it is the only one."""
    trained = training_steps(steps)
    if not trained:
        return {}
    window = trained[1:] if len(trained) > 1 else trained
    out: dict[str, Any] = {"steps_averaged": [s["step"] for s in window]}
    for name, key in SUMMARY_KEYS.items():
        values = [s[key] for s in window if isinstance(s.get(key), (int, float))]
        out[name] = sum(values) / len(values) if values else None
    return out


def phase_table(steps: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per (step, phase) with seconds, plus the unattributed rest of the step."""
    rows = []
    for s in training_steps(steps):
        total = s.get("timing_s/step")
        known = 0.0
        for phase in PHASES:
            value = s.get(f"timing_s/{phase}")
            if isinstance(value, (int, float)):
                rows.append({"step": s["step"], "phase": phase, "seconds": float(value)})
                known += float(value)
        if isinstance(total, (int, float)):
            rows.append({"step": s["step"], "phase": "other", "seconds": max(float(total) - known, 0.0)})
    return rows


def phase_figure(steps: list[dict[str, Any]], title: str = "verl step phases"):
    """Stacked bars: seconds per phase for each training step (plotly, imported here only)."""
    import plotly.graph_objects as go

    rows = phase_table(steps)
    fig = go.Figure()
    for phase in (*PHASES, "other"):
        points = [r for r in rows if r["phase"] == phase]
        if points:
            fig.add_bar(name=phase, x=[r["step"] for r in points], y=[r["seconds"] for r in points])
    fig.update_layout(barmode="stack", title=title, xaxis_title="step", yaxis_title="seconds",
                      xaxis={"dtick": 1})
    return fig


def describe(metrics: dict[str, Any]) -> str:
    """The findings of a run in words, every number taken from ``metrics``."""
    recipe, verify = metrics["recipe"], metrics.get("verify", {})
    lines = [
        (f"Recipe: {recipe['model']} on {metrics['data']['rows']} {metrics['data']['source']} prompts "
        f"({metrics['data'].get('duplicates_removed', 0)} duplicates removed), {recipe['train_batch_size']} prompts x "
        f"{recipe['rollout_n']} samples per step, reward {metrics['reward']}, patches "
        f"{', '.join(recipe['patches']) or 'none'}."),
    ]
    if verify.get("skipped"):
        lines.append(f"Config check before the launch skipped: {verify['skipped']}.")
    else:
        lines.append(f"verl's own config accepted the {len(metrics['overrides'])} overrides (sections validated: "
                     f"{', '.join(verify.get('validated_sections', []))}); the plugin applied "
                     f"{verify.get('active_patches')} in {len(verify.get('plugin_records', []))} verl process(es).")
    preflight = metrics.get("preflight", {})
    if preflight.get("available"):
        severities = [f["severity"] for f in preflight["findings"] + preflight["planner"]]
        lines.append(f"Preflight: {severities.count('error')} error(s), {severities.count('warning')} warning(s); "
                     f"planner: {'; '.join(f['message'] for f in preflight['planner']) or 'no verdict'}.")
    launch = metrics.get("launch") or {}
    if metrics.get("launched"):
        lines.append(f"Outcome: {outcome(metrics)}." + (f" verl: {launch['failure']['line'][:420]}"
                                                          if launch.get("failure") else ""))
        if launch.get("collected"):
            lines.append(f"Metrics collected after the run from {launch['collected']['from']}: "
                         f"{launch['collected']['note']}.")
    emulated = recipe.get("emulate_gpu_gib")
    if emulated:
        lines.append(f"Card emulated: every verl process saw a {emulated:g} GiB card (torch.cuda.mem_get_info) and "
                     f"its allocator was capped at {emulated:g} GiB; vLLM reserved "
                     f"{recipe['gpu_memory_utilization']:g} x {emulated:g} GiB.")
    check = metrics.get("sanity")
    if check:
        rank = (f"; ranks' weights after each step: max abs diff {check['rank_max_abs_diff']} "
                f"(check {check['rank_check_s_mean']:.2f} s/step)" if "ranks_identical" in check else "")
        lines.append(f"Sanity bar {'passed' if check['passed'] else 'FAILED'}: grad_norm finite and non-zero "
                     f"{check['grad_norm_finite_nonzero']}, pg_loss finite {check['pg_loss_finite']}, no NaN "
                     f"{check['no_nan']}{rank}.")
    summary = metrics.get("summary") or {}
    if summary.get("gpu_peak_used_gib"):
        lines.append(f"Device-wide peak per GPU (all processes, 1 Hz samples): "
                     f"{', '.join(f'{g:.2f}' for g in summary['gpu_peak_used_gib'])} GiB.")
    if summary.get("host_peak_above_baseline_gib") is not None:
        lines.append(f"Host memory (the node's used memory, 1 Hz): peak {summary['host_peak_above_baseline_gib']:.1f} GiB "
                     "above its value before verl started.")
    if summary.get("steps_averaged"):
        lines.append(
            f"Measured over steps {summary['steps_averaged']}: step {summary['step_s']:.1f} s (gen "
            f"{summary['gen_s'] or 0:.1f} s, old_log_prob {summary['old_log_prob_s'] or 0:.1f} s, update_actor "
            f"{summary['update_actor_s'] or 0:.1f} s, update_weights {summary['update_weights_s'] or 0:.2f} s); "
            f"grad_norm {summary['grad_norm']}, actor peak allocated {summary['actor_max_allocated_gib']} GiB, "
            f"{summary['throughput_tok_s_per_gpu'] or 0:.0f} tokens/s/GPU."
        )
    elif not metrics.get("launched"):
        lines.append(f"No training steps: {metrics.get('launch_reason')}")
    return "\n".join(lines)


# ----------------------------------------------------------------------------------------------
# the run


def prepare_inputs(recipe: GRPORecipe) -> tuple[Paths, dict, dict]:
    """Write the data parquet and (for presets) the random-init model; returns paths and their info."""
    from rlkit import data, offline_model

    paths = default_paths(recipe)
    data_info = data.prepare(recipe.data, rows=recipe.data_rows, seed=recipe.model_seed,
                             out_dir=Path(paths.train_file).parent).as_dict()
    if recipe.random_init:
        model_info = offline_model.write_offline_model(recipe.model, paths.model, seed=recipe.model_seed)
    else:
        model_info = {"path": recipe.model, "preset": None}
    return Paths(model=model_info["path"], train_file=data_info["path"]), data_info, model_info


_PREPARE_CHILD = """
import json, sys
from rlkit import grpo, params
recipe = params.build(grpo.GRPORecipe, json.loads(sys.argv[1]))
paths, data_info, model_info = grpo.prepare_inputs(recipe)
print(json.dumps([paths.model, paths.train_file, data_info, model_info], default=str))
"""


def prepare_inputs_isolated(recipe):
    """:func:`rlkit.grpo.prepare_inputs` in a child process: building a random-init model uses the GPU when
    there is one, and this process (the sampler's, for the whole job) must hold no CUDA memory."""
    done = subprocess.run([sys.executable, "-c", _PREPARE_CHILD, json.dumps(P.as_dict(recipe))], check=False,
                          capture_output=True, text=True, timeout=1800)
    if done.returncode != 0:
        raise RuntimeError(f"preparing the inputs failed (exit {done.returncode}):\n{done.stderr[-3000:]}")
    model, train_file, data_info, model_info = json.loads(done.stdout.strip().splitlines()[-1])
    return Paths(model=model, train_file=train_file), data_info, model_info


def preflight_findings(recipe: GRPORecipe, overrides: list[str]) -> dict[str, Any]:
    """``rlkit.preflight.check_overrides`` on the rendered overrides (when that module exists).

    The preflight runs the phase-budget planner (rlkit.budget) for ``planner_gpu_gib``; its finding
    (check ``planner``) is the planner's verdict, reported separately.
    """
    try:
        preflight = importlib.import_module("rlkit.preflight")
    except ModuleNotFoundError as err:
        if err.name != "rlkit.preflight":
            raise
        message = "rlkit.preflight is not in this checkout: preflight and planner skipped"
        return {"available": False, "findings": [], "planner": [], "message": message}
    findings = [_plain(f) for f in preflight.check_overrides(overrides, active_patches=list(recipe.patches),
                                                             gpu_gib=recipe.planner_gpu_gib)]
    return {"available": True, "findings": [f for f in findings if f.get("check") != "planner"],
            "planner": [f for f in findings if f.get("check") == "planner"],
            "errors": sum(f.get("severity") == "error" for f in findings)}


def format_findings(findings: list[dict[str, Any]]) -> str:
    """Findings as text lines: SEVERITY key: message / fix."""
    if not findings:
        return "no findings"
    return "\n".join(f"{f.get('severity', '').upper():8}{f.get('key')}: {f.get('message')}\n{'':8}fix: {f.get('fix')}"
                     for f in findings)


def _plain(obj):
    """JSON-able form of a finding/verdict object (dataclass, mapping or anything with str())."""
    import dataclasses

    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {k: _plain(v) for k, v in dataclasses.asdict(obj).items()}
    if isinstance(obj, dict):
        return {str(k): _plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_plain(v) for v in obj]
    if isinstance(obj, (str, int, float, bool)) or obj is None:
        return obj
    return str(obj)


def gpu_count() -> int:
    """CUDA devices visible (no CUDA context is created)."""
    try:
        import torch
    except ImportError:
        return 0
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def launch_decision(recipe: GRPORecipe) -> tuple[bool, str]:
    have = gpu_count()
    if recipe.launch == "never":
        return False, "launch: never (set launch: auto or always to run verl)"
    if recipe.launch == "always":
        return True, f"launch: always ({have} CUDA GPU(s) visible)"
    if have >= recipe.n_gpus:
        return True, f"{have} CUDA GPU(s) visible, recipe needs {recipe.n_gpus}"
    return False, (f"verl launch skipped: {have} CUDA GPU(s) visible, the recipe needs n_gpus={recipe.n_gpus}. "
                   f"Everything before the launch ran for real; run the h200 profile on a GPU node "
                   f"(python -m rlkit.grpo launch --profile h200)")


def session_members(sid: int) -> list[int]:
    """PIDs of the processes in session ``sid`` (Linux /proc; [] elsewhere)."""
    members = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[3]) == sid:  # after the command name: state, ppid, pgrp, session
            members.append(int(stat.parent.name))
    return members


def stop_session(proc: subprocess.Popen) -> None:
    """Stop verl and everything it started in its session (Ray's daemons and workers, vLLM workers): the
    next launch must find the GPUs idle. SIGTERM to the group first, then SIGKILL to whatever is left."""
    import signal

    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=20)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        pass
    for pid in session_members(proc.pid):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    if proc.poll() is None:
        proc.wait(timeout=10)


def run_in_own_session(argv: list[str], *, env: dict[str, str] | None, cwd: Path, log_path: Path, timeout_s: float,
                       on_line=None) -> tuple[int | str, float]:
    """Run ``argv`` (verl's trainer) in a process session of its own with its console written straight to
    ``log_path`` (``on_line`` gets each line as it lands there), and stop the whole session afterwards: on a
    timeout, and after a clean exit too, since Ray's daemons and vLLM workers must not hold the GPUs into the
    next launch. Returns the exit code (``"timeout"`` when ``timeout_s`` ran out) and the wall seconds."""
    import threading

    start = time.time()
    with open(log_path, "w") as log:
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=cwd, start_new_session=True)
    follower = None
    if on_line is not None:
        follower = threading.Thread(target=_follow, args=(log_path, proc, on_line), daemon=True)
        follower.start()
    try:
        returncode = proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        returncode = "timeout"
    finally:
        stop_session(proc)
    if follower is not None:
        follower.join()
    return returncode, time.time() - start


def _follow(path: Path, proc: subprocess.Popen, on_line, poll_s: float = 0.2) -> None:
    """Hand every complete line of the growing file ``path`` to ``on_line`` until ``proc`` has exited and
    the file is read to its end."""
    pending = ""
    with open(path, errors="replace") as f:
        while True:
            exited = proc.poll() is not None
            chunk = f.read()
            pending += chunk
            *lines, pending = pending.split("\n")
            for line in lines:
                on_line(line + "\n")
            if exited and not chunk:
                if pending:
                    on_line(pending)
                return
            if not chunk:
                time.sleep(poll_s)


def _start_samplers() -> tuple[Any, Any]:
    """1 Hz samplers of device-wide GPU memory (when a GPU can be read) and of the node's used host memory;
    None for one that cannot run here."""
    from rlkit.measure import MemorySampler, SamplerUnavailable, host_memory_reader

    gpu = host = None
    try:
        gpu = MemorySampler(interval_s=1.0).start() if gpu_count() else None
    except SamplerUnavailable as err:
        print(f"no GPU memory sampling: {err}")
    try:
        host = MemorySampler(interval_s=1.0, reader=host_memory_reader(), source="/proc/meminfo").start()
    except SamplerUnavailable as err:
        print(f"no host memory sampling: {err}")
    return gpu, host


def host_memory_summary(sampler) -> dict[str, Any]:
    """The node's used host memory over a launch: idle baseline (the first sample, before verl starts), peak,
    and the peak above the baseline (what the job added, other tenants of the node aside)."""
    used = [sample[0] for _, sample in sampler.samples]
    return {"source": sampler.source, "interval_s": sampler.interval_s, "samples": len(used),
            "baseline_gib": used[0], "peak_used_gib": max(used), "peak_above_baseline_gib": max(used) - used[0]}


def read_run_files(log_text: str, record_dir: Path) -> dict[str, Any]:
    """What a verl run left, read back: per-step console metrics, the first memory failure in its log, and the
    rank-identity rows its processes recorded."""
    from rlkit.patches import rank_identity

    return {"steps": parse_console_metrics(log_text), "failure": find_failure_in_log(log_text),
            "rank_identity": rank_identity.read_records(record_dir)}


def launch_verl(recipe: GRPORecipe, overrides: list[str], out_dir: Path) -> dict[str, Any]:
    """Run verl's trainer to completion beside the GPU sampler; parse its console metrics; check every
    process's plugin record and the ranks' weights. A memory failure (an OOM, vLLM refusing to start:
    how an arm fails on the emulated card) is returned as the result, in ``failure``; any other failure
    raises. ``recipe.expect_failure`` says whether the arm was expected to fail (the stock arm)."""
    record_dir = out_dir / "plugin_records"
    clear_plugin_records(record_dir)
    log_path = out_dir / "verl.log"
    sampler, host_sampler = _start_samplers()
    returncode, wall = run_in_own_session(command(overrides), env=launch_env(recipe, record_dir), cwd=out_dir,
                                          log_path=log_path, timeout_s=recipe.timeout_s)
    gpu_memory = host_memory = None
    if sampler is not None:
        sampler.stop()
        gpu_memory = {**sampler.summary(), "timeline": [[round(t, 1), [round(u, 3) for u in used]]
                                                         for t, used in sampler.samples]}
    if host_sampler is not None:
        host_sampler.stop()
        host_memory = host_memory_summary(host_sampler)
    text = log_path.read_text(errors="replace")
    result = {**read_run_files(text, record_dir), "wall_s": wall, "returncode": returncode,
              "log_path": str(log_path), "gpu_memory": gpu_memory, "host_memory": host_memory}
    steps, failure = result["steps"], result["failure"]
    if returncode != 0 or len(training_steps(steps)) < recipe.steps:
        if failure is not None:  # an OOM / vLLM refusal is what this arm does on this card: a result
            result["plugin_records"] = read_plugin_records(record_dir)
            return result
        tail = "\n".join(text.splitlines()[-40:])
        raise RuntimeError(f"verl exited with {returncode} after {wall:.0f} s having logged {len(training_steps(steps))}/"
                           f"{recipe.steps} steps; full log {log_path}; last lines:\n{tail}")
    result["plugin_records"] = check_plugin_records(record_dir, recipe.patches, require_worker=True)
    bad = [r for r in result["rank_identity"] if r["max_abs_diff"] != 0.0 or r["differing_elements"]]
    if bad:
        result["sanity_failures"] = [f"optimizer step {r['optimizer_step']}: ranks differ by up to "
                                     f"{r['max_abs_diff']:g} ({r['differing_elements']} elements)" for r in bad]
    return result


def sanity(steps: list[dict[str, Any]], rank_rows: list[dict[str, Any]], n_gpus: int) -> dict[str, Any]:
    """The issue's bar for every arm: finite non-zero grad_norm, finite pg_loss, no NaN, ranks bit-identical."""
    import math

    trained = training_steps(steps)
    grad = [s.get("actor/grad_norm") for s in trained]
    loss = [s.get("actor/pg_loss") for s in trained]
    nan_keys = sorted({k for s in trained for k, v in s.items() if isinstance(v, float) and math.isnan(v)})
    checks = {
        "grad_norm_finite_nonzero": bool(grad) and all(isinstance(g, (int, float)) and math.isfinite(g) and g != 0
                                                        for g in grad),
        "pg_loss_finite": bool(loss) and all(isinstance(v, (int, float)) and math.isfinite(v) for v in loss),
        "no_nan": not nan_keys,
    }
    if n_gpus > 1:
        checks["ranks_identical"] = (len(rank_rows) >= len(trained) > 0
                                     and all(r["max_abs_diff"] == 0.0 and not r["differing_elements"] for r in rank_rows))
    return {**checks, "passed": all(checks.values()), "nan_keys": nan_keys,
            "rank_max_abs_diff": max((r["max_abs_diff"] for r in rank_rows), default=None),
            "rank_check_s_mean": (sum(r["seconds"] for r in rank_rows) / len(rank_rows)) if rank_rows else None}


def run(recipe: GRPORecipe, out_dir: str | os.PathLike | None = None) -> dict[str, Any]:
    """The whole recipe; returns ``metrics.json`` content (see ``METRICS_KEYS``)."""
    from rlkit.results import notebook_out_dir

    out = Path(out_dir) if out_dir else notebook_out_dir(NOTEBOOK)
    out.mkdir(parents=True, exist_ok=True)
    paths, data_info, model_info = prepare_inputs_isolated(recipe) if gpu_count() else prepare_inputs(recipe)
    overrides = render_overrides(recipe, paths, out)
    preflight = preflight_findings(recipe, overrides)
    launched, reason = launch_decision(recipe)
    if launched and not recipe.verify_before_launch:
        verify = {"skipped": "verify_before_launch is false: verl validates the same overrides at start-up and "
                             "every verl process's plugin record is checked after the run"}
    else:
        verify = verify_subprocess(recipe, overrides, out)
    print(reason)
    return recipe_metrics(recipe, data=data_info, model=model_info, overrides=overrides, preflight=preflight,
                          verify=verify, launch_reason=reason,
                          launch=launch_verl(recipe, overrides, out) if launched else None)


def recipe_metrics(recipe: GRPORecipe, *, data: dict, model: dict, overrides: list[str], preflight: dict,
                   verify: dict, launch_reason: str, launch: dict[str, Any] | None) -> dict[str, Any]:
    """``metrics.json`` content of one run (``launch``: the verl launch's result, None when not launched)."""
    metrics: dict[str, Any] = {
        "recipe": P.as_dict(recipe),
        "reward": recipe.resolved_reward,
        "data": data,
        "model": model,
        "overrides": overrides,
        "command": shell_command(recipe, overrides),
        "preflight": preflight,
        "verify": verify,
        "launched": launch is not None,
        "launch_reason": launch_reason,
        "steps": [],
        "summary": {},
    }
    if launch is not None:
        add_launch_result(metrics, recipe, launch)
    metrics["arms"] = [arm_row(arm_name(metrics["recipe"]), metrics)]
    return metrics


def optimizer_step_summary(records: list[dict[str, Any]], steps: list[int]) -> dict[str, Any]:
    """Mean optimizer-step seconds (clip + optimizer.step, from the rank-identity records) over ``steps``, and
    the threads the host step used; empty for records written before they carried these fields. With one
    mini-batch per training step, optimizer step n is training step n."""
    rows = [r for r in records if r.get("optimizer_step") in steps and "optimizer_step_s" in r]
    if not rows:
        return {}
    return {"optimizer_step_s": sum(r["optimizer_step_s"] for r in rows) / len(rows),
            "host_threads": rows[-1].get("host_threads"), "torch_threads": rows[-1].get("torch_threads")}


def add_launch_result(metrics: dict[str, Any], recipe: GRPORecipe, result: dict[str, Any]) -> None:
    """Steps, summary, sanity bar and outcome of a verl launch, into ``metrics``."""
    steps = result.pop("steps")
    summary = summarize(steps)
    if result.get("gpu_memory"):
        summary["gpu_peak_used_gib"] = result["gpu_memory"]["peak_used_gib"]
    if result.get("host_memory"):
        summary["host_peak_above_baseline_gib"] = result["host_memory"]["peak_above_baseline_gib"]
    summary.update(optimizer_step_summary(result.get("rank_identity", []), summary.get("steps_averaged", [])))
    metrics.update(steps=steps, summary=summary, launch=result,
                   sanity=sanity(steps, result.get("rank_identity", []), recipe.n_gpus) if training_steps(steps) else None)


def collect(run_dir: str | os.PathLike, note: str) -> dict[str, Any]:
    """``metrics.json`` content for a run folder whose launcher did not finish (killed by a time limit, say),
    from what the run left: params.yaml, overrides.json, verify_result.json, verl.log, plugin records.

    Everything is recomputed from those files by the same code as :func:`run`; what only the launcher knew
    (its exit code, wall time, the GPU sampler's timeline) is absent and ``launch.collected`` says so.
    """
    import yaml

    run_dir = Path(run_dir)
    missing = [n for n in ("params.yaml", "overrides.json", "verl.log") if not (run_dir / n).exists()]
    if missing:
        raise FileNotFoundError(f"{run_dir} lacks {missing}: not a run folder of `rlkit grpo launch`")
    recipe = P.build(GRPORecipe, yaml.safe_load((run_dir / "params.yaml").read_text()), where=str(run_dir / "params.yaml"))
    overrides = json.loads((run_dir / "overrides.json").read_text())
    verify_path = run_dir / "verify_result.json"
    record_dir = run_dir / "plugin_records"
    paths = default_paths(recipe)
    launch = {**read_run_files((run_dir / "verl.log").read_text(errors="replace"), record_dir),
              "gpu_memory": None, "plugin_records": read_plugin_records(record_dir),
              "collected": {"from": run_dir.name, "note": note}}
    return recipe_metrics(
        recipe,
        data={"source": recipe.data, "path": paths.train_file, "rows": recipe.data_rows},
        model={"path": paths.model, "preset": recipe.model if recipe.random_init else None},
        overrides=overrides,
        preflight=_preflight_with_local_model(recipe, overrides, paths.model),
        verify=({**json.loads(verify_path.read_text()),
                 "plugin_records": read_plugin_records(run_dir / "plugin_records_verify")}
                if verify_path.exists() else {}),
        launch_reason=f"collected from {run_dir.name} after the run: {note}",
        launch=launch,
    )


@contextmanager
def _local_model_overrides(recipe: GRPORecipe, overrides: list[str]):
    """``overrides`` with a random-init model's directory (written on the node, absent here) stood in for by a
    folder holding its preset's config.json, which is all the planner reads; yields (overrides, that folder)."""
    import tempfile

    model_path = next((o.split("=", 1)[1] for o in overrides if o.startswith("actor_rollout_ref.model.path=")), "")
    if not recipe.random_init or (Path(model_path) / "config.json").exists():
        yield overrides, None
        return
    from rlkit import models

    with tempfile.TemporaryDirectory() as tmp:
        models.preset_config(recipe.model).to_json_file(str(Path(tmp) / "config.json"))
        yield [f"actor_rollout_ref.model.path={tmp}" if o.startswith("actor_rollout_ref.model.path=") else o
               for o in overrides], tmp


def _preflight_with_local_model(recipe: GRPORecipe, overrides: list[str], model_path: str) -> dict[str, Any]:
    """Preflight of a collected run, with :func:`_local_model_overrides`."""
    with _local_model_overrides(recipe, overrides) as (local, tmp):
        found = preflight_findings(recipe, local)
    return json.loads(json.dumps(found).replace(tmp, model_path)) if tmp else found


def planner_check(metrics: dict[str, Any]) -> dict[str, Any] | None:
    """The planner for this run's exact overrides next to what the actor measured: its peak over the step's
    compute phases (verl's actor/perf/max_memory_allocated_gb) against the planner's largest actor total, or,
    for a run that ran out of the card in a phase, whether the planner also puts that phase over the card."""
    from rlkit import budget, preflight

    recipe_values = dict(metrics["recipe"])
    recipe = P.build(GRPORecipe, recipe_values, where="metrics.json recipe")
    card = recipe.emulate_gpu_gib or recipe.planner_gpu_gib
    with _local_model_overrides(recipe, metrics["overrides"]) as (local, _):
        spec = preflight.planner_spec_for_overrides(local, recipe.patches, gpu_gib=card)
        if spec is None:
            return None
        plan = budget.plan(spec)
    actor = {phase: sum(plan.device_gib[phase].get(c, 0.0) for c in budget.ACTOR_ALLOCATED_COMPONENTS)
             for phase in ("log_prob", "update_fwd_bwd", "optimizer_step") if phase in plan.device_gib}
    peak_phase = max(actor, key=actor.get)
    summary, failure = metrics.get("summary") or {}, (metrics.get("launch") or {}).get("failure")
    measured = summary.get("actor_max_allocated_gib")
    out = {"card_gib": card, "options": spec.options, "logits_path": spec.logits_path,
           "planner_actor_gib": actor, "planner_actor_peak_phase": peak_phase,
           "planner_actor_peak_gib": actor[peak_phase], "planner_verdict": plan.verdict,
           "measured_actor_peak_gib": measured, "ratio": None, "agrees": None}
    if measured:
        out["ratio"] = actor[peak_phase] / measured
        out["agrees"] = abs(out["ratio"] - 1.0) <= 0.10
    elif failure and failure["kind"] == "torch_oom":
        phase = {"update_actor": "update_fwd_bwd", "old_log_prob": "log_prob"}.get(failure["phase"], failure["phase"])
        out["measured_oom_phase"] = phase
        out["agrees"] = actor.get(phase, 0.0) > card  # the planner also puts that phase over the card
    elif failure and failure["kind"] == "vllm_startup":
        # what the actor (and its process overhead) leaves free when vLLM starts, against vLLM's own reading
        residue = sum(plan.device_gib["rollout"].get(c, 0.0) for c in (*budget.ACTOR_ALLOCATED_COMPONENTS, "actor_non_torch"))
        out["planner_free_at_vllm_start_gib"] = card - residue
        out["measured_free_at_vllm_start_gib"] = failure["free_gib"]
        out["ratio"] = out["planner_free_at_vllm_start_gib"] / failure["free_gib"]
        out["agrees"] = plan.verdict == "vLLM refuses to start" and abs(out["ratio"] - 1.0) <= 0.10
    return out


def outcome(metrics: dict[str, Any]) -> str:
    """What a run did, in a few words: trained, or how it failed."""
    if not metrics.get("launched"):
        return "not launched"
    recipe, launch = metrics.get("recipe", {}), metrics.get("launch", {})
    failure, trained = launch.get("failure"), len(training_steps(metrics.get("steps", [])))
    if failure is not None:
        return f"{failure['kind']} in {failure['phase']}" + (" (expected)" if recipe.get("expect_failure") else "")
    if trained < recipe.get("steps", 0):
        return f"stopped after {trained}/{recipe['steps']} steps"
    return "trained" + (" (a failure was expected)" if recipe.get("expect_failure") else "")


def find_failure_in_log(text: str) -> dict[str, Any] | None:
    from rlkit.experiments.util_sweep import find_failure

    return find_failure(text)


METRICS_KEYS = ("recipe", "reward", "data", "model", "overrides", "command", "preflight", "verify",
                "launched", "launch_reason", "steps", "summary", "arms")  # launched runs add launch, outcome, sanity


def arm_name(recipe: dict[str, Any]) -> str:
    """A run's arm label from what the arms vary: patches and optimizer."""
    parts = list(recipe.get("patches", [])) + (["HostAdamW"] if recipe.get("optimizer") == "HostAdamW" else [])
    return "+".join(parts) or "stock"


def arm_row(name: str, metrics: dict[str, Any]) -> dict[str, Any]:
    """One row of the arms table: what varied (patches, optimizer, offload) and the headline numbers."""
    recipe = metrics.get("recipe", {})
    row = {
        "arm": name,
        "patches": ",".join(recipe.get("patches", [])) or "(none)",
        "optimizer": recipe.get("optimizer"),
        "param_offload": recipe.get("param_offload"),
        "optimizer_offload": recipe.get("optimizer_offload"),
        "gpu_memory_utilization": recipe.get("gpu_memory_utilization"),
        "launched": metrics.get("launched"),
        "outcome": outcome(metrics),
        "sanity_passed": (metrics.get("sanity") or {}).get("passed"),
        "steps": len(training_steps(metrics.get("steps", []))),
    }
    row.update({k: v for k, v in metrics.get("summary", {}).items() if k != "steps_averaged"})
    return row


def read_results(results_dir: str | os.PathLike) -> dict[str, Any]:
    """Saved results: one run's ``metrics.json``, or a folder of arm folders each with one.

    For a folder of arms, the metrics of the first arm (sorted by name) are returned with ``arms``
    holding a row per arm, so the notebook renders the same way in both cases.
    """
    from rlkit.results import read_metrics

    path = Path(results_dir)
    path = path if path.is_absolute() else REPO_ROOT / path
    if (path / "metrics.json").exists():
        metrics = read_metrics(path)
        metrics["arms"] = [arm_row(path.name, metrics)]
        return metrics
    arms = sorted(p for p in path.iterdir() if (p / "metrics.json").exists()) if path.is_dir() else []
    if not arms:
        raise FileNotFoundError(f"{path} holds no metrics.json, directly or in sub-folders; fix results_dir")
    loaded = {p.name: read_metrics(p) for p in arms}
    if any(m.get("launched") for m in loaded.values()):  # CPU smoke runs beside measured arms are not arms
        loaded = {name: m for name, m in loaded.items() if m.get("launched")}
    arms = [p for p in arms if p.name in loaded]
    first = dict(loaded[arms[0].name])
    first["arms"] = [arm_row(name, m) for name, m in loaded.items()]
    return first


# ----------------------------------------------------------------------------------------------
# the seed's arc of arms (issue 9): cumulative, same seed and data; each is a set of recipe fields

# Each arm is the previous one plus the seed's next step, so the arc stays cumulative by construction.
# Steps 1-2: offload views + NO_SHARD fixes, the AdamW step on the host (pageable staging): first working run.
_WORKING = {"patches": ["offload_views", "no_shard"], "optimizer": "HostAdamW", "optimizer_offload": False,
            "host_pin_memory": False, "host_rank0_owner": False}
# Step 3: no old_log_prob pass. Its entropy metric now comes from the update forward; metric_entropy keeps
# it out of the backward (verl backpropagates 0 x entropy; that recompute ran out of the 47.4 GiB card).
_SKIP = {**_WORKING, "patches": [*_WORKING["patches"], "skip_old_logprob", "metric_entropy"]}
_PINNED = {**_SKIP, "host_pin_memory": True}  # Step 4: pinned, reused staging buffers
_RANK0 = {**_PINNED, "host_rank0_owner": True}  # Step 5: rank 0 owns the optimizer, broadcasts the fp32 master
ARMS: dict[str, dict[str, Any]] = {
    # Step 0: verl 0.9.1 as shipped; on a 48 GB card vLLM refuses to start (the offload freed nothing).
    "0-stock": {"patches": [], "optimizer": "AdamW", "optimizer_offload": True, "host_pin_memory": True,
                "host_rank0_owner": False, "expect_failure": True},
    "1-fixes-hostadamw": _WORKING,
    "2-skip-old-logprob": _SKIP,
    "3-pinned": _PINNED,
    "4-rank0-owner": _RANK0,
    # Step 6: the fp32 master stays on the host through the update, its bf16 copy cast once per step.
    "5-master-on-host-cast-once": {**_RANK0, "patches": [*_RANK0["patches"], "master_on_host", "cast_once"]},
}


def arm_values(name: str) -> dict[str, Any]:
    if name not in ARMS:
        raise P.ParamError(f"unknown arm {name!r}. Fix: choose from {list(ARMS)}")
    return dict(ARMS[name])


# ----------------------------------------------------------------------------------------------
# command line


def _recipe_from_cli(ns) -> GRPORecipe:
    from rlkit.results import load_profile, parse_overrides

    values = load_profile(NOTEBOOK, ns.profile)
    if getattr(ns, "arm", None):
        values.update(arm_values(ns.arm))
    values.update(parse_overrides(ns.param))
    values.pop("results_dir", None)
    return P.build(GRPORecipe, values, where=f"parameters of {NOTEBOOK}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="rlkit grpo", description="the Qwen3-4B GRPO recipe on verl 0.9.1")
    sub = parser.add_subparsers(dest="action", required=True)
    for name, help_ in (("render", "print the verl command and its overrides"),
                        ("launch", "prepare inputs, verify, launch verl, write outputs/<notebook>/<tag>/")):
        p = sub.add_parser(name, help=help_)
        p.add_argument("--profile", default="tiny", help=f"nbs/params/{NOTEBOOK}.<profile>.yaml or a YAML path")
        p.add_argument("-p", "--param", action="append", default=[], metavar="KEY=VALUE")
        p.add_argument("--arm", default=None, choices=list(ARMS), help="one of the seed's arms (its fields, "
                       "then -p overrides, go over the profile)")
        if name == "launch":
            p.add_argument("--tag", default=None, help="results folder name (default: the arm, else the profile)")
            p.add_argument("--out", default=None, help="results root (default: outputs/)")
    p = sub.add_parser("collect", help="metrics of a run folder whose launcher was stopped (a time limit), "
                       "into outputs/<notebook>/<tag>/")
    p.add_argument("run_dir")
    p.add_argument("--tag", required=True)
    p.add_argument("--note", required=True, help="why the launcher did not finish (kept in metrics.json)")
    p.add_argument("--out", default=None, help="results root (default: outputs/)")
    p = sub.add_parser("parse", help="per-step metrics of a verl console log, as JSON")
    p.add_argument("log")
    p = sub.add_parser("verify", help=argparse.SUPPRESS)
    p.add_argument("--overrides", required=True)
    p.add_argument("--result", required=True)
    ns = parser.parse_args(argv)

    if ns.action == "parse":
        steps = parse_console_metrics(Path(ns.log).read_text(errors="replace"))
        print(json.dumps({"steps": steps, "summary": summarize(steps)}, indent=1))
        return 0
    if ns.action == "collect":
        import shutil

        from rlkit.results import ResultsFolder

        metrics = collect(ns.run_dir, ns.note)
        folder = ResultsFolder.create(NOTEBOOK, ns.tag, root=ns.out)
        with folder.writing() as work_dir:
            for item in Path(ns.run_dir).iterdir():
                # the launcher's own error, if it wrote one, is kept under a name that does not mark the folder failed
                name = {"FAILED.txt": "launcher_error.txt"}.get(item.name, item.name)
                if item.name != "metrics.json":
                    (shutil.copytree if item.is_dir() else shutil.copy2)(item, work_dir / name)
            folder.write_metrics(metrics)
        print(f"results: {folder.path} ({outcome(metrics)})")
        return 0
    if ns.action == "verify":
        result = verify_in_verl(json.loads(Path(ns.overrides).read_text()))
        Path(ns.result).write_text(json.dumps(result, indent=1))
        return 0
    try:
        recipe = _recipe_from_cli(ns)
    except (P.ParamError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    if ns.action == "render":
        print(shell_command(recipe, render_overrides(recipe)))
        return 0
    from rlkit.results import ResultsFolder

    folder = ResultsFolder.create(NOTEBOOK, ns.tag or ns.arm or Path(ns.profile).stem.split(".")[-1], root=ns.out)
    with folder.writing() as work_dir:
        folder.write_params(P.as_dict(recipe))
        folder.write_env()
        folder.write_metrics(run(recipe, out_dir=work_dir))
    print(f"results: {folder.path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
