"""A GRPO recipe rendered to verl: the exact Hydra overrides for ``python -m verl.trainer.main_ppo`` (verl 0.9.1).

:func:`render_overrides` turns a :class:`rlkit.recipes.grpo.GRPORecipe` (an arm of :data:`rlkit.recipes.grpo.ARMS`)
into one list that reads, in order, as the verl command line: algorithm and data, the model, the actor, the vLLM
rollout, reward and trainer, then the on-policy skip's own overrides and the recipe's ``extra_overrides``.
"""
from __future__ import annotations

import os
from pathlib import Path

from rlkit.recipes.check import compose_verl_config
from rlkit.recipes.grpo import NOTEBOOK, GRPORecipe, Paths, default_paths

ARR = "actor_rollout_ref"
# verl's fused-kernel log-prob path on its torch backend: logits=chunked renders it (the path the chunked_logprobs
# patch takes over, its docstring says why); the phase-budget explorer renders it for verl's own fused kernels
FUSED_KERNEL_OVERRIDES = ("actor_rollout_ref.model.use_fused_kernels=True",
                          "actor_rollout_ref.model.fused_kernel_options.impl_backend=torch")


def _b(value: bool) -> str:
    return "True" if value else "False"


def render_overrides(recipe: GRPORecipe, paths: Paths | None = None, out_dir: str | os.PathLike | None = None) -> list[str]:
    """The exact Hydra overrides for ``python -m verl.trainer.main_ppo`` (verl 0.9.1)."""
    paths = paths or default_paths(recipe)
    out = [*_data_and_model(recipe, paths), *_actor(recipe), *_rollout_and_trainer(recipe, out_dir)]
    out += _onpolicy_overrides(recipe, out)
    out += list(recipe.extra_overrides)
    return out


def _data_and_model(recipe: GRPORecipe, paths: Paths) -> list[str]:
    """GRPO without a KL reward, the data verl reads, and the model it loads."""
    return [
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
        f"{ARR}.model.path={paths.model}",
        f"{ARR}.model.use_remove_padding={_b(recipe.use_remove_padding)}",
        f"{ARR}.model.enable_gradient_checkpointing={_b(recipe.gradient_checkpointing)}",
        *(FUSED_KERNEL_OVERRIDES if recipe.logits == "chunked" else []),  # the path chunked_logprobs takes over
        f"+{ARR}.model.override_config.attn_implementation={recipe.attn_implementation}",
    ]


def _actor(recipe: GRPORecipe) -> list[str]:
    """The FSDP actor: its mini- and micro-batches, loss, optimizer (torch's AdamW or rlkit's HostAdamW) and offload."""
    optimizer_impl = "rlkit.optim" if recipe.optimizer == "HostAdamW" else "torch.optim"
    out = [
        f"{ARR}.actor.strategy=fsdp",
        f"{ARR}.actor.ppo_mini_batch_size={recipe.ppo_mini_batch_size}",
        f"{ARR}.actor.ppo_epochs={recipe.ppo_epochs}",
        f"{ARR}.actor.use_dynamic_bsz={_b(recipe.use_dynamic_bsz)}",
        f"{ARR}.actor.ppo_max_token_len_per_gpu={recipe.ppo_max_token_len_per_gpu}",
    ]
    if not recipe.use_dynamic_bsz:
        out += [
            f"{ARR}.actor.ppo_micro_batch_size_per_gpu={recipe.micro_batch_size_per_gpu}",
            f"{ARR}.rollout.log_prob_micro_batch_size_per_gpu={recipe.micro_batch_size_per_gpu}",
        ]
    out += [
        f"{ARR}.actor.use_kl_loss=False",
        f"{ARR}.actor.entropy_coeff=0",
        f"{ARR}.actor.optim.lr={recipe.lr}",
        f"{ARR}.actor.optim.optimizer_impl={optimizer_impl}",
        f"{ARR}.actor.optim.optimizer={recipe.optimizer}",
        *([f"{ARR}.actor.optim.override_optimizer_config={{pin_memory:{_b(recipe.host_pin_memory).lower()},"
           f"rank0_owner:{_b(recipe.host_rank0_owner).lower()},"
           f"overlap_copies:{_b(recipe.host_overlap_copies).lower()},"
           f"prefetch_grads:{_b(recipe.host_prefetch_grads).lower()}}}"] if recipe.optimizer == "HostAdamW" else []),
        f"{ARR}.actor.fsdp_config.fsdp_size={recipe.fsdp_size}",
        f"{ARR}.actor.fsdp_config.param_offload={_b(recipe.param_offload)}",
        f"{ARR}.actor.fsdp_config.optimizer_offload={_b(recipe.optimizer_offload)}",
    ]
    return out


def _rollout_and_trainer(recipe: GRPORecipe, out_dir: str | os.PathLike | None) -> list[str]:
    """The colocated vLLM rollout, the reward, the trainer's steps and logging, Ray and verl's helper pools."""
    from rlkit.models import reward

    return [
        f"{ARR}.rollout.name=vllm",
        f"{ARR}.rollout.n={recipe.rollout_n}",
        f"{ARR}.rollout.tensor_model_parallel_size={recipe.rollout_tp}",
        f"{ARR}.rollout.gpu_memory_utilization={recipe.gpu_memory_utilization}",
        f"{ARR}.rollout.free_cache_engine={_b(recipe.free_cache_engine)}",
        f"{ARR}.rollout.enforce_eager={_b(recipe.enforce_eager)}",
        f"{ARR}.rollout.agent.num_workers={recipe.helper_workers}",
        f"reward.num_workers={recipe.helper_workers}",
        *reward.verl_overrides(recipe.resolved_reward),
        f"trainer.n_gpus_per_node={recipe.n_gpus}",
        "trainer.nnodes=1",
        f"trainer.total_training_steps={recipe.steps}",
        "trainer.logger=[console,file]",  # file: one JSON record per step (rlkit.verl.logs.read_steps)
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


def _onpolicy_overrides(recipe: GRPORecipe, overrides: list[str]) -> list[str]:
    """Extra overrides of the on-policy old-log-prob skip when that patch is chosen.

    ``rlkit.patches.verl.onpolicy.onpolicy_overrides`` reads the composed verl config; it returns ``[]`` (and
    prints why) when the run is not strictly on-policy, so verl then runs the pass unchanged.
    """
    if "skip_old_logprob" not in recipe.patches:
        return []
    from rlkit.patches.verl import onpolicy

    return list(onpolicy.onpolicy_overrides(compose_verl_config(overrides)))
