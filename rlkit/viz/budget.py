"""Notebook 00's explorer: the phase-budget planner under sliders, redrawn in place.

State -> everything drawn, as plain functions (no widgets):

* :func:`spec_from_state`: the planner's :class:`rlkit.planning.budget.PlanSpec` for the chosen settings;
* :func:`recipe_from_state`: the same settings as a :class:`rlkit.recipes.grpo.GRPORecipe` (what ``rlkit grpo``
  launches), :func:`overrides_for_state` its verl overrides and :func:`preflight_for_state` rlkit's pre-flight
  findings on them (:func:`rlkit.planning.preflight.check_overrides`);
* :func:`export_lines` / :func:`export_command`: the settings as ``rlkit grpo render -p key=value`` input;
* :func:`draw`: the View (per-phase stacked bars and the KV pool's concurrency, the verdict, the KV text, the
  pre-flight findings, the export).

:func:`budget_explorer` wires them to ipywidgets (:class:`rlkit.viz.explorer.Explorer`).

How planner settings map to the recipe: ``gpu_gib`` is the card the planner checks and the run sees
(``planner_gpu_gib``, ``emulate_gpu_gib``); ``group_size`` is ``rollout_n``; one mini-batch of the whole
batch (fully on-policy); token-budget micro-batches of ``micro_batch_tokens`` (``ppo_max_token_len_per_gpu``);
``offload_views`` is the ``offload_views`` + ``no_shard`` patches (the arms' pair), ``cpu_optimizer_step`` is
``optimizer=HostAdamW`` (which needs ``optimizer_offload=false``), ``rank0_owner`` is ``host_rank0_owner``,
``skip_old_logprob`` is that patch plus ``metric_entropy`` (the entropy the skip computes in the update stays
out of backward: the planner's ``update_entropy="detached"``), ``master_on_host`` and ``cast_once`` are the
patches of those names. ``logits_path`` maps where the recipe can choose it (:data:`LOGITS_RECIPE`):
``chunked_logprobs`` is ``logits=chunked``, ``verl_fused`` is verl's own fused kernels (torch backend) as an extra
override, ``torch_rowwise`` is verl's unfused path as installed without flash-attn (``logits=full``). The other two
(``torch_fp32``, ``flash_ce``: how an installation computes the unfused path) are a planner assumption only; the
pre-flight, reading the overrides, then names verl's unfused path.
"""
from __future__ import annotations

import functools
from dataclasses import fields, replace
from typing import Any

from rlkit.core.colours import component_colour
from rlkit.core.params import ParamError
from rlkit.planning import budget, verdict
from rlkit.recipes.overrides import FUSED_KERNEL_OVERRIDES
from rlkit.viz.explorer import Explorer, View, esc, html_table, message_figure

# planner fields the controls set (the rest of the PlanSpec comes from the notebook's parameters)
SETTINGS = ("model", "gpu_gib", "n_gpus", "gpu_memory_utilization", "max_prompt_length", "max_response_length",
            "train_batch_size", "group_size", "micro_batch_tokens", "lora_rank", "gradient_checkpointing",
            "param_offload", "optimizer_offload", "logits_path")
GRPO_PROFILE = "h200"  # the profile `rlkit grpo render/launch` starts from in the export
# logits_path -> (recipe field logits, extra verl overrides); a path not here is not the recipe's to choose
LOGITS_RECIPE = {"chunked_logprobs": ("chunked", []), "verl_fused": ("full", list(FUSED_KERNEL_OVERRIDES)),
                 "torch_rowwise": ("full", [])}

def state_from_spec(spec: budget.PlanSpec) -> dict[str, Any]:
    """The explorer's state for a planner spec (its settings and its rlkit options)."""
    from rlkit.models.shape import preset_name

    state = {k: getattr(spec, k) for k in SETTINGS}
    state["model"] = preset_name(spec.model) or spec.model
    state.update({o: bool(getattr(spec, o)) for o in budget.RLKIT_OPTIONS})
    return state


