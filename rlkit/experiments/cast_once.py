"""Master weights on the host + a bf16 compute copy cast once per step: arms A-D (notebook 03; seed 000, Step 6).

    python -m rlkit.experiments.cast_once --profile tiny|h200 [-p key=value]

The update phase of the update-phase harness (:mod:`rlkit.experiments.update_phase`: random-init
Qwen3, FSDP1 NO_SHARD, bf16 compute / fp32 reduce, gradient checkpointing, ``no_sync`` on all but the
last micro-batch, HostAdamW with pinned staging) run for ``steps`` optimizer steps in four arms:

- ``A``: fp32 master on the device, FSDP's per-unshard cast (the baseline),
- ``B``: + ``cast_once``: the bf16 copy is built once per step and stays resident,
- ``C``: ``master_on_host``: the fp32 master is parked in pinned host memory; every unshard casts
  from the host (a host-to-device transfer each time),
- ``D``: ``master_on_host`` + ``cast_once``.

Per arm and step: peak device GiB, step seconds (fwd/bwd + optimizer), the casts FSDP performed and
the fp32 bytes they read (:class:`rlkit.patches.instruments.cast_count.CastCounter`), the loss, int64 checksums of the
raw bits of every flat-parameter gradient, and (B, D) max |resident bf16 copy - bf16(current master)|
measured after forward/backward and before the optimizer step; at step 2 it proves the copy was
re-cast from the updated master. After the last step the fp32 masters are checksummed too. Every
arm runs in a fresh process; parity with A is exact equality of losses and checksums. Arm A then runs a
second time (``baseline_repeat``): ``metrics["determinism"]`` puts each arm's max abs differences from A
(loss, grad norm, and probes of the gradients and final masters, :func:`rlkit.measure.determinism.probe`) next
to A's from its repeat, and ``deterministic`` runs every arm in :func:`rlkit.measure.determinism.enable`'s mode.
"""
from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from typing import Any

from rlkit.core.params import ParamError, as_dict
from rlkit.measure import determinism

NOTEBOOK = "03_cast_once"
ARMS: dict[str, dict[str, Any]] = {
    "A": {"label": "A: master on device", "master_on_host": False, "cast_once": False},
    "B": {"label": "B: cast-once only", "master_on_host": False, "cast_once": True},
    "C": {"label": "C: master on host", "master_on_host": True, "cast_once": False},
    "D": {"label": "D: master on host + cast-once", "master_on_host": True, "cast_once": True},
}
# Benchmark targets of the issue (results, not tests): D vs A on Qwen3-4B under the 48 GiB cap.
TARGET_PEAK_SAVING_GIB = 6.0
TARGET_STEP_TIME_RATIO = 1.03
CHILD = "rlkit.experiments._cast_once_arm"  # one arm in a fresh process


@dataclass(frozen=True)
class Config:
    model: str  # rlkit.models.qwen preset: tiny | qwen3-735m | qwen3-4b | qwen3-8b
    device: str  # auto (cuda if available) | cuda | cpu
    arms: tuple[str, ...]  # subset of A, B, C, D; A (the reference) must be included
    steps: int  # optimizer steps per arm (>= 2: the step-2 check is the one that catches stale weights)
    num_sequences: int  # sequences per mini-batch (one mini-batch per step)
    seq_len: int  # tokens per sequence
    micro_batch_size: int  # sequences per micro-batch
    gradient_checkpointing: bool  # like verl's enable_gradient_checkpointing
    lr: float  # AdamW learning rate
    weight_decay: float  # AdamW weight decay
    host_impl: str  # HostAdamW kernel: fused | foreach | forloop
    host_threads: int  # CPU threads for the host step; 0 = all cores
    memory_cap_gib: float  # per-process device memory cap in GiB (emulates a 48 GB card); 0 = none
    deterministic: bool  # rlkit.measure.determinism.enable in every arm (raising mode), so A-vs-X parity is meaningful on GPU
    arm_timeout_s: float  # wall-clock limit per arm process
    seed: int  # model init and batch seed

    def __post_init__(self):
        unknown = [a for a in self.arms if a not in ARMS]
        if unknown or "A" not in self.arms or len(set(self.arms)) != len(self.arms):
            raise ParamError(f"arms={list(self.arms)}: list distinct arms from {list(ARMS)}, including the "
                             f"reference 'A'. Fix: e.g. arms: [A, B, C, D].")
        if self.device not in ("auto", "cuda", "cpu"):
            raise ParamError(f"device={self.device!r}: use 'auto', 'cuda' or 'cpu'.")
        if self.host_impl not in ("fused", "foreach", "forloop"):
            raise ParamError(f"host_impl={self.host_impl!r}: use 'fused', 'foreach' or 'forloop'.")
        if self.steps < 2:
            raise ParamError(f"steps={self.steps}: need >= 2 (the step-2 check proves the copy was re-cast "
                             f"after the optimizer step). Fix: steps: 2 or more.")
        for key in ("num_sequences", "seq_len", "micro_batch_size"):
            if getattr(self, key) < 1:
                raise ParamError(f"{key}={getattr(self, key)}: must be >= 1.")
        if self.num_sequences % self.micro_batch_size:
            raise ParamError(f"num_sequences={self.num_sequences} is not a multiple of micro_batch_size="
                             f"{self.micro_batch_size}. Fix: make it one.")
        for key in ("lr", "weight_decay", "host_threads", "memory_cap_gib"):
            if getattr(self, key) < 0:
                raise ParamError(f"{key}={getattr(self, key)}: must be >= 0.")
        if self.arm_timeout_s <= 0:
            raise ParamError(f"arm_timeout_s={self.arm_timeout_s}: must be > 0 seconds.")

    @property
    def micro_batches(self) -> int:
        return self.num_sequences // self.micro_batch_size


