"""The generated lines of the single-notebook results (notebooks 01-04 and 07, and the deterministic reruns of
01, 03 and 04), each from its committed ``outputs/<notebook>/<tag>/metrics.json``, and the readers of committed
results that :mod:`rlkit.report.sections` shares with them."""
from __future__ import annotations

import json
import re
from pathlib import Path

from rlkit.analysis.learning_curves import compared_runs
from rlkit.core.results import OUTPUTS_DIR, committed_runs, fmt

GIB = 2**30


def load_committed(notebook: str, tag: str = "h200", root: Path = OUTPUTS_DIR) -> dict | None:
    """``outputs/<notebook>/<tag>/metrics.json`` when git tracks it, else None."""
    folder = (root / notebook / tag).resolve()
    return json.loads((folder / "metrics.json").read_text()) if folder in committed_runs(root / notebook) else None


def source(notebook: str, tag: str = "h200") -> str:
    return f"`outputs/{notebook}/{tag}/metrics.json`"


DIRTY = " (dirty tree)"  # what a table says after the commit of a run whose env.json records local changes


def run_commit(run_dir: Path) -> str:
    """The rlkit commit a run came from, as its env.json recorded it."""
    env = run_dir / "env.json"
    sha = (json.loads(env.read_text()).get("git_sha") if env.exists() else None) or "-"
    sha = re.sub(r"^([0-9a-f]{7})[0-9a-f]{33}", r"\1", sha)  # a full SHA (RLKIT_GIT_SHA on the node) as git shows it
    # a run from a tree with uncommitted changes is not that commit's: every table that shows it says so (issue 46)
    return sha.removesuffix("-dirty") + DIRTY if sha.endswith("-dirty") else sha


def offload_section(m: dict) -> list[str]:
    lines = [(f"**FSDP1 NO_SHARD offload** ({m['model']}, {m['model_params']:,} parameters, {m['model_gib']:.3f} GiB fp32; "
             f"{source('01_offload_bug')}). Device GiB allocated:"), "",
             "| use_orig_params | forward first | fix | after wrap | after offload | after reload |", "|---|---|---|---|---|---|"]
    for r in m["rows"]:
        lines.append(f"| {r['use_orig_params']} | {r['forward_first']} | {r['fix']} | {r['after_wrap_gib']:.3f} | "
                     f"{r['after_offload_gib']:.3f} | {r['after_reload_gib']:.3f} |")
    g = m["grad_sync"]
    lines += ["", (f"Gradients across 2 ranks after backward ({g['model']} model, {g['backend']} on {g['device']}): "
              f"max abs difference {g['max_abs_grad_diff_without_fix']:.3e} without the NO_SHARD fix, "
              f"{g['max_abs_grad_diff_with_fix']:.1e} with it.")]
    return lines


def host_adamw_section(m: dict) -> list[str]:
    s = m["summary"]
    lines = [(f"**HostAdamW, Qwen3-4B update phase** (one H200 capped at {m['config']['memory_cap_gib']:g} GiB per process; "
             f"{source('02_host_adamw')}):"), "",
             "| arm | status | optimizer phase (s) | peak device GiB | Adam state per rank (GiB) |", "|---|---|---|---|---|"]
    for a in m["arms"]:
        adam = ", ".join(f"{r['adam_state_bytes'] / GIB:.2f}" for r in a.get("per_rank", []))
        opt = f"{a['optimizer_seconds']:.2f}" if a["status"] == "ok" else f"OOM in {a.get('oom_phase', '?')}"
        lines.append(f"| {a['arm']} | {a['status']} | {opt} | {a['peak_device_gib']:.2f} | {adam} |")
    bw = m["bench_copy"]["gbps"]
    eff = s["transfer_efficiency_vs_pinned_bench"]["host_pinned"]
    lines += ["", (f"Pinned copies: {bw['h2d_pinned']:.1f} GB/s H2D, {bw['d2h_pinned']:.1f} GB/s D2H (pageable "
              f"{bw['h2d_pageable']:.1f} / {bw['d2h_pageable']:.1f}); the pinned arm's transfers reach "
              f"{eff['grad_d2h']:.0%} (grad D2H) and {eff['param_h2d']:.0%} (param H2D) of that. Host step throughput "
              f"{s['host_step_vs_torch_fused']:.2f} x torch's fused CPU AdamW. Parity with torch AdamW: {s['parity_ok']}. "
              f"Rank-0 owner: weights bit-identical on every rank after the step: {all(s['cross_rank_identical'].values())}.")]
    shared = [a["arm"] for a in m["arms"] if a.get("shared_gpu")]
    if shared:
        lines[-1] += (f" {', '.join(shared)} ran both ranks on one GPU with every collective on "
                      f"{', '.join(sorted({a['backend'] for a in m['arms'] if a.get('shared_gpu')}))}, so its time is not a two-GPU time.")
    return lines


