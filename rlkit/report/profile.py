"""The generated lines of the update profiles (issue 24 item 2): each ``outputs/update_profile/<tag>/`` is one update
of the seed workload's actor under torch.profiler (:mod:`rlkit.experiments.update_profile`). With several, the
levers go side by side (each against the profile without levers of the same commit, on the same workload), then the
detail of the fastest and of its base; every number comes from the folders' ``metrics.json`` and ``env.json``."""
from __future__ import annotations

import json
from pathlib import Path
from statistics import mean

from rlkit.core.results import OUTPUTS_DIR, fmt, pct, run_folders
from rlkit.report.notebooks import run_commit

# The update_profile fields that are the update's levers, each with its off value and what the table calls it on.
LEVERS = {"overlap_copies": (False, "overlapped copies"), "rmsnorm": ("eager", "compiled RMSNorm"),
          "pointwise": ("eager", "compiled rotary + SwiGLU"), "selective_layers": (0, "selective checkpointing"),
          "prefetch_grads": (False, "gradient prefetch")}
MFU_TARGET = 0.40  # issue 24: update_actor at least 40 % MFU
COMPARED = ("entropy", "grad_norm")  # what each profile's first update reports, held against its base's


def levers_on(config: dict) -> list[str]:
    """What the profile turned on, by name (a profile made before a lever existed ran without it)."""
    return [name for key, (off, name) in LEVERS.items() if config.get(key, off) != off]


def committed_profiles(root: Path = OUTPUTS_DIR) -> dict[str, dict]:
    """Each committed profile's metrics, with its run's commit under ``commit``, by folder name."""
    folders = run_folders(root / "update_profile")  # the rule every reader of a folder of runs shares
    return {f.name: {**json.loads((f / "metrics.json").read_text()), "commit": run_commit(f)} for f in folders}


def _wall(m: dict) -> float:
    return m["timing"]["timed"][0]["seconds"]


def _same_workload(a: dict, b: dict) -> bool:
    return a["workload"]["tokens_per_micro_batch"] == b["workload"]["tokens_per_micro_batch"]


def _optimizer(m: dict) -> str:
    return m["config"].get("optimizer", "host_adamw")


def _same_setup(a: dict, b: dict) -> bool:
    """One kind of card, one workload, one optimizer: the same computation, whatever the commit."""
    return a["device"] == b["device"] and _optimizer(a) == _optimizer(b) and _same_workload(a, b)


def _comparable(a: dict, b: dict) -> bool:
    """The only pairs the report compares: one commit and one setup (:func:`_same_setup`)."""
    return a["commit"] == b["commit"] and _same_setup(a, b)


def _levers_cell(m: dict) -> str:
    step = [] if _optimizer(m) != "none" else ["no optimizer step"]
    return ", ".join(levers_on(m["config"]) + step) or "none"


def base_of(name: str, profiles: dict[str, dict]) -> str | None:
    """The profile without levers comparable with ``name`` (``name`` itself if it has none on)."""
    m = profiles[name]
    same = [n for n, b in profiles.items() if not levers_on(b["config"]) and _comparable(b, m)]
    return same[0] if same else None


def fastest_and_base(profiles: dict[str, dict]) -> tuple[str, str | None]:
    """The fastest whole update (a profile without the optimizer step is not one) and its base."""
    updates = [n for n, m in profiles.items() if _optimizer(m) != "none"] or list(profiles)
    fastest = min(updates, key=lambda n: _wall(profiles[n]))
    return fastest, base_of(fastest, profiles)


def _first_update(m: dict) -> dict:
    """The first update of the profile (its warm-up, from the seed's initial weights, the same in every profile)."""
    return (m["timing"]["warmup"] or m["timing"]["timed"])[0]


def _relative(a: float, b: float) -> float:
    return abs(a - b) / abs(b)


