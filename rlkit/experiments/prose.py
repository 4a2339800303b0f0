"""The closing findings of notebooks 00, 02 and 04 in plain sentences, every number read from ``metrics``.

Their experiment modules (:mod:`.phase_budget`, :mod:`.update_phase`, :mod:`.skip_old_logprob`) each expose
``describe(metrics)``, which calls the function here: the text lives beside them to keep those modules readable in one
sitting. :func:`plain` turns the Markdown findings other modules already write into the plain text ``describe`` prints.
"""
from __future__ import annotations

import re
from typing import Any

GIB = 2**30


def plain(markdown: str) -> str:
    """``markdown`` without emphasis, code marks or list bullets: the text ``print`` shows."""
    text = markdown.replace("**", "").replace("`", "")
    return "\n".join(re.sub(r"^\s*-\s+", "", line) for line in text.splitlines())


SYNTHETIC = ("Synthetic inputs: a random-init model built from its preset's config and random token batches (nothing "
             "downloaded); memory, time and parity do not depend on the weights.")


def device_label(device: str, gpu: str | None = None, model: str | None = None) -> str:
    """Where a run measured, said first (a GPU run, or the tiny CPU profile whose times and memory mean little), and
    that its model and data are synthetic (notebooks 01-04 build random-init presets and random batches)."""
    on = f"model {model}, " if model else ""
    if device == "cpu" or (not gpu and device != "cuda"):
        return (f"Tiny CPU profile ({on}device cpu): host and device are the same memory, so the memory and time "
                f"numbers show the mechanism only; parity and counts hold as on a GPU. {SYNTHETIC}")
    return f"GPU run ({on}device {gpu or device}). {SYNTHETIC}"


# ------------------------------------------------------------------------------------------------ 00 · phase budget

def phase_budget(metrics: dict[str, Any]) -> str:
    """Notebook 00: the document's table against its script, and the planner's verdict per option set."""
    plans = metrics["plans"]
    first = next(iter(plans.values()))
    s = first["spec"]
    lines = [(f"Planner arithmetic only: nothing was measured and no GPU was used, so every profile gives these "
             f"numbers ({metrics['units']} per GPU). Setup: {first['model']} ({first['params']:,} parameters) on "
             f"{s['n_gpus']} x {s['gpu_gib']:g} GiB, gpu_memory_utilization {s['gpu_memory_utilization']:g}, "
             f"{s['train_batch_size']} prompts x {s['group_size']} responses of up to {s['max_prompt_length']} + "
             f"{s['max_response_length']} tokens, logits path {s['logits_path']}.")]
    diff = metrics["seed_diff"]
    changed = [r for r in diff if r["differs"]]
    columns = sorted({c for r in changed for c in r["differs"]})
    deltas = sorted({r["max_seqs_delta"] for r in changed if "max_seqs" in r["differs"]})
    lines.append(f"The document's printed table against its own script: {len(changed)} of {len(diff)} rows differ"
                 + (f", in {', '.join(columns)}" if changed else "")
                 + (f" (max_seqs off by {', '.join(f'{d:+d}' for d in deltas)} sequences)" if deltas else "")
                 + "; the verdicts " + ("differ in some rows." if "verdict" in columns else "all agree."))
    for name, p in plans.items():
        lines.append(f"Options {name}: {p['verdict']}; peak {p['peak_phase']} {p['peak_gib']:.2f} GiB, headroom "
                     f"{p['headroom_gib']:+.2f} GiB, binding {p['binding']}; host node peak "
                     f"{p['host_node_peak_gib']:.1f} GiB.")
    fitting = [k for k, p in plans.items() if p["fits"]]
    lines.append(f"Option sets that fit: {'; '.join(fitting) if fitting else 'none'} ({len(fitting)} of {len(plans)}).")
    abl = metrics["ablations"]
    lines.append(f"Leaving one option out of {abl['all']}: " + "; ".join(
        f"{k} {p['verdict']} (peak {p['peak_gib']:.2f} GiB)" for k, p in abl["plans"].items()) + ".")
    lines.append("Logits path, same largest option set: " + "; ".join(
        f"{k} {p['verdict']} (update fwd/bwd {p['device_total_gib']['update_fwd_bwd']:.2f} GiB)"
        for k, p in metrics["logits_paths"].items()) + ".")
    lines.append("Run cost at the document's example: " + "; ".join(
        f"{c['n_gpus']} GPU(s) x {c['wallclock_hours']:g} h at ${c['price_per_gpu_hour']:g}/GPU-hour = "
        f"${c['run_cost']:,.2f}" for c in metrics["cost_examples"]) + ".")
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------------ 02 · host AdamW

def _arm_line(a: dict[str, Any], adam_bytes: list[int]) -> str:
    if a["status"] != "ok":
        return (f"{a['arm']}: {a['status']}" + (f" in {a['oom_phase']}" if a.get("oom_phase") else "")
                + (f" at {a['peak_device_gib']:.2f} GiB device peak" if a.get("peak_device_gib") is not None else "")
                + ".")
    host, dev = a["parity"]["host_reference"], a["parity"]["device_reference"]
    exact = "bit-exact" if host["max_abs_diff"] == 0.0 else f"max abs diff {host['max_abs_diff']:.3g}"
    return (f"{a['arm']}: optimizer phase {a['optimizer_seconds']:.3f} s, device peak {a['peak_device_gib']:.2f} GiB, "
            f"Adam state per rank {', '.join(f'{b / GIB:.3f} GiB' for b in adam_bytes)}; flat parameter "
            f"{a['parity']['param_index']} ({a['parity']['numel']:,} elements) against {host['what']}: {exact} "
            f"(tolerance {host['tolerance']:g}), against {dev['what']}: max abs diff {dev['max_abs_diff']:.3g} "
            f"(tolerance {dev['tolerance']:.3g}, {'within' if dev['ok'] else 'OUTSIDE'}).")