def cast_once_section(m: dict) -> list[str]:
    per_arm, d = m["summary"]["per_arm"], m["summary"]["D_vs_A"]
    lines = [(f"**Master on host / cast-once, Qwen3-4B** ({m['config']['num_sequences']} x {m['config']['seq_len']} tokens, "
             f"{m['config']['num_sequences'] // m['config']['micro_batch_size']} micro-batches, "
             f"{m['config']['memory_cap_gib']:g} GiB cap; {source('03_cast_once')}):"), "",
             "| arm | peak device GiB | step (s) | casts/step | fp32 read/step (GiB) |", "|---|---|---|---|---|"]
    for name, r in per_arm.items():
        lines.append(f"| {name} | {r['peak_device_gib']:.2f} | {r['step_seconds']:.3f} | {r['casts_per_step']} | "
                     f"{r['bytes_read_per_step'] / GIB:.2f} |")
    lines += ["", (f"D vs A: {d['peak_saving_gib']:.2f} GiB lower peak, step time x{d['step_time_ratio']:.3f}; "
              f"resident bf16 copy equal to a fresh cast of the master at every step: {m['summary']['resident_copy_fresh']}. "
              "With the GPU's default kernels the baseline does not reproduce itself (see notebook 03 and "
              "`outputs/03_cast_once/h200-rerun-A/`); in deterministic mode every arm is bit-identical to A on the GPU "
              "too (the determinism table below), as on the CPU.")]
    return lines


def skip_net(t: dict) -> str:
    """What the skip changes in a step (the old-log-prob pass and the update together), beside its pass's saving."""
    without = t["old_log_prob_seconds"] + t["update_seconds_no_skip"]
    with_skip = t["old_log_prob_skipped_seconds"] + t["update_seconds_skip"]
    return (f"The update took {t['update_seconds_skip']:.2f} s with the skip against {t['update_seconds_no_skip']:.2f} s "
            f"without, so the old-log-prob pass and the update together went from {without:.2f} s to {with_skip:.2f} s: "
            f"{'a saving' if without > with_skip else 'a loss'} of {abs(without - with_skip):.2f} s in the step, "
            f"against the pass's {t['old_log_prob_seconds']:.2f} s.")


def skip_section(m: dict) -> list[str]:
    """The skip's bit-exactness, and its net effect on the step beside what it saves in its own pass (issue 46)."""
    b, t = m["bit_exactness"], m["timing"]
    return [f"**On-policy old-log-prob skip, Qwen3-4B** ({source('04_skip_old_logprob')}): "
            f"max |log_prob.detach() - old_log_probs| = {b['served_vs_old_log_prob_max_abs_diff']:.1e}, IS weights "
            f"{b['is_weights_token_max_abs_diff']:.1e}, PPO loss difference {b['loss_abs_diff']:.1e}; the old-log-prob "
            f"pass cost {t['old_log_prob_seconds']:.2f} s and {t['old_log_prob_skipped_seconds']:.1e} s skipped "
            f"({t['skipped_over_unskipped']:.4%} of it). " + skip_net(t)]