def _against_base(m: dict, base: dict | None) -> str:
    """The first update's entropy (the forward alone) and gradient norm (the backward too) against the base's:
    ``identical`` bit for bit, else the relative difference. (Its loss is the same in every profile: on-policy, the
    ratio is exactly 1.)"""
    if base is None or base is m:
        return "-"
    ours, theirs = _first_update(m), _first_update(base)
    return ", ".join(f"{k} " + ("identical" if ours[k] == theirs[k] else f"{_relative(ours[k], theirs[k]):.1e}")
                     for k in COMPARED)


def run_to_run(profiles: dict[str, dict]) -> tuple[tuple[str, str], float] | None:
    """The largest first-update gradient-norm difference between two profiles without levers on the same workload:
    the same computation run twice, so how far apart a lever's run may land without the lever changing anything."""
    plain = [n for n, m in profiles.items() if not levers_on(m["config"])]
    pairs = [((a, b), _relative(_first_update(profiles[a])["grad_norm"], _first_update(profiles[b])["grad_norm"]))
             for i, a in enumerate(plain) for b in plain[i + 1:]
             if _same_setup(profiles[a], profiles[b])]
    return max(pairs, key=lambda p: p[1]) if pairs else None


def _lever_sets(profiles: dict[str, dict]) -> dict[tuple, list[str]]:
    """The profiles by what they ran (commit, card, optimizer, workload, levers): the runs of one set are repeats."""
    sets: dict[tuple, list[str]] = {}
    for name, m in profiles.items():
        key = (m["commit"], m["device"], _optimizer(m), tuple(m["workload"]["tokens_per_micro_batch"]), _levers_cell(m))
        sets.setdefault(key, []).append(name)
    return sets


def repeats(profiles: dict[str, dict]) -> list[str]:
    """At each commit and card where a set of levers ran more than once: every set's runs, their mean and spread,
    and the mean against the mean of the comparable profiles without levers."""
    sets = _lever_sets(profiles)
    repeated = {key[:2] for key, names in sets.items() if len(names) > 1}
    rows = []
    for (commit, device, *_, levers), names in sets.items():
        if (commit, device) not in repeated:
            continue
        walls = [_wall(profiles[n]) for n in names]
        base = base_of(names[0], profiles)
        base_walls = [_wall(profiles[n]) for n in next((ns for ns in sets.values() if base in ns), [])]
        change = "-" if base is None or base in names else f"{mean(walls) / mean(base_walls) - 1:+.0%}"
        mfu = mean(profiles[n]["flops"]["mfu_timed"] for n in names)
        rows.append(f"| {commit} | {device} | {levers} | {len(names)} | {', '.join(f'{w:.2f}' for w in walls)} | "
                    f"{mean(walls):.2f} | {fmt(max(walls) - min(walls) if len(walls) > 1 else None, '.2f')} | {pct(mfu)} | "
                    f"{change} |")
    if not rows:
        return []
    return ["**Repeats** (the profiles of one commit and card grouped by what they ran; the change is of the mean "
            "update against the mean of the profiles without levers beside it):", "",
            "| commit | card | levers | runs | update (s) | mean (s) | spread (s) | MFU (mean) | change |",
            "|---|---|---|---|---|---|---|---|---|", *rows, ""]


def _without_the_optimizer(profiles: dict[str, dict]) -> list[str]:
    """The fastest forward and backward alone: what the update reaches with its levers were the optimizer step free."""
    alone = [n for n, m in profiles.items() if _optimizer(m) == "none"]
    if not alone:
        return []
    name = min(alone, key=lambda n: _wall(profiles[n]))
    m = profiles[name]
    return [f"Forward and backward alone (no optimizer step), the fastest, {name} (levers: "
            f"{', '.join(levers_on(m['config'])) or 'none'}): "
            f"{_wall(m):.2f} s, {pct(m['flops']['mfu_timed'])} MFU, the most these kernels give the update were its "
            "optimizer step free.", ""]


