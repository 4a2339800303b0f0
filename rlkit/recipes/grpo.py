"""The GRPO recipe: Qwen3-4B on DAPO-Math-17k with verl 0.9.1 and a colocated vLLM rollout, and the seed's arms.

:class:`GRPORecipe` is a frozen dataclass, the fields of notebook 05's parameters cell; :mod:`rlkit.recipes.overrides`
renders it to the exact Hydra overrides for ``python -m verl.trainer.main_ppo``. Defaults are the mission's run
(seed 000, Setup and Step -1): batch 32 prompts x group 8, fully on-policy (one PPO mini-batch of
all 256 sequences, ppo_epochs 1), FSDP1 with fsdp_size=1 on 2 GPUs, param (+ optimizer) offload, vLLM
sleep mode (``free_cache_engine``), gpu_memory_utilization 0.85, rlkit patches switchable one by
one, console and file logging. The node-needed knobs found on the offline H200 node (notes/gpu-node.md: sdpa
attention, no remove-padding, Ray CPU count, small helper pools) are fields with those defaults.
``response_length_mean`` > 0 gives a random-init model the synthetic length model of :mod:`rlkit.models.lengths`
(responses end on EOS after a geometric number of tokens of that mean); 0 is the plain random model, which
never ends a response, so every one is max_response_length long.

:data:`ARMS` are the seed's cumulative steps as recipe fields; :func:`prepare_inputs` writes the data and
the random-init model a recipe names. Launching is :mod:`rlkit.recipes.job`'s; the experiment that runs the
arms is :mod:`rlkit.experiments.grpo`.
"""
from __future__ import annotations

import json
import subprocess
import sys
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Literal, NamedTuple

from rlkit.core import params as P

NOTEBOOK = "05_grpo_qwen3_4b"
VERL_REPLAY_POLL_S = 2.0  # verl 0.9.1's replay-buffer poll (rlkit.patches.verl.replay_poll); any other value adds that patch


class Lever(NamedTuple):
    """A recipe field that switches a patch on (the field is the switch, so arms that replace ``patches`` keep it)."""

    field: str
    patch: str
    is_on: Callable[[Any], bool]
    setting: str  # what to set the field to, for an error's fix


LEVERS = (Lever("attn_implementation", "varlen_attention", lambda v: v == "rlkit_varlen", "rlkit_varlen"),
          Lever("logits", "chunked_logprobs", lambda v: v == "chunked", "chunked"),
          Lever("replay_poll_s", "replay_poll", lambda v: v != VERL_REPLAY_POLL_S,
                f"e.g. 0.2 (any value but verl's {VERL_REPLAY_POLL_S:g} s)"),
          Lever("rmsnorm", "compiled_rmsnorm", lambda v: v == "compiled", "compiled"),
          Lever("pointwise", "compiled_pointwise", lambda v: v == "compiled", "compiled"),
          Lever("activation_checkpointing", "selective_checkpoint", lambda v: v == "selective", "selective"),
          Lever("host_prefetch_grads", "grad_prefetch", bool, "true"))


def _bad(key: str, why: str, fix: str) -> None:
    raise P.ParamError(f"GRPORecipe.{key}: {why}. Fix: {fix}")