DETERMINISM_NOTEBOOKS = ("01_offload_bug", "03_cast_once", "04_skip_old_logprob")


def determinism_section(root: Path = OUTPUTS_DIR) -> list[str]:
    """The GPU parity checks rerun in deterministic mode (``outputs/<notebook>/h200-deterministic/``)."""
    tag = "h200-deterministic"
    header = ("| notebook | commit | checks | bit-exact | largest patched vs unpatched | largest unpatched vs itself | "
              "ops torch refused |")
    lines = [("**GPU parity in deterministic mode** (one H200; `torch.use_deterministic_algorithms(True)` in its raising "
             "mode, cuDNN deterministic, `CUBLAS_WORKSPACE_CONFIG` from the launcher, fixed seeds; each check is the "
             "patched run against the unpatched one, next to the unpatched run against a repeat of itself; "
             f"`outputs/<notebook>/{tag}/metrics.json`):"), "", header, "|" + "---|" * (header.count("|") - 1)]
    rows = 0
    for notebook in DETERMINISM_NOTEBOOKS:
        m = load_committed(notebook, tag, root)
        d = (m or {}).get("determinism")
        if not d:
            continue
        checks = [c for c in d["checks"] if c["patched_vs_unpatched"] is not None]
        spreads = [c["unpatched_vs_itself"] for c in checks if c["unpatched_vs_itself"] is not None]
        lines.append(f"| {notebook} | {run_commit(root / notebook / tag)} | {len(checks)} | "
                     f"{sum(c['verdict'] == 'bit-exact' for c in checks)} | "
                     f"{fmt(max((c['patched_vs_unpatched'] for c in checks), default=None), 'g')} | "
                     f"{fmt(max(spreads, default=None), 'g')} | {', '.join(d.get('nondeterministic_ops', {}).values()) or 'none'} |")
        rows += 1
    skip = load_committed("04_skip_old_logprob", tag, root)
    if rows and skip and skip.get("timing"):
        lines += ["", f"04_skip_old_logprob in deterministic mode ({skip['setup']['num_sequences']} sequences of "
                  f"{skip['setup']['response_length']} response tokens, a smaller run than the h200 one above). "
                  + skip_net(skip["timing"])]
    return lines if rows else [f"*No committed {tag} results yet.*"]


def _rising_words(rising: dict[str, int] | None) -> str:
    return (f" (in the rising part: inside at {rising['in_range']} of {rising['steps']}, within the band at "
            f"{rising['within_band']})" if rising else "")


def _h200s(cfg: dict) -> str:
    """The node of notebook 07's committed runs, from the config's ``n_gpus``."""
    from rlkit.experiments.learning_words import gpus_per_run, where_runs

    return "one H200" if gpus_per_run(cfg) == 1 else f"{where_runs(cfg)} of H200s"