def side_by_side(profiles: dict[str, dict]) -> list[str]:
    lines = ["**The update's levers side by side** (`outputs/update_profile/<profile>/`; the last column holds the "
             "first update's entropy and gradient norm against the profile without levers of the same commit: "
             "`identical` is bit for bit, else the relative difference):", "",
             "| profile | commit | levers | update (s) | MFU | GPU busy | optimizer-step idle (s) | elementwise (ms) "
             "| recompute (ms) | peak alloc. (GiB) | entropy, grad norm |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for name, m in profiles.items():
        s, base = m["summary"], base_of(name, profiles)
        idle = s["idle_gaps"]["by_region"].get("optimizer_step", {}).get("ms", 0) / 1e3
        passes = s.get("passes") or {}
        lines.append(f"| {name} | {m['commit']} | {_levers_cell(m)} | {_wall(m):.2f} | "
                     f"{pct(m['flops']['mfu_timed'])} | {pct(s['device']['busy_fraction'])} | {idle:.2f} | "
                     f"{s['categories']['elementwise']['ms']:.0f} | {fmt(passes.get('recompute', {}).get('ms'), '.0f')} | "
                     f"{m['timing']['peak_allocated_gib']:.1f} | {_against_base(m, profiles.get(base))} |")
    fastest, base = fastest_and_base(profiles)
    f = profiles[fastest]["flops"]
    gain = (f" ({1 - _wall(profiles[fastest]) / _wall(profiles[base]):.0%} below {base}'s {_wall(profiles[base]):.2f} s "
            "at the same commit)" if base and base != fastest else "")
    noise = run_to_run(profiles)
    if noise:
        (a, b), diff = noise
        lines += ["", f"Run to run, {a} and {b} (no levers, the same workload) differ by {diff:.1e} in the first "
                      "update's gradient norm: the profile runs without torch's deterministic algorithms, so differences "
                      "of that order are not a lever's doing, and a lever's bit identity is its own GPU test's "
                      "(deterministic mode)."]
    lines += ["", f"The fastest, {fastest}: {_wall(profiles[fastest]):.2f} s{gain}, {pct(f['mfu_timed'])} MFU against "
                  f"the {MFU_TARGET:.0%} target ({f['model_flops'] / (MFU_TARGET * f['peak_bf16_flops']):.2f} s).", ""]
    return lines + _without_the_optimizer(profiles) + repeats(profiles)


def detail(name: str, m: dict) -> list[str]:
    """One profile: its time against the dense bf16 peak, where the GPU idles, its copies, its kernel time by kind."""
    w, f, s = m["workload"], m["flops"], m["summary"]
    dev, idle = s["device"], s["idle_gaps"]["by_region"]
    wall = _wall(m)
    copies = s["host_syncs"]["copies"]
    pcie = {k: copies[k]["bytes"] / (copies[k]["ms"] / 1e3) / 1e9 for k in ("DtoH", "HtoD") if copies.get(k)}
    at_target = f["model_flops"] / (MFU_TARGET * f["peak_bf16_flops"])
    lines = [
        f"**One update profiled** (`outputs/update_profile/{name}/`, {m['device']}, commit {m['commit']}, levers: "
        f"{', '.join(levers_on(m['config'])) or 'none'}): {m['model']['preset']} "
        f"({m['model']['params'] / 1e9:.2f}B, {m['model']['wrap']}, {m['model']['optimizer']}, "
        f"{m['model']['attn_implementation']}), {w['micro_batches']} micro-batches, {w['tokens']:,} tokens "
        f"(sequences of mean {w['sequence_tokens_mean']:.0f}, max {w['sequence_tokens_max']:,}).", "",
        f"- {wall:.2f} s for {f['model_flops'] / 1e15:.2f} PFLOP of model FLOPs: {pct(f['mfu_timed'])} MFU "
        f"({pct(f['hardware_fraction_timed'])} counting the checkpoint recompute, which is "
        f"{pct(1 - f['model_flops'] / f['hardware_flops'])} of the FLOPs the GPU computes). At the dense bf16 "
        f"peak it would take {f['limit_s']:.2f} s; at {MFU_TARGET:.0%} MFU, {at_target:.2f} s.",
        f"- The GPU is busy {pct(dev['busy_fraction'])} of the update; of its {dev['idle_ms'] / 1e3:.2f} s idle, "
        f"{idle.get('optimizer_step', {}).get('ms', 0) / 1e3:.2f} s fall in the optimizer step (the host's AdamW "
        f"between the gradients' copy down and the parameters' copy up) and "
        f"{idle.get('micro_batch*', {}).get('ms', 0) / 1e3:.2f} s in the micro-batches. Busy time alone runs at "
        f"{pct(f['mfu_busy'])} MFU.",
        "- The copies: " + ", ".join(f"{k} {copies[k]['bytes'] / 1e9:.1f} GB in {copies[k]['ms'] / 1e3:.2f} s "
                                     f"({pcie[k]:.0f} GB/s)" for k in pcie) + ".",
        "", "| GPU time by kind | ms | share of kernel time |", "|---|---|---|"]
    for kind, c in sorted(s["categories"].items(), key=lambda kv: -kv[1]["ms"]):
        lines.append(f"| {kind} | {c['ms']:.0f} | {pct(c['share'])} |")
    lines += ["", f"GEMMs take {pct(s['categories']['gemm']['share'])} of the kernel time and elementwise kernels "
                  f"{pct(s['categories']['elementwise']['share'])}; `SUMMARY.md` beside the metrics lists the top "
                  "kernels, the gaps and the host syncs.", ""]
    return lines + _target_budget(s, f, wall, at_target, idle)


def _target_budget(s: dict, f: dict, wall: float, at_target: float, idle: dict) -> list[str]:
    """The profile's kernel time by pass, and what the 40% MFU target would take in seconds (a summary made before
    the passes were counted has neither)."""
    passes = s.get("passes")
    if not passes:
        return []
    lines = ["| pass | ms | share of kernel time | elementwise ms |", "|---|---|---|---|"]
    lines += [f"| {name} | {p['ms']:.0f} | {pct(p['share'])} | {p['ms_by_category'].get('elementwise', 0):.0f} |"
              for name, p in passes.items() if p["count"]]
    optimizer_idle = idle.get("optimizer_step", {}).get("ms", 0) / 1e3
    without = wall - optimizer_idle - passes["recompute"]["ms"] / 1e3
    elementwise = sum(passes[p]["ms_by_category"].get("elementwise", 0) for p in ("forward", "backward")) / 1e3
    short = without - at_target

    def mfu(seconds: float) -> str:
        return pct(f["model_flops"] / (seconds * f["peak_bf16_flops"]))

    reach = (f"Reaching {at_target:.2f} s would need {short:.2f} s more, {pct(short / elementwise)} of the forward and "
             f"backward's {elementwise:.2f} s of elementwise kernels: fused kernels, beyond what removing rlkit's or "
             "verl's overhead can give." if short > 0 else f"That is within the {at_target:.2f} s of the target.")
    return lines + ["", f"What {MFU_TARGET:.0%} would take, as bounds from this trace (each removal saving all of its "
                        f"time): without the optimizer step's idle time ({optimizer_idle:.2f} s, what HostAdamW's "
                        f"overlapped copies go after) and without the whole recompute "
                        f"({passes['recompute']['ms'] / 1e3:.2f} s, which the checkpointing trades for the activations "
                        f"of 24k-token micro-batches), the update would take {without:.2f} s, {mfu(without)} MFU. "
                        + reach, ""]


def update_profile_section(root: Path = OUTPUTS_DIR) -> list[str]:
    """Every committed profile side by side (when there are several), then the detail of the fastest and of the
    profile without levers it is compared with."""
    profiles = committed_profiles(root)
    if not profiles:
        return ["*update_profile: no committed profile yet.*"]
    lines = side_by_side(profiles) if len(profiles) > 1 else []
    fastest, base = fastest_and_base(profiles)
    for name in dict.fromkeys(n for n in (base, fastest) if n):
        lines += detail(name, profiles[name])
    return lines[:-1]