def spec_from_state(state: dict[str, Any], base: budget.PlanSpec | None = None) -> budget.PlanSpec:
    """The planner's inputs for ``state`` over ``base`` (the notebook's parameters); raises ParamError."""
    base = base or budget.PlanSpec()
    known = {f.name for f in fields(budget.PlanSpec)}
    values = {k: state[k] for k in SETTINGS if k in state and k in known}
    values["log_prob_micro_batch_tokens"] = values.get("micro_batch_tokens", base.micro_batch_tokens)
    # the exported recipe adds metric_entropy with the skip: the update's entropy stays out of backward
    values["update_entropy"] = "detached" if state.get("skip_old_logprob") else "none"
    if state.get("cpu_optimizer_step"):  # HostAdamW keeps Adam on the host: the recipe turns verl's offload off
        values["optimizer_offload"] = False
    spec = replace(base, **{**values, **{o: False for o in budget.RLKIT_OPTIONS}})
    return budget.with_options(spec, [o for o in budget.RLKIT_OPTIONS if state.get(o)])


def recipe_values(state: dict[str, Any], base: budget.PlanSpec | None = None) -> dict[str, Any]:
    """The :class:`rlkit.recipes.grpo.GRPORecipe` fields that carry ``state`` (see the module docstring)."""
    base = base or budget.PlanSpec()
    patches = []
    if state.get("offload_views"):
        patches += ["offload_views", "no_shard"]
    if state.get("skip_old_logprob"):
        patches += ["skip_old_logprob", "metric_entropy"]
    patches += [p for p in ("master_on_host", "cast_once") if state.get(p)]
    host_step = bool(state.get("cpu_optimizer_step"))
    lora = int(state.get("lora_rank") or 0)
    logits, logits_overrides = LOGITS_RECIPE.get(state.get("logits_path"), ("full", []))
    return {
        "model": state["model"],
        "n_gpus": int(state["n_gpus"]),
        "planner_gpu_gib": float(state["gpu_gib"]),
        "emulate_gpu_gib": float(state["gpu_gib"]),
        "gpu_memory_utilization": float(state["gpu_memory_utilization"]),
        "max_prompt_length": int(state["max_prompt_length"]),
        "max_response_length": int(state["max_response_length"]),
        "train_batch_size": int(state["train_batch_size"]),
        "rollout_n": int(state["group_size"]),
        "ppo_mini_batch_size": int(state["train_batch_size"]),
        "use_dynamic_bsz": True,
        "ppo_max_token_len_per_gpu": int(state["micro_batch_tokens"]),
        "gradient_checkpointing": bool(state["gradient_checkpointing"]),
        "param_offload": bool(state["param_offload"]),
        "optimizer_offload": False if host_step else bool(state["optimizer_offload"]),
        "optimizer": "HostAdamW" if host_step else "AdamW",
        "host_rank0_owner": bool(state.get("rank0_owner")),
        "patches": patches,
        "logits": logits,
        "enforce_eager": base.cudagraph_gib == 0,
        "extra_overrides": logits_overrides + ([f"actor_rollout_ref.model.lora_rank={lora}"] if lora else []),
    }


def recipe_from_state(state: dict[str, Any], base: budget.PlanSpec | None = None):
    """``state`` as a GRPORecipe (the h200 profile's other fields); raises ParamError when the recipe refuses it."""
    from rlkit.core import params as P
    from rlkit.core.results import load_profile
    from rlkit.recipes.grpo import NOTEBOOK, GRPORecipe

    values = load_profile(NOTEBOOK, GRPO_PROFILE)
    values.pop("results_dir", None)
    values.update(recipe_values(state, base))
    return P.build(GRPORecipe, values, where="the phase-budget explorer")


@functools.lru_cache(maxsize=64)
def _rendered(recipe) -> tuple[str, ...]:
    from rlkit.recipes.overrides import render_overrides

    return tuple(render_overrides(recipe))  # the skip's on-policy overrides compose verl's config: seconds


def overrides_for_state(state: dict[str, Any], base: budget.PlanSpec | None = None) -> list[str]:
    """The verl overrides ``rlkit grpo render`` prints for ``state``, with the model path set to the preset's
    name (the random-init model folder need not exist here; the planner reads the preset's shapes)."""
    recipe = recipe_from_state(state, base)
    key = "actor_rollout_ref.model.path="
    return [f"{key}{recipe.model}" if o.startswith(key) else o for o in _rendered(recipe)]