def learning_section(root: Path = OUTPUTS_DIR) -> list[str]:
    """Notebook 07's GPU runs (``outputs/07_does_it_learn/h200/metrics.json``): does GRPO still learn with the
    patches, against the run-to-run noise of the baseline arm."""
    m = load_committed("07_does_it_learn", root=root)
    if not m or not m.get("analysis", {}).get("per_run"):
        return ["*07_does_it_learn: no committed GPU runs yet.*"]
    cfg, a = m["config"], m["analysis"]
    window = a["criteria"]["window"]
    runs_dir = root / "07_does_it_learn" / Path(cfg["runs_dir"]).name
    header = (f"| run | commit | steps | reward, first {window} steps | reward, last {window} | learns | "
              "entropy collapsed at step |")
    lines = [(f"**Does it still learn** (synthetic task and random-init model: `{cfg['reward']}` on "
             f"{m['data']['rows']} synthetic rows, {cfg['model']}; {cfg['train_batch_size']} prompts x "
             f"{cfg['rollout_n']}, lr {cfg['lr']:g}, {_h200s(cfg)}, the runs side by side; {source('07_does_it_learn')}):"),
             "", header, "|" + "---|" * (header.count("|") - 1)]
    for name, r in a["per_run"].items():
        lines.append(f"| {name} | {run_commit(runs_dir / name)} | {r['steps_trained']} | {fmt(r['reward_first'], '.3f')} | "
                     f"{fmt(r['reward_last'], '.3f')} | {r['learned']} | {fmt(r['entropy_collapsed_at'], 'd')} |")
    comps, v = compared_runs(a), a["verdict"]
    if comps:
        crit = a["criteria"]
        floor = (f"{crit['noise_floor']:g}" if crit["noise_floor"] is not None
                 else f"their measured mean range per step, {fmt(a['noise'].get('floor'), '.4f')}")
        spread = a.get("compare_spread")
        words = [f"{comp['run']}: {fmt(comp['mean_distance'], '.4f')} from them (threshold {comp['threshold']:.4f}); "
                 f"within max({crit['noise_factor']:g} x their range, {floor}) of their mean at "
                 f"{(comp['per_step'] or {}).get('within_band', '-')} of {(comp['per_step'] or {}).get('steps', '-')} "
                 f"steps, inside their range at {(comp['per_step'] or {}).get('in_range', '-')}"
                 + _rising_words((comp["per_step"] or {}).get("rising")) + "." for comp in comps.values()]
        n_base = v["baseline_runs"]
        lines += ["", f"Noise (the {'two' if n_base == 2 else n_base} "
                      f"{crit['baseline_arm']} runs): {fmt(a['noise']['curve_distance'], '.4f')} mean |reward difference| "
                      f"per step. " + " ".join(words)
                  + (f" The compared runs' own spread: {fmt(spread['curve_distance'], '.4f')}." if spread
                     else (" One compared run: no compared spread." if "compare_spread" in a else ""))
                  + f" Verdict: {'passed' if v['passed'] else 'not passed'}."]
    before = m.get("analysis_before_collapse")
    if before and compared_runs(before):
        words = [f"{b['run']} {fmt(b['mean_distance'], '.4f')} from the baseline runs (threshold {b['threshold']:.4f}), "
                 f"within the band at {(b['per_step'] or {}).get('within_band', '-')} of "
                 f"{(b['per_step'] or {}).get('steps', '-')} steps" for b in compared_runs(before).values()]
        lines += ["", (f"The same over the steps before the first entropy collapse (1-{before['last_step']}), where the "
                      f"updates still move the policy: noise {fmt(before['noise']['curve_distance'], '.4f')}, "
                      f"{'; '.join(words)}. Verdict: {'passed' if before['verdict']['passed'] else 'not passed'}.")]
    return lines


SECTIONS = [("01_offload_bug", offload_section), ("02_host_adamw", host_adamw_section),
            ("03_cast_once", cast_once_section), ("04_skip_old_logprob", skip_section)]


# Notebook 05's runs of the seed's own workload (profile h200-seed, issue 23): folders "<profile>-<arm>".
SEED_PREFIX = "h200-seed-"


def committed_arms(root: Path = OUTPUTS_DIR, *, reruns: bool = False, prefix: str = "") -> tuple[dict[str, dict], dict[str, str]]:
    """Notebook 05's committed runs whose folder is named after an arm of rlkit.recipes.grpo.ARMS (``<prefix><arm>`` or
    ``<prefix><arm>-<variant>``; with ``reruns``, ``<arm>.session<N>`` too): their metrics (with ``gpu``, the GPU its
    env.json names) and their commits, by name."""
    from rlkit.core.env import gpu_name, read_saved
    from rlkit.experiments.grpo_runs import read_results
    from rlkit.recipes.grpo import ARMS

    folder = root / "05_grpo_qwen3_4b"
    names = [p.name for p in committed_runs(folder)
             if any(p.name == prefix + a or p.name.startswith(f"{prefix}{a}-")
                    or (reruns and p.name.startswith(f"{prefix}{a}.session")) for a in ARMS)]
    return ({name: {**read_results(folder / name), "gpu": gpu_name(read_saved(folder / name))} for name in names},
            {name: run_commit(folder / name) for name in names})
