"""One colour per phase and per memory component, for every figure and explorer (no imports: any layer may use it).

Phases: verl's step phases (``rlkit.verl.logs.PHASES``, ``other`` for the rest of the step), the device
timeline's ``idle`` and ``init``, and the planner's phases (``rlkit.planning.budget.PHASES``), each of which takes the
colour of the verl phase it models, so a phase keeps its colour from the planner's bars to the measured timeline.
Components: the planner's device and host components (``rlkit.planning.budget.DEVICE_COMPONENTS``,
``HOST_COMPONENTS``), every one its own colour.
"""
from __future__ import annotations

PHASE_COLOURS = {
    "gen": "#636efa", "reward": "#fecb52", "old_log_prob": "#ef553b", "ref": "#ab63fa", "adv": "#19d3f3",
    "update_actor": "#00cc96", "update_weights": "#ffa15a", "other": "#bbbbbb", "idle": "#e5e5e5", "init": "#8c8c8c",
    "optimizer_step": "#ff6692",
}
# the planner's phase -> the verl phase it models (optimizer_step is inside verl's update_actor: its own colour)
PLANNER_PHASE = {"rollout": "gen", "log_prob": "old_log_prob", "update_fwd_bwd": "update_actor",
                 "weight_sync": "update_weights"}

COMPONENT_COLOURS = {
    "vllm_weights_bf16": "#1f77b4", "kv_pool": "#17becf", "cuda_graphs": "#9edae5", "non_torch": "#7f7f7f",
    "vllm_asleep_rest": "#aec7e8", "actor_non_torch": "#c7c7c7", "master_fp32": "#d62728", "stale_offload_copy": "#ff9896",
    "compute_copy_bf16": "#ff7f0e", "grads_fp32": "#2ca02c", "adam_moments": "#9467bd", "activations": "#bcbd22",
    "logits": "#e377c2", "staging": "#8c564b", "staging_pinned": "#c49c94",
}
UNKNOWN = "#444444"  # a name this table does not know (a newer verl phase): dark, and never another's colour


def phase_colour(phase: str) -> str:
    """The colour of a verl, timeline or planner phase."""
    return PHASE_COLOURS.get(PLANNER_PHASE.get(phase, phase), UNKNOWN)


def component_colour(component: str) -> str:
    """The colour of a planner memory component."""
    return COMPONENT_COLOURS.get(component, UNKNOWN)