def preflight_for_state(state: dict[str, Any], base: budget.PlanSpec | None = None) -> list[dict[str, Any]]:
    """rlkit's pre-flight findings on ``state``'s verl overrides (errors first), as dicts."""
    from rlkit.planning import preflight

    recipe = recipe_from_state(state, base)
    found = preflight.check_overrides(overrides_for_state(state, base), list(recipe.active_patches),
                                      gpu_gib=float(state["gpu_gib"]))
    return [f.as_dict() for f in found]


def _yaml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(str(v) for v in value) + "]"
    return str(value)


def export_lines(state: dict[str, Any], base: budget.PlanSpec | None = None) -> list[str]:
    """``state`` as ``-p key=value`` lines for ``rlkit grpo render|launch --profile h200``."""
    return [f"-p {k}={_yaml_value(v)}" for k, v in recipe_values(state, base).items()]


def export_command(state: dict[str, Any], base: budget.PlanSpec | None = None, action: str = "render") -> str:
    """The shell command for ``state``: ``rlkit grpo render --profile h200 -p ...`` (one ``-p`` per line)."""
    lines = [f"rlkit grpo {action} --profile {GRPO_PROFILE}"] + [f"  {line}" for line in export_lines(state, base)]
    return " \\\n".join(lines)


def bars_figure(p: verdict.Plan, spec: budget.PlanSpec):
    """Per-phase stacked device GiB per component (the card as a line) and the KV pool's concurrency."""
    from plotly.subplots import make_subplots

    fig = make_subplots(rows=1, cols=2, column_widths=[0.74, 0.26], horizontal_spacing=0.12,
                        subplot_titles=("device GiB per GPU, by phase", "KV pool: sequences per GPU"))
    phases = list(p.device_gib)
    for comp in budget.DEVICE_COMPONENTS:
        y = [p.device_gib[ph].get(comp, 0.0) for ph in phases]
        if any(y):
            fig.add_bar(name=comp, x=phases, y=y, marker_color=component_colour(comp), row=1, col=1,
                        hovertemplate=f"{comp}: %{{y:.2f}} GiB<extra>%{{x}}</extra>")
    fig.add_hline(y=spec.gpu_gib, line_dash="dash", annotation_text=f"card {spec.gpu_gib:g} GiB", row=1, col=1)
    fig.add_bar(name="concurrency", x=["KV pool holds", "needed per GPU"], y=[p.max_concurrent_seqs, p.seqs_per_gpu],
                marker_color=["#2ca02c" if p.max_concurrent_seqs >= p.seqs_per_gpu else "#d62728", "#7f7f7f"],
                showlegend=False, row=1, col=2, hovertemplate="%{x}: %{y}<extra></extra>")
    fig.update_layout(barmode="stack", height=480, legend_title="component",
                      title=f"{p.model}: {p.verdict} (peak {p.peak_phase} {p.peak_gib:.1f} of {spec.gpu_gib:g} GiB)")
    fig.update_yaxes(title_text="GiB per GPU", row=1, col=1)
    fig.update_yaxes(title_text="sequences", row=1, col=2)
    return fig


def verdict_html(p: verdict.Plan, spec: budget.PlanSpec) -> str:
    colour = "#1a7f37" if p.fits else "#cf222e"
    opts = ", ".join(spec.options) or "none"
    return (f"<div class='verdict'><span style='color:{colour};font-weight:bold'>{esc(p.verdict)}</span>: "
            f"{esc(p.reason)}<br><small>vLLM takes {spec.gpu_memory_utilization:g} x {spec.gpu_gib:g} = "
            f"{spec.gpu_memory_utilization * spec.gpu_gib:.2f} GiB; binding {esc(p.binding)}; rlkit options: {esc(opts)}; host per node "
            f"{p.host_node_peak_gib:.1f} GiB; bf16 casts per step {p.bf16_casts_per_step} "
            f"({p.micro_batches_per_step} micro-batches)</small></div>")