def host_adamw(metrics: dict[str, Any]) -> str:
    """Notebook 02: every arm's parity with torch's AdamW, its optimizer seconds and Adam bytes, and the benchmarks."""
    cfg, s, arms = metrics["config"], metrics["summary"], metrics["arms"]
    device = next((a["device"] for a in arms if a.get("device")), cfg["device"])
    lines = [device_label("cpu" if str(device).startswith("cpu") else "cuda", None if str(device).startswith("cpu")
                          else device, cfg["model"]),
             f"Compared: the AdamW step of {cfg['model']} ({arms[0]['num_params']:,} parameters in "
             f"{arms[0]['num_flat_params']} flat parameters) on the device and on the host, arms {', '.join(s['status'])}; "
             f"{cfg['num_sequences']} sequences x {cfg['seq_len']} tokens, {cfg['optimizer_steps']} optimizer steps, "
             f"host kernel {cfg['host_impl']}"
             + (f", device memory capped at {cfg['memory_cap_gib']:g} GiB" if cfg["memory_cap_gib"] else "") + ".",
             f"Parity verdict over all finished arms: {s['parity_ok']}."]
    lines += [_arm_line(a, s["adam_state_bytes_per_rank"].get(a["arm"], [])) for a in arms]
    for arm, same in s["cross_rank_identical"].items():
        lines.append(f"{arm}: parameters bit-identical on every rank after the step: {same}.")
    gbps = metrics["bench_copy"].get("gbps")
    if gbps:
        lines.append("Copy bandwidth, " + f"{metrics['bench_copy']['bytes'] / 2**20:,.0f} MiB: " + ", ".join(
            f"{k} {v:.1f} GB/s" for k, v in gbps.items()) + ".")
    adam = metrics["bench_adam"]
    if s["host_step_vs_torch_fused"] is not None:
        lines.append(f"Host step throughput {adam['host_step_gbps']:.1f} GB/s = {s['host_step_vs_torch_fused']:.2f} x "
                     f"torch's fused CPU AdamW ({adam['torch_fused_gbps']:.1f} GB/s) on {adam['threads']} threads, "
                     f"{adam['numel']:,} elements.")
    for arm, eff in s["transfer_efficiency_vs_pinned_bench"].items():
        lines.append(f"{arm}: grad D2H at {eff['grad_d2h']:.0%} and param H2D at {eff['param_h2d']:.0%} of the "
                     "measured pinned copy bandwidth.")
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------------ 04 · skip old log-prob

def skip_old_logprob(metrics: dict[str, Any]) -> str:
    """Notebook 04: the served log-probs against the skipped pass, what the skip saves, and the guard's verdicts."""
    from rlkit.measure.determinism import findings as determinism_findings

    setup, bits, t, impl = metrics["setup"], metrics["bit_exactness"], metrics["timing"], metrics["implementation"]
    guard = metrics["guard"]
    lines = [device_label(setup["device"], setup.get("gpu"), setup["model"]),
             (f"Compared: the PPO update serving old = log_prob.detach() (skip) against reading a separate old-log-prob "
             f"pass (no skip), {setup['model']} ({setup['parameters']:,} parameters, {setup['dtype']}), "
             f"{setup['num_sequences']} sequences ({setup['total_tokens']:,} tokens) in {setup['num_micro_batches']} "
             f"micro-batches of {setup['micro_batch_size']}; functions: {impl['source']} ({impl['log_probs']}; "
             f"{impl['policy_loss']})."),
             (f"max |log_prob.detach() - old_log_probs| = {bits['served_vs_old_log_prob_max_abs_diff']:.3e} with the "
             f"same micro-batching; a second old pass with micro-batch {setup['alt_micro_batch_size']} differs by "
             f"{bits['alt_micro_batch_old_log_prob_max_abs_diff'] or 0.0:.3e}."),
             (f"Truncated IS weights served vs decoupled: token {bits['is_weights_token_max_abs_diff']:.3e}, sequence "
             f"{bits['is_weights_sequence_max_abs_diff']:.3e}. PPO loss {bits['loss_skip']:.6g} with the skip vs "
             f"{bits['loss_no_skip']:.6g} without (|diff| {bits['loss_abs_diff']:.3e}); max |grad diff| "
             f"{bits['grad_max_abs_diff']:.3e} against a rerun floor of {bits['grad_rerun_max_abs_diff']:.3e}; "
             f"actor/entropy {bits['actor_entropy_update_forward']:.6g} from the update forward vs "
             f"{bits['actor_entropy_old_pass']:.6g} from the old pass."),
             plain(determinism_findings(metrics)),
             (f"Time: the old-log-prob pass took {t['old_log_prob_seconds']:.3g} s per step (peak "
             f"{t['old_log_prob_peak_device_gib']:.2f} GiB); skipped, its placeholder took "
             f"{t['old_log_prob_skipped_seconds']:.2e} s, {t['skipped_over_unskipped']:.3%} of that. The update took "
             f"{t['update_seconds_skip']:.3g} s with the skip and {t['update_seconds_no_skip']:.3g} s without."),
             f"Guard: {sum(g['ok'] for g in guard)} of {len(guard)} configs pass ("
             + "; ".join(g["config"] for g in guard if g["ok"]) + "); the skip falls back for "
             + "; ".join(g["config"] for g in guard if not g["ok"]) + "."]
    return "\n".join(lines)
