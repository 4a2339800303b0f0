"""Readers of device session 33's committed files for tests/test_claims.py: notebook 07's two runs from c1c1f3c on an
H100, stopped when the machine was taken back. Each returns values as the docs write them, or a bool for a status."""
from __future__ import annotations

import re
from datetime import datetime
from functools import cache

from _claim_sources import _json, _source_text, _verl_steps, _yaml

from rlkit.core.env import REPO_ROOT

S33 = "outputs/_node/session33"
S33_README = f"{S33}/README.md"
STOPPED = f"{S33}/learning-stopped"
ARM1, FAST = "1-fixes-hostadamw.r1", "5-fastest.r1"
COMMIT33 = "c1c1f3c7dbcab5c2c7b08782e2c14a9fcaf24c04"


@cache
def steps(run: str) -> list[dict]:
    """A stopped run's per-step records."""
    return _verl_steps(f"{STOPPED}/{run}")


def _planned_steps() -> int:
    return _yaml(f"{STOPPED}/experiment-params.yaml")["steps"]


def ran_on_an_h100_at_c1c1f3c() -> bool:
    """Both runs' env: commit c1c1f3c on one H100, and neither log holds a Python error."""
    for run in (ARM1, FAST):
        env = _json(f"{STOPPED}/{run}/env.json")
        log = _source_text(f"{STOPPED}/{run}/verl.log")
        if env["git_sha"] != COMMIT33 or [g["name"] for g in env["gpus"]] != ["NVIDIA H100 80GB HBM3"]:
            return False
        if "Traceback" in log or "Error:" in log:
            return False
    return True


def taken_back_and_not_finished() -> bool:
    """The record says the machine was taken back, and neither run reached the experiment's 30 steps."""
    text = _source_text(S33_README)
    return ("taken back for other work" in text and "too little device time was left" in text
            and all(len(steps(run)) < _planned_steps() for run in (ARM1, FAST)) and ran_on_an_h100_at_c1c1f3c())


def _seconds_after_first(run: str) -> tuple[int, int]:
    later = [row["timing_s/step"] for row in steps(run)[1:]]
    return round(min(later)), round(max(later))


def step_words() -> tuple[str, ...]:
    """How many steps each run finished, and each one's step time after its first."""
    (a_lo, a_hi), (f_lo, f_hi) = _seconds_after_first(ARM1), _seconds_after_first(FAST)
    return (f"arm 1 had finished {len(steps(ARM1))} steps and the fastest variant {len(steps(FAST))}",
            f"arm 1 took {a_lo}-{a_hi} s a step and the variant {f_lo}-{f_hi} s")


def arm1_phase_words() -> tuple[str, ...]:
    """Arm 1's last finished step split into its two largest phases, and the variant's update in the same step (whose
    old_log_prob is the skip's few hundredths of a second)."""
    last = steps(ARM1)[-1]
    fast = next(row for row in steps(FAST) if row["step"] == last["step"])
    if fast["timing_s/old_log_prob"] >= 0.5:
        return ("<the variant computed old_log_prob>",)
    return (f"its step {last['step']} took {last['timing_s/step']:.1f} s",
            f"old_log_prob {last['timing_s/old_log_prob']:.1f} s and update_actor {last['timing_s/update_actor']:.1f} s",
            f"its update took {fast['timing_s/update_actor']:.1f} s in the same step")


def _clock(text: str, pattern: str) -> datetime:
    return datetime.strptime(re.search(pattern, text).group(1), "%H:%M:%S")


def arm1_run_minutes() -> str:
    """An arm-1 run's minutes from the driver's start, estimated from this lease: the driver's start to the last pack
    (by which 3 steps had ended), then the remaining steps at arm 1's mean step time after its first."""
    started = _clock(_source_text(f"{S33}/session-progress.txt"), r"^(\d\d:\d\d:\d\d) learning/learning start")
    packed = _clock(_source_text(S33_README), r"At the last pack \(about (\d\d:\d\d:\d\d)\)")
    done = steps(ARM1)
    mean = sum(row["timing_s/step"] for row in done[1:]) / len(done[1:])
    return f"{round(((packed - started).total_seconds() + (_planned_steps() - len(done)) * mean) / 60)}"


INSTRUMENT = "rlkit/old_log_prob/"
# notebook 07's arm-1 runs on its small model: session 33's stopped one, and those that finished from session 34 on
NOTEBOOK07_ARM1 = (f"{STOPPED}/{ARM1}/", "outputs/07_does_it_learn/h200-fast-runs/1-fixes-hostadamw.r",
                   "outputs/_node/session34/learning-partial-metrics.json")  # that arm-1 run's steps, in the experiment's record


@cache
def carrying_the_instrument() -> frozenset[str]:
    """Every committed file under outputs/ with the old_log_prob memory instrument's metrics (one scan, which several
    claims ask about)."""
    return frozenset(p.relative_to(REPO_ROOT).as_posix() for p in (REPO_ROOT / "outputs").rglob("*")
                     if p.suffix in (".json", ".jsonl", ".log") and p.is_file()
                     and INSTRUMENT in p.read_text(errors="replace"))


def instrument_ran_only_in_notebook_07() -> bool:
    """The instrument's metrics are in notebook 07's arm-1 runs on its small model and in no other committed file
    (the variant, which skips the pass, has none; nor has any seed-workload run), session 33's stopped run among them."""
    carrying = carrying_the_instrument()
    return (any(path.startswith(NOTEBOOK07_ARM1[0]) for path in carrying)
            and all(path.startswith(NOTEBOOK07_ARM1) for path in carrying))


def peak_range(rows: list[dict]) -> str:
    """The range of the pass's peak allocated over a run's steps, as the docs write it."""
    peaks = [row[f"actor/{INSTRUMENT}max_allocated_gib"] for row in rows]
    return f"{min(peaks):.2f}-{max(peaks):.2f} GiB"


def instrument_peak_words() -> tuple[str, ...]:
    """The range of the pass's peak allocated over session 33's arm-1 steps, as the docs write it."""
    if not instrument_ran_only_in_notebook_07():
        return ("<the instrument's metrics are not notebook 07's arm 1's alone>",)
    return (f"peak allocated was {peak_range(steps(ARM1))} a step",)