# ---------------------------------------------------------------------------------------- orchestration
REPEAT = "A repeated"  # the reference arm run a second time: the yardstick of every parity check


def run(cfg: Config) -> dict[str, Any]:
    """Run every arm, then arm A once more, each in a fresh process; return the metrics dict
    (``config``, ``arms``, ``baseline_repeat``, ``summary``, ``determinism``)."""
    import tempfile

    import torch

    from rlkit.measure.launch import LaunchError, run_module

    config = as_dict(cfg)
    env = determinism.child_env(cfg.deterministic)  # cuBLAS reads it at its first handle, before any arm's work
    probes: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="rlkit-cast-once-") as tmp:
        def launch(arm: str, name: str) -> dict[str, Any]:
            probe_path = os.path.join(tmp, f"probes-{name.replace(' ', '-')}.pt")
            message = {"arm": arm, "config": config, "probe_path": probe_path}
            try:
                row = run_module(CHILD, message, env=env, timeout=cfg.arm_timeout_s)
            except LaunchError as err:
                row = {"arm": arm, "status": "failed", "error": str(err)[-2000:]}
            except subprocess.TimeoutExpired:
                row = {"arm": arm, "status": "timeout", "error": f"no result within arm_timeout_s={cfg.arm_timeout_s}"}
            if row["status"] == "ok":
                probes[name] = torch.load(probe_path)
            row["label"] = ARMS[arm]["label"] if name == arm else f"{ARMS[arm]['label']} (repeat)"
            print(f"[cast_once] {name}: {row['status']}", file=sys.stderr)
            return row

        arms = [launch(arm, arm) for arm in cfg.arms]
        repeat = launch("A", REPEAT)
    compare_with_reference(arms, probes)
    ref = next((a for a in arms if a["arm"] == "A" and a["status"] == "ok"), None)
    if ref is not None and repeat["status"] == "ok":
        repeat["parity_vs_A"] = {**parity(ref, repeat), **probe_parity(probes["A"], probes[REPEAT])}
    return {"config": config, "arms": arms, "baseline_repeat": repeat, "summary": summarize(arms),
            "determinism": determinism_summary(arms, repeat)}


def parity(ref: dict[str, Any], row: dict[str, Any]) -> dict[str, Any]:
    """Per-step equality of ``row`` with the reference arm: losses, gradient bit-checksums, final masters."""
    steps = list(zip(ref["steps"], row["steps"]))
    p = {
        "loss_equal": [r["loss"] == x["loss"] for r, x in steps],
        "loss_abs_diff": [abs(r["loss"] - x["loss"]) for r, x in steps],
        "grads_equal": [r["grad_checksums"] == x["grad_checksums"] for r, x in steps],
        "grads_differing": [sum(a != b for a, b in zip(r["grad_checksums"], x["grad_checksums"])) for r, x in steps],
        "grad_norm_abs_diff": [abs(r["grad_norm"] - x["grad_norm"]) for r, x in steps],
        "masters_equal_after_last_step": ref["master_checksums"] == row["master_checksums"],
    }
    p["bit_exact"] = all(p["loss_equal"]) and all(p["grads_equal"]) and p["masters_equal_after_last_step"]
    return p