@dataclass(frozen=True)
class GRPORecipe:
    """One GRPO run; every field is a parameter of notebook 05 (nbs/params/05_grpo_qwen3_4b.*.yaml)."""

    model: str = "qwen3-4b"            # rlkit.models.qwen preset (random-init, written offline) or a hub id / local dir
    model_seed: int = 0                # seed of the random-init weights and of the synthetic data
    response_length_mean: int = 0      # random-init only: synthetic EOS model, geometric lengths of this mean (0: off)
    data: str = "synthetic"            # "synthetic", a local DAPO-Math-17k parquet, or its hub id
    data_rows: int = 2048              # synthetic rows / cap on unique real rows (0 = all)
    reward: Literal["auto", "synthetic_hash", "dapo_math", "target_chars"] = "auto"  # auto: hash reward for random weights
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
    host_overlap_copies: bool = False  # HostAdamW: its copies on a side CUDA stream beside the host step (bit-identical)
    host_prefetch_grads: bool = False  # HostAdamW: each final gradient to the host during the last backward, clipped
                                       # there (bit-identical; adds the grad_prefetch patch; pinned host copy of every grad)
    gpu_memory_utilization: float = 0.85
    free_cache_engine: bool = True     # vLLM sleep mode between rollouts
    rollout_tp: int = 1
    enforce_eager: bool = False        # true: no CUDA graphs in vLLM
    patches: tuple[str, ...] = ()      # rlkit patches, applied in every verl process by the plugin (the arms set these)
    steps: int = 4
    attn_implementation: str = "sdpa"  # the node has no flash-attn; "rlkit_varlen": PyTorch's varlen kernel (a patch)
    use_remove_padding: bool = False   # pack each micro-batch without padding (needs a varlen attention)
    logits: Literal["full", "chunked"] = "full"  # chunked: log-probs from hidden states in row chunks (a patch)
    replay_poll_s: float = 2.0         # verl's replay-buffer poll for finished rollouts (2.0: verl's; else a patch)
    rmsnorm: Literal["eager", "compiled"] = "eager"  # compiled: Qwen3's RMSNorm through torch.compile (a patch)
    pointwise: Literal["eager", "compiled"] = "eager"  # compiled: rotary + SwiGLU through torch.compile (a patch)
    gradient_checkpointing: bool = True
    # selective: the first selective_layers layers keep their matmul and attention outputs, recomputing only the
    # elementwise ops (the selective_checkpoint patch); 0 = as many as pre-flight's planner says fit
    activation_checkpointing: Literal["full", "selective"] = "full"
    selective_layers: int = 0
    ray_num_cpus: int = 64             # verl's default actor CPU reservations hang on small hosts
    helper_workers: int = 2            # agent-loop workers, reward workers, transfer-queue storage units
    extra_overrides: tuple[str, ...] = ()  # further verl Hydra overrides, appended last
    planner_gpu_gib: float = 47.4      # device memory the planner checks against (A6000: 47.4, H200: 139.8)
    emulate_gpu_gib: float = 0.0       # >0: every verl process sees a card of this size (rlkit.patches.instruments.emulate_card); 0: off
    check_rank_identity: bool = True   # after each optimizer step, record max |weights - rank 0's| (n_gpus > 1)
    record_old_log_prob_memory: bool = True  # torch's peak allocated/reserved of the actor's old_log_prob pass, per step
    launch: Literal["auto", "always", "never"] = "auto"  # auto: launch verl when n_gpus CUDA GPUs exist
    expect_failure: bool = False       # the stock arm: a memory failure of verl is the recorded result
    verify_before_launch: bool = True  # false: skip the separate verl config check (~25 s) when launching
    host_memory_guard: bool = True     # refuse to launch when pre-flight finds HostAdamW's host state exceeds this host's
    timeout_s: int = 3600

    def __post_init__(self) -> None:
        self._check_sizes()
        self._check_patches()
        self._check_host_and_card()
        self._check_workload()

    def _check_sizes(self) -> None:
        """Counts are positive and the batch splits over mini-batches, GPUs, FSDP groups and vLLM's TP."""
        for key in ("train_batch_size", "rollout_n", "ppo_mini_batch_size", "ppo_epochs", "steps", "n_gpus",
                    "max_prompt_length", "max_response_length", "rollout_tp", "helper_workers", "timeout_s"):
            if getattr(self, key) < 1:
                _bad(key, f"{getattr(self, key)} is not positive", "use a value >= 1")
        if self.train_batch_size % self.ppo_mini_batch_size:
            _bad("ppo_mini_batch_size", f"{self.ppo_mini_batch_size} does not divide train_batch_size "
                f"{self.train_batch_size}", "use a divisor (equal to it for a fully on-policy run)")
        if (self.train_batch_size * self.rollout_n) % self.n_gpus:
            _bad("n_gpus", f"{self.train_batch_size}x{self.rollout_n} sequences do not split over {self.n_gpus} GPUs",
                "choose n_gpus dividing train_batch_size * rollout_n")
        if not 0.0 < self.gpu_memory_utilization <= 1.0:
            _bad("gpu_memory_utilization", f"{self.gpu_memory_utilization} is outside (0, 1]", "e.g. 0.85")
        if self.fsdp_size != -1 and (self.fsdp_size < 1 or self.n_gpus % self.fsdp_size):
            _bad("fsdp_size", f"{self.fsdp_size} must be -1 or divide n_gpus={self.n_gpus}", "use 1 (no sharding)")
        if self.n_gpus % self.rollout_tp:
            _bad("rollout_tp", f"{self.rollout_tp} does not divide n_gpus={self.n_gpus}", "use 1")

    def _check_patches(self) -> None:
        """Known patches, each once, none standing for a lever's field; checkpointing and polling settings."""
        from rlkit.patches import KNOWN_PATCHES

        unknown = [p for p in self.patches if p not in KNOWN_PATCHES]
        if unknown:
            _bad("patches", f"unknown {unknown}", f"choose from {list(KNOWN_PATCHES)}")
        if len(set(self.patches)) != len(self.patches):
            _bad("patches", f"{list(self.patches)} repeats a name", "list each patch once")
        for lever in LEVERS:
            if lever.patch in self.patches and not lever.is_on(getattr(self, lever.field)):
                _bad("patches", f"{lever.patch} is the {lever.field} lever, but {lever.field} is "
                    f"{getattr(self, lever.field)!r}", f"set {lever.field}: {lever.setting} (it adds the patch) and "
                    f"drop {lever.patch} from patches")
        if self.activation_checkpointing == "selective" and not self.gradient_checkpointing:
            _bad("activation_checkpointing", "selective is a mode of gradient checkpointing, which is off",
                "set gradient_checkpointing: true, or activation_checkpointing: full")
        if self.selective_layers < 0 or (self.selective_layers and self.activation_checkpointing != "selective"):
            _bad("selective_layers", f"{self.selective_layers} needs activation_checkpointing: selective and >= 0",
                "0 (pre-flight picks the most that fit) or a number of layers, with activation_checkpointing: selective")
        if not 0.0 < self.replay_poll_s <= 60.0:
            _bad("replay_poll_s", f"{self.replay_poll_s!r} is not in (0, 60] seconds", "2.0 (verl's) or e.g. 0.2")
        if "master_on_host" in self.patches and (self.optimizer != "HostAdamW" or not self.param_offload):
            _bad("patches", "master_on_host keeps the fp32 master on the host through the update: it needs param_offload "
                "(the masters it adopts) and HostAdamW (which steps them in place there)",
                "set optimizer: HostAdamW, optimizer_offload: false and param_offload: true, or drop master_on_host")

    def _pinned_copy_rules(self, option: str, pinned_why: str) -> list[tuple[str, bool, str, str]]:
        """(key, wrong, why, fix) of a HostAdamW option whose copies overlap through pinned host memory."""
        return [("optimizer", self.optimizer != "HostAdamW", f"{option} is a HostAdamW option",
                 f"set optimizer: HostAdamW or {option}: false"),
                ("host_pin_memory", not self.host_pin_memory, pinned_why, f"set host_pin_memory: true or {option}: false")]

    def _check_host_and_card(self) -> None:
        """HostAdamW's options fit together; the emulated card and the planner's card are sizes."""
        if self.optimizer != "HostAdamW" and self.host_rank0_owner:
            _bad("host_rank0_owner", "is a HostAdamW option but optimizer is AdamW", "set optimizer: HostAdamW or "
                "host_rank0_owner: false")
        rules = []
        if self.host_overlap_copies:
            rules += [*self._pinned_copy_rules("host_overlap_copies", "the overlapped copies need pinned staging "
                                               "(a pageable copy is synchronous)"),
                      ("host_rank0_owner", self.host_rank0_owner, "with a rank-0 owner each parameter's broadcast "
                       "follows its step, so the copies would not overlap", "set host_rank0_owner: false (on one GPU "
                       "the owner has no one to broadcast to) or host_overlap_copies: false")]
        if self.host_prefetch_grads:
            rules += self._pinned_copy_rules("host_prefetch_grads", "the prefetched copies need pinned host buffers "
                                             "(a copy to pageable memory is synchronous, so it would stall the backward, "
                                             "not overlap it)")
        for key, wrong, why, fix in rules:
            if wrong:
                _bad(key, why, fix)
        if self.emulate_gpu_gib < 0:
            _bad("emulate_gpu_gib", f"{self.emulate_gpu_gib} is negative", "0 (off) or a card size in GiB, e.g. 47.4")
        if self.optimizer == "HostAdamW" and self.optimizer_offload:
            _bad("optimizer_offload", "HostAdamW keeps its state on the host; verl's optimizer offload would "
                "ship it to the GPU every update", "set optimizer_offload: false")
        if not self.planner_gpu_gib > 0:
            _bad("planner_gpu_gib", f"{self.planner_gpu_gib} is not positive", "the GPU's memory in GiB, e.g. 47.4")

    def _check_workload(self) -> None:
        """The synthetic length model and the data rows."""
        if isinstance(self.response_length_mean, bool) or not isinstance(self.response_length_mean, int) \
                or self.response_length_mean < 0 or self.response_length_mean == 1:
            _bad("response_length_mean", f"{self.response_length_mean!r} is not 0 or an integer >= 2",
                "0 (every response runs to max_response_length) or the mean response tokens, e.g. 256")
        if self.response_length_mean and not self.random_init:
            _bad("response_length_mean", f"{self.response_length_mean} is the synthetic length model of a random-init "
                f"preset, but model={self.model!r} is a real model (its lengths are its own)", "set it to 0")
        if self.data_rows < 0:
            _bad("data_rows", f"{self.data_rows} is negative", "use 0 (all rows) or a positive cap")
        if self.data == "synthetic" and self.data_rows < self.train_batch_size:
            _bad("data_rows", f"{self.data_rows} synthetic rows < train_batch_size {self.train_batch_size}",
                "generate at least one batch of rows")

    @property
    def active_patches(self) -> tuple[str, ...]:
        """Every patch the plugin applies: the arm's ``patches``, then those the workload levers imply
        (``attn_implementation: rlkit_varlen`` -> varlen_attention, ``logits: chunked`` -> chunked_logprobs,
        ``replay_poll_s`` other than verl's 2 s -> replay_poll, ``rmsnorm: compiled`` -> compiled_rmsnorm,
        ``pointwise: compiled`` -> compiled_pointwise, ``host_prefetch_grads: true`` -> grad_prefetch).
        Arms replace ``patches`` wholesale; the levers are fields of their own, so a profile's workload
        keeps its kernels under every arm."""
        implied = [lever.patch for lever in LEVERS if lever.is_on(getattr(self, lever.field))]
        return tuple(dict.fromkeys([*self.patches, *implied]))

    @property
    def random_init(self) -> bool:
        from rlkit.models.qwen import PRESETS

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
    from rlkit.models import data
    from rlkit.models import offline as offline_model

    model = (str(offline_model.default_dir(recipe.model, recipe.model_seed, recipe.response_length_mean))
             if recipe.random_init else recipe.model)
    train = data.default_path(recipe.data, recipe.data_rows, recipe.model_seed, targets=_target_task(recipe))
    return Paths(model=model, train_file=str(train))