def kv_html(p: verdict.Plan) -> str:
    waves = (f"rollout runs in {p.rollout_waves} waves" if p.rollout_waves > 1 else
             "one wave" if p.rollout_waves == 1 else "no sequence fits")
    return (f"<div class='kv'>KV pool {p.kv_pool_gib:.2f} GiB, {p.kv_gib_per_seq * 1024:.1f} MiB per sequence "
            f"&rarr; <b>{p.max_concurrent_seqs}</b> concurrent sequences; {p.seqs_per_gpu} needed per GPU: {waves}</div>")


def logits_note(p: verdict.Plan, spec: budget.PlanSpec) -> str:
    """For a logits path no override chooses (:data:`LOGITS_RECIPE`): the pre-flight reads the overrides, so its
    planner plans verl's unfused path as installed without flash-attn (``torch_rowwise``), not the bars' path. Both
    plans' peaks, where the pre-flight's numbers are read ("" for a path the recipe carries)."""
    if spec.logits_path in LOGITS_RECIPE:
        return ""
    read = verdict.plan(replace(spec, logits_path="torch_rowwise"))
    return (f"<p class='logits-note'><b>Two logits paths:</b> the bars and the verdict plan logits path "
            f"{esc(spec.logits_path)} (peak {esc(p.peak_phase)} {p.peak_gib:.2f} GiB), which no override chooses. The "
            f"pre-flight reads the overrides, so its planner plans verl's unfused path as installed without flash-attn "
            f"(torch_rowwise: peak {esc(read.peak_phase)} {read.peak_gib:.2f} GiB, {esc(read.verdict)}): its numbers "
            f"below are that path's.</p>")


def preflight_html(findings: list[dict[str, Any]], note: str = "") -> str:
    """The findings' counts and errors in view, the full table folded (an HTML ``<details>``); ``note``
    (:func:`logits_note`) in view above the errors."""
    rows = [{"severity": f["severity"], "check": f.get("check"), "finding": f["message"], "fix": f["fix"]}
            for f in findings]
    counts = {s: sum(f["severity"] == s for f in findings) for s in ("error", "warning", "info")}
    errors = "".join(f"<li><b>{esc(f.get('check'))}</b>: {esc(f['message'])}</li>" for f in findings
                     if f["severity"] == "error")
    return (f"<div class='preflight'><b>Pre-flight</b> of the verl overrides these settings become (rlkit.planning.preflight): "
            f"{counts['error']} error(s), {counts['warning']} warning(s), {counts['info']} info.{note}"
            f"{f'<ul>{errors}</ul>' if errors else ''}"
            f"<details><summary>every finding, with its fix</summary>{html_table(rows)}</details></div>")


def export_html(state: dict[str, Any], base: budget.PlanSpec) -> str:
    return (f"<details class='export'><summary><b>These settings as a recipe</b>: <code>rlkit grpo render</code> "
            f"input</summary><p><code>rlkit.recipes.grpo.GRPORecipe</code> fields over the {GRPO_PROFILE} profile; swap "
            f"<code>render</code> for <code>launch</code> to run it.</p><pre>{esc(export_command(state, base))}</pre></details>")


def draw(state: dict[str, Any], base: budget.PlanSpec | None = None) -> View:
    """Everything the explorer shows for ``state``: figure ``bars``; texts ``verdict``, ``kv``, ``preflight``,
    ``export``. A state the planner or the recipe refuses is drawn as its error message."""
    base = base or budget.PlanSpec()
    try:
        spec = spec_from_state(state, base)
        p = verdict.plan(spec)
    except ParamError as err:
        text = f"<div class='verdict'><b style='color:#cf222e'>not a valid setting</b>: {esc(err)}</div>"
        return View(figures={"bars": message_figure(f"no plan: {err}"[:200], height=480)},
                    texts={"verdict": text, "kv": "<div class='kv'>-</div>", "preflight": "", "export": ""})
    texts = {"verdict": verdict_html(p, spec), "kv": kv_html(p)}
    try:
        texts["preflight"] = preflight_html(preflight_for_state(state, base), logits_note(p, spec))
        texts["export"] = export_html(state, base)
    except ParamError as err:  # the planner takes it, the recipe does not (e.g. master_on_host without param offload)
        texts["preflight"] = f"<p><b>Pre-flight</b>: the recipe refuses these settings: {esc(err)}</p>"
        texts["export"] = "<p><i>no recipe to export (see the pre-flight)</i></p>"
    return View(figures={"bars": bars_figure(p, spec)}, texts=texts)