def probe_parity(ref: dict[str, Any], other: dict[str, Any]) -> dict[str, Any]:
    """max |difference| over the probes (:func:`rlkit.measure.determinism.probe`) of every gradient, per step, and of
    the final masters: a lower bound of the whole tensors' (their exact equality is the checksums')."""
    return {"grad_probe_max_abs_diff": [determinism.probe_max_abs_diff(r, o)
                                        for r, o in zip(ref["grads"], other["grads"])],
            "master_probe_max_abs_diff": determinism.probe_max_abs_diff(ref["masters"], other["masters"])}


def compare_with_reference(arms: list[dict[str, Any]], probes: dict[str, dict[str, Any]] | None = None) -> None:
    """Add ``parity_vs_A`` to every finished arm: losses, gradient and final master checksums equal to A's,
    and (given the arms' probes) the max abs differences over the probes."""
    ref = next((a for a in arms if a["arm"] == "A" and a["status"] == "ok"), None)
    for row in arms:
        if row["status"] == "ok" and ref is not None:
            row["parity_vs_A"] = parity(ref, row)
            if probes is not None:
                row["parity_vs_A"].update(probe_parity(probes["A"], probes[row["arm"]]))


CHECKS = (  # (name, key of parity_vs_A): the per-step lists are reduced to their maximum
    ("loss", "loss_abs_diff"),
    ("gradients (probe)", "grad_probe_max_abs_diff"),
    ("grad norm", "grad_norm_abs_diff"),
    ("masters after the last step (probe)", "master_probe_max_abs_diff"),
)


def determinism_summary(arms: list[dict[str, Any]], repeat: dict[str, Any]) -> dict[str, Any]:
    """``metrics["determinism"]``: every arm's max abs differences from A next to A's from its repeat."""
    def worst(row: dict[str, Any] | None, key: str) -> float | None:
        value = (row or {}).get("parity_vs_A", {}).get(key)
        return determinism.max_or_none(value if isinstance(value, list) else [value])

    checks = [determinism.check(f"{a['arm']} {name}", worst(a, key), worst(repeat, key))
              for a in arms if a["arm"] != "A" for name, key in CHECKS]
    ops = {a["label"]: a["nondeterministic_op"] for a in [*arms, repeat] if a.get("nondeterministic_op")}
    settings = next((a["determinism"] for a in arms if a.get("determinism")), None)
    return determinism.summary(checks, settings, ops)