def _target_task(recipe: GRPORecipe) -> bool:
    """Whether the run's rows are the target-character task's (``reward: target_chars``, rlkit.models.data.target_rows)."""
    return recipe.resolved_reward == "target_chars"


def prepare_inputs(recipe: GRPORecipe) -> tuple[Paths, dict, dict]:
    """Write the data parquet and (for presets) the random-init model; returns paths and their info."""
    from rlkit.models import data
    from rlkit.models import offline as offline_model

    paths = default_paths(recipe)
    data_info = data.prepare(recipe.data, rows=recipe.data_rows, seed=recipe.model_seed,
                             out_dir=Path(paths.train_file).parent, targets=_target_task(recipe)).as_dict()
    if recipe.random_init:
        model_info = offline_model.write_offline_model(recipe.model, paths.model, seed=recipe.model_seed,
                                                       response_length_mean=recipe.response_length_mean)
    else:
        model_info = {"path": recipe.model, "preset": None}
    return Paths(model=model_info["path"], train_file=data_info["path"]), data_info, model_info


_PREPARE_CHILD = """
import json, sys
from rlkit.core import params
from rlkit.recipes import grpo as R
recipe = params.build(R.GRPORecipe, json.loads(sys.argv[1]))
paths, data_info, model_info = R.prepare_inputs(recipe)
print(json.dumps([paths.model, paths.train_file, data_info, model_info], default=str))
"""