def controls(state: dict[str, Any]):
    """One ipywidgets control per state key, starting at ``state``."""
    import ipywidgets as W

    from rlkit.models.shape import presets

    wide = {"description_width": "150px"}
    lay = W.Layout(width="360px")
    models = sorted(set(presets()) | {state["model"]})
    lora = sorted({0, 8, 16, 32, 64, 128, int(state["lora_rank"])})

    def islider(key, label, lo, hi, step):
        return W.IntSlider(value=int(state[key]), min=min(lo, int(state[key])), max=max(hi, int(state[key])), step=step,
                           description=label, continuous_update=False, style=wide, layout=lay)

    out = {
        "model": W.Dropdown(options=models, value=state["model"], description="model", style=wide, layout=lay),
        "gpu_gib": W.FloatSlider(value=float(state["gpu_gib"]), min=8.0, max=max(192.0, float(state["gpu_gib"])),
                                 step=0.1, description="card GiB", continuous_update=False, style=wide, layout=lay),
        "n_gpus": islider("n_gpus", "GPUs", 1, 8, 1),
        "gpu_memory_utilization": W.FloatSlider(value=float(state["gpu_memory_utilization"]), min=0.05, max=1.0,
                                                step=0.01, description="gpu_memory_utilization",
                                                continuous_update=False, style=wide, layout=lay),
        "max_prompt_length": islider("max_prompt_length", "prompt tokens", 128, 16384, 128),
        "max_response_length": islider("max_response_length", "response tokens", 256, 32768, 256),
        "train_batch_size": islider("train_batch_size", "batch (prompts)", 1, 256, 1),
        "group_size": islider("group_size", "group (responses)", 1, 32, 1),
        "micro_batch_tokens": islider("micro_batch_tokens", "tokens / micro-batch", 1024, 131072, 1024),
        "lora_rank": W.Dropdown(options=lora, value=int(state["lora_rank"]), description="LoRA rank (0: full)",
                                style=wide, layout=lay),
        "logits_path": W.Dropdown(options=list(budget.LOGITS_BYTES), value=state["logits_path"],
                                  description="logits path", style=wide, layout=lay),
        "gradient_checkpointing": W.Checkbox(value=bool(state["gradient_checkpointing"]),
                                             description="gradient checkpointing", indent=False),
        "param_offload": W.Checkbox(value=bool(state["param_offload"]), description="param offload", indent=False),
        "optimizer_offload": W.Checkbox(value=bool(state["optimizer_offload"]), description="optimizer offload",
                                        indent=False),
    }
    out.update({o: W.Checkbox(value=bool(state[o]), description=f"rlkit: {o}", indent=False)
                for o in budget.RLKIT_OPTIONS})
    return out


def budget_explorer(cfg, options: str | None = None) -> Explorer:
    """The explorer over notebook 00's parameters ``cfg`` (:class:`rlkit.experiments.phase_budget.Config`),
    starting at the rlkit options ``options`` (default: the largest of ``cfg.option_sets``)."""
    if options is None:
        options = max(cfg.option_sets, key=lambda o: len([x for x in o.split(",") if x]))
    base = cfg.spec(options)
    explorer = Explorer(controls(state_from_spec(base)), functools.partial(draw, base=base), css="rlkit-budget",
                        columns=3, links=(_host_step_changed,), below=("preflight", "export"),
                        title="Phase-budget explorer: move a control, the plan is redrawn")
    _host_step_changed(explorer, "cpu_optimizer_step")
    return explorer


def _host_step_changed(explorer: Explorer, name: str) -> None:
    """With the host optimizer step, verl's optimizer offload is off (HostAdamW keeps Adam on the host): grey it out."""
    if name == "cpu_optimizer_step":
        explorer.controls["optimizer_offload"].disabled = bool(explorer.controls["cpu_optimizer_step"].value)