def rerun_noise_table(metrics: dict[str, Any], rerun: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """Each arm's difference from A next to A's difference from a repeat of itself (same inputs, new process).

    Where the baseline is not bit-reproducible (GPU kernels with atomic accumulation), this is the
    yardstick for an arm's difference from A; on deterministic kernels every entry is exactly 0. The
    repeat is this run's own (``metrics["baseline_repeat"]``) unless ``rerun`` (the metrics of a separate
    run of arm A, for results recorded before runs repeated A themselves) is given.
    """
    ref = next((a for a in metrics["arms"] if a["arm"] == "A" and a["status"] == "ok"), None)
    source = rerun["arms"] if rerun is not None else [metrics.get("baseline_repeat") or {}]
    repeat = next((a for a in source if a.get("arm") == "A" and a.get("status") == "ok"), None)
    if ref is None or repeat is None:
        return []  # nothing to compare: no finished arm A, or no finished repeat of it
    rows = [{"arm": "A repeated", **parity(ref, repeat)}]
    rows += [{"arm": a["arm"], **a["parity_vs_A"]} for a in metrics["arms"] if a["arm"] != "A" and "parity_vs_A" in a]
    return rows


def noise_findings(rows: list[dict[str, Any]]) -> str:
    """Prose for :func:`rerun_noise_table` rows: each arm's largest differences next to A's repeat."""
    def worst(row, key):
        return max(row[key])

    repeat = rows[0]
    parts = [f"A against a repeat of itself: losses differ by up to {worst(repeat, 'loss_abs_diff'):.3g}, "
             f"up to {worst(repeat, 'grads_differing')} flat-parameter gradients differ, grad-norm by up to "
             f"{worst(repeat, 'grad_norm_abs_diff'):.3g}."]
    parts += [f"{r['arm']} against A: losses up to {worst(r, 'loss_abs_diff'):.3g}, up to {worst(r, 'grads_differing')} "
              f"gradients, grad-norm up to {worst(r, 'grad_norm_abs_diff'):.3g}." for r in rows[1:]]
    if not repeat["bit_exact"]:
        parts.append("The baseline does not reproduce itself bit for bit on this device, so bit-exactness cannot be "
                     "shown here; the arms' differences are to be read against the repeat's.")
    return " ".join(parts)


def _mean_after_first(values: list[float]) -> float:
    """Mean over steps 2..N: step 1 pays one-off costs (lazy init, first allocations, pinning)."""
    rest = values[1:] or values
    return sum(rest) / len(rest)


def summarize(arms: list[dict[str, Any]]) -> dict[str, Any]:
    ok = {a["arm"]: a for a in arms if a["status"] == "ok"}
    per_arm = {}
    for name, a in ok.items():
        per_arm[name] = {
            "peak_device_gib": max(s["peak_device_gib"] for s in a["steps"]),
            "step_seconds": _mean_after_first([s["step_seconds"] for s in a["steps"]]),
            "fwd_bwd_seconds": _mean_after_first([s["fwd_bwd_seconds"] for s in a["steps"]]),
            "optimizer_seconds": _mean_after_first([s["optimizer_seconds"] for s in a["steps"]]),
            "casts_per_step": a["steps"][-1]["casts"]["casts"],
            "bytes_read_per_step": a["steps"][-1]["casts"]["bytes_read"],
            "host_to_device_bytes_per_step": a["steps"][-1]["casts"]["host_to_device_bytes"],
            "num_flat_params": a["num_flat_params"],
            "resident_max_abs_diff": [s["resident_max_abs_diff"] for s in a["steps"]],
            "bit_exact_vs_A": a.get("parity_vs_A", {}).get("bit_exact"),
        }
    out: dict[str, Any] = {"status": {a["arm"]: a["status"] for a in arms}, "per_arm": per_arm}
    out["all_bit_exact_vs_A"] = all(v["bit_exact_vs_A"] for v in per_arm.values()) if per_arm else None
    resident = [d for v in per_arm.values() for d in v["resident_max_abs_diff"] if d is not None]
    out["resident_copy_fresh"] = all(d == 0.0 for d in resident) if resident else None
    if "A" in per_arm and "D" in per_arm:
        a, d = per_arm["A"], per_arm["D"]
        saving = a["peak_device_gib"] - d["peak_device_gib"]
        ratio = d["step_seconds"] / a["step_seconds"]
        out["D_vs_A"] = {
            "peak_saving_gib": saving,
            "step_time_ratio": ratio,
            "casts_per_step_equals_flat_params": d["casts_per_step"] == d["num_flat_params"],
            "targets": {"peak_saving_gib_min": TARGET_PEAK_SAVING_GIB, "step_time_ratio_max": TARGET_STEP_TIME_RATIO},
            "peak_target_met": saving >= TARGET_PEAK_SAVING_GIB,
            "time_target_met": ratio <= TARGET_STEP_TIME_RATIO,
        }
    return out


# ---------------------------------------------------------------------------------------- notebook views
def arms_table(metrics: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per arm: peak GiB, seconds, casts and bytes per step, parity with A."""
    from rlkit.measure.samplers import GIB

    rows = []
    per_arm = metrics["summary"]["per_arm"]
    for a in metrics["arms"]:
        row: dict[str, Any] = {"arm": a["label"], "status": a["status"]}
        s = per_arm.get(a["arm"])
        if s is not None:
            row.update({
                "peak_device_gib": s["peak_device_gib"],
                "step_s": s["step_seconds"],
                "fwd_bwd_s": s["fwd_bwd_seconds"],
                "optimizer_s": s["optimizer_seconds"],
                "casts_per_step": s["casts_per_step"],
                "flat_params": s["num_flat_params"],
                "fp32_read_gib_per_step": s["bytes_read_per_step"] / GIB,
                "h2d_gib_per_step": s["host_to_device_bytes_per_step"] / GIB,
                "resident_diff_steps": s["resident_max_abs_diff"],
                "bit_exact_vs_A": s["bit_exact_vs_A"],
            })
        rows.append(row)
    return rows


def steps_table(metrics: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per arm and step: loss, casts, resident-copy check and equality with arm A."""
    rows = []
    for a in metrics["arms"]:
        if a["status"] != "ok":
            continue
        parity = a.get("parity_vs_A", {})
        for i, s in enumerate(a["steps"]):
            rows.append({
                "arm": a["arm"], "step": s["step"], "loss": s["loss"], "casts": s["casts"]["casts"],
                "h2d_casts": s["casts"]["host_to_device_casts"],
                "resident_vs_master_max_abs": s["resident_max_abs_diff"],
                "resident_copies_after_step": s["resident_copies_after_step"],
                "loss_equal_A": parity.get("loss_equal", [None] * len(a["steps"]))[i],
                "grads_equal_A": parity.get("grads_equal", [None] * len(a["steps"]))[i],
                "peak_device_gib": s["peak_device_gib"], "step_s": s["step_seconds"],
            })
    return rows


def findings(metrics: dict[str, Any]) -> str:
    """The notebook's closing prose, every number read from ``metrics``."""
    from rlkit.measure.samplers import GIB

    s = metrics["summary"]
    per_arm = s["per_arm"]
    lines = [f"Arms: {s['status']}."]
    for name, row in per_arm.items():
        lines.append(
            f"{ARMS[name]['label']}: peak {row['peak_device_gib']:.2f} GiB, step {row['step_seconds']:.3f} s "
            f"(fwd/bwd {row['fwd_bwd_seconds']:.3f} s + optimizer {row['optimizer_seconds']:.3f} s), "
            f"{row['casts_per_step']} casts/step for {row['num_flat_params']} flat parameters, "
            f"{row['bytes_read_per_step'] / GIB:.2f} GiB of fp32 read/step "
            f"({row['host_to_device_bytes_per_step'] / GIB:.2f} GiB from the host).")
    lines.append(f"Loss, gradients and updated masters bit-identical to arm A in every arm: {s['all_bit_exact_vs_A']}.")
    if s["resident_copy_fresh"] is not None:
        lines.append("max |resident bf16 - bf16(current master)| after forward/backward, per step: "
                     + "; ".join(f"{k}: {v['resident_max_abs_diff']}" for k, v in per_arm.items()
                                 if any(d is not None for d in v["resident_max_abs_diff"]))
                     + f" (all 0.0: {s['resident_copy_fresh']}).")
    d = s.get("D_vs_A")
    if d is not None:
        lines.append(
            f"D vs A: peak {d['peak_saving_gib']:+.2f} GiB saved (target >= {d['targets']['peak_saving_gib_min']} GiB: "
            f"{'met' if d['peak_target_met'] else 'not met'}), step time x{d['step_time_ratio']:.3f} "
            f"(target <= x{d['targets']['step_time_ratio_max']}: {'met' if d['time_target_met'] else 'not met'}), "
            f"casts/step = flat parameters: {d['casts_per_step_equals_flat_params']}.")
    if metrics["config"]["device"] == "cpu" or all(r["peak_device_gib"] == 0.0 for r in per_arm.values()):
        lines.append("This run had no GPU: host and device are the same memory, so memory and time differences "
                     "are not meaningful here; the parity and cast counts are.")
    return "\n".join(lines)


def describe(metrics: dict[str, Any]) -> str:
    """The notebook's findings in plain sentences: the arms (:func:`findings`), each against A next to A's repeat, and
    the determinism checks, every number read from ``metrics``."""
    from rlkit.experiments.prose import device_label, plain
    from rlkit.measure.determinism import findings as determinism_findings

    cfg = metrics["config"]
    lines = [device_label(cfg["device"], model=cfg["model"]),
             (f"Compared: arms {'; '.join(ARMS[a]['label'] for a in cfg['arms'])}, over {cfg['steps']} steps of "
              f"{cfg['num_sequences']} sequences x {cfg['seq_len']} tokens; parity means bit-identical to arm A "
              "(tolerance 0).")]
    lines += findings(metrics).splitlines()
    noise = rerun_noise_table(metrics)
    lines.append(noise_findings(noise) if noise else ("No finished repeat of arm A in these metrics to read the arms against (a separate "
                                              "repeat, the notebook's noise_dir, is not part of them)."))
    lines.append(plain(determinism_findings(metrics)))
    return "\n".join(lines)


def arms_figure(metrics: dict[str, Any]):
    """Plotly: peak device GiB and step seconds per arm, side by side."""
    from plotly.subplots import make_subplots

    per_arm = metrics["summary"]["per_arm"]
    names = [a["label"] for a in metrics["arms"] if a["arm"] in per_arm]
    keys = [a["arm"] for a in metrics["arms"] if a["arm"] in per_arm]
    fig = make_subplots(rows=1, cols=2, subplot_titles=("peak device memory (GiB)", "step time (s, steps 2..N)"))
    fig.add_bar(x=names, y=[per_arm[k]["peak_device_gib"] for k in keys], row=1, col=1, showlegend=False)
    fig.add_bar(x=names, y=[per_arm[k]["fwd_bwd_seconds"] for k in keys], name="fwd/bwd", row=1, col=2)
    fig.add_bar(x=names, y=[per_arm[k]["optimizer_seconds"] for k in keys], name="optimizer", row=1, col=2)
    fig.update_layout(barmode="stack", height=380)
    return fig


if __name__ == "__main__":
    from rlkit.experiments import experiment_main

    sys.exit(experiment_main(Config, run, NOTEBOOK, notebook_only=("results_dir", "noise_dir")))