def prepare_inputs_isolated(recipe):
    """:func:`prepare_inputs` in a child process: building a random-init model uses the GPU when
    there is one, and this process (the sampler's, for the whole job) must hold no CUDA memory."""
    done = subprocess.run([sys.executable, "-c", _PREPARE_CHILD, json.dumps(P.as_dict(recipe))], check=False,
                          capture_output=True, text=True, timeout=1800)
    if done.returncode != 0:
        raise RuntimeError(f"preparing the inputs failed (exit {done.returncode}):\n{done.stderr[-3000:]}")
    model, train_file, data_info, model_info = json.loads(done.stdout.strip().splitlines()[-1])
    return Paths(model=model, train_file=train_file), data_info, model_info


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


def arm_name(recipe: dict[str, Any]) -> str:
    """A run's arm label from what the arms vary: patches and optimizer."""
    parts = list(recipe.get("patches", [])) + (["HostAdamW"] if recipe.get("optimizer") == "HostAdamW" else [])
    return "+".join(parts) or "stock"


@contextmanager
def local_model_overrides(recipe: GRPORecipe, overrides: list[str]):
    """``overrides`` with a random-init model's directory (written on the node, absent here) stood in for by a
    folder holding its preset's config.json and the length model's mean (what the planner reads); yields
    (overrides, that folder)."""
    import tempfile

    model_path = next((o.split("=", 1)[1] for o in overrides if o.startswith("actor_rollout_ref.model.path=")), "")
    if not recipe.random_init or (Path(model_path) / "config.json").exists():
        yield overrides, None
        return
    from rlkit.models import offline as offline_model
    from rlkit.models import qwen as models

    with tempfile.TemporaryDirectory() as tmp:
        models.preset_config(recipe.model).to_json_file(str(Path(tmp) / "config.json"))
        (Path(tmp) / offline_model.MARKER).write_text(json.dumps({"response_length_mean": recipe.response_length_mean}))
        yield [f"actor_rollout_ref.model.path={tmp}" if o.startswith("actor_rollout_ref.model.path=") else o
               for o in overrides], tmp
