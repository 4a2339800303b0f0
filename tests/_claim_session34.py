"""Readers of device session 34's committed files for tests/test_claims.py: notebook 07's first pair at lr 5e-4 (one
run of each side) and an update profile without levers beside one with the compiled kernels, all from 78bfa72 on one
H100. Each returns values as the docs write them, or a bool for a status."""
from __future__ import annotations

from functools import cache

from _claim_session33 import _clock, peak_range
from _claim_sources import PROFILES, _json, _profile, _source_text, _verl_steps, _wall, _yaml

from rlkit.recipes.grpo import ARMS

S34 = "outputs/_node/session34"
RUNS = "outputs/07_does_it_learn/h200-fast-runs"
ARM1, FAST = "1-fixes-hostadamw.r1", "5-fastest.r1"
PARTIAL = f"{S34}/learning-partial-metrics.json"
BASE, COMPILED = "h100-base.session34", "h100-compiled.session34"  # under outputs/update_profile/
COMMIT34 = "78bfa728bcf83d8762d13631621b1a56abf3e3eb"
H100 = ["NVIDIA H100 80GB HBM3"]


@cache
def steps(run: str) -> list[dict]:
    """A run's per-step records."""
    return _verl_steps(f"{RUNS}/{run}")


def ran_on_an_h100_at_78bfa72() -> bool:
    """The two runs and the two profiles: commit 78bfa72 on one H100; neither run's log holds a Python error."""
    envs = [f"{RUNS}/{ARM1}/env.json", f"{RUNS}/{FAST}/env.json", *(f"{PROFILES}/{p}/env.json" for p in (BASE, COMPILED))]
    # up to the last step's record: the Ray session's teardown after it kills the DataLoader's workers, as in every run
    logs = [_source_text(f"{RUNS}/{run}/verl.log").rpartition(f"step:{len(steps(run))} ")[0] for run in (ARM1, FAST)]
    return (all(_json(e)["git_sha"] == COMMIT34 and [g["name"] for g in _json(e)["gpus"]] == H100 for e in envs)
            and all(log and "Traceback" not in log and "Error:" not in log for log in logs))


def _per_run() -> dict[str, dict]:
    """The experiment's own analysis of this invocation, which it marks incomplete (two of its four planned runs), where
    its window is the five steps the docs name."""
    m = _json(PARTIAL)
    if m["complete"] or sorted(m["pending"]) != ["1-fixes-hostadamw.r2", "5-fastest.r2"] or m["config"]["window"] != 5:
        return {}
    return m["analysis"]["per_run"]


def pair_words() -> tuple[str, ...]:
    """Both runs trained every planned step and learned; each one's mean reward over its first and last windows."""
    runs, planned = _per_run(), _json(PARTIAL)["config"]["steps"]
    if not runs or not all(r["learned"] and r["steps_trained"] == len(steps(n)) == planned for n, r in runs.items()):
        return ("<a run did not train its planned steps or did not learn>",)
    a, f = runs[ARM1], runs[FAST]
    return (f"arm 1 from {a['reward_first']:.3f} to {a['reward_last']:.3f}",
            f"the fastest variant from {f['reward_first']:.3f} to {f['reward_last']:.3f}",
            f"differ by {f['reward_last'] - a['reward_last']:.2f}")


def collapse_words() -> tuple[str, ...]:
    """The step at which each run's entropy collapsed, as the analysis finds it."""
    runs = _per_run()
    return (f"at step {runs[ARM1]['entropy_collapsed_at']} and {runs[FAST]['entropy_collapsed_at']}",) if runs else ("<no analysis>",)


def _mean_after_first(run: str, key: str) -> float:
    later = [row[key] for row in steps(run)[1:]]
    return sum(later) / len(later)


def step_time_words() -> tuple[str, ...]:
    """Each run's mean step and update_actor after its first step, the two sharing the card."""
    a, f = (_mean_after_first(r, "timing_s/step") for r in (ARM1, FAST))
    au, fu = (_mean_after_first(r, "timing_s/update_actor") for r in (ARM1, FAST))
    return (f"arm 1 took {a:.1f} s a step and the variant {f:.1f} s",
            f"update_actor {au:.1f} s against {fu:.1f} s")


def lr_words(profile: dict) -> str:
    """The profile's learning rate as the docs write it (5e-4)."""
    mantissa, _, exponent = f"{profile['lr']:.0e}".partition("e")
    return f"{mantissa}e{int(exponent)}"


def profile_words(profile: dict) -> tuple[str, ...] | bool:
    """What notebook 07's h200 profile compares: arm 1 against arm 5 with the fastest variant's levers, repeats a side."""
    levers = {"host_overlap_copies": True, "rmsnorm": "compiled", "pointwise": "compiled", "logits": "chunked",
              "replay_poll_s": 0.2}
    if profile["baseline_arm"] != "1-fixes-hostadamw" or profile["compare_arm"] != "5-master-on-host-cast-once" \
            or any(profile["compare_overrides"].get(k) != v for k, v in levers.items()):
        return False
    return (f"compares arm 1 with {profile['compare_name']}",
            f"{'two' if profile['repeats'] == profile['compare_repeats'] == 2 else '<not two>'} runs each")


def instrument_words() -> tuple[str, ...]:
    """The old_log_prob memory instrument's peak allocated over session 34's arm-1 steps."""
    return (f"{peak_range(steps(ARM1))} again",)


def profile_pair_words() -> tuple[str, ...]:
    """The compiled kernels' update against the one without levers of the same commit and lease."""
    (base_s, base_mfu), (comp_s, comp_mfu) = ((_wall(p), _profile(p)["flops"]["mfu_timed"]) for p in (BASE, COMPILED))
    return (f"from {base_s:.2f} s to {comp_s:.2f} s", f"({comp_s / base_s - 1:+.0%})",
            f"{base_mfu:.0%} to {comp_mfu:.0%} MFU")


def compiled_tests_words() -> tuple[str, ...]:
    """The compiled patches' GPU tests after the profile: pytest's last line."""
    last = _source_text(f"{S34}/profile-compiled-gpu-tests.log").strip().splitlines()[-1]
    return (last.strip("= ").split(" in ")[0].replace(", 1 warning", ""),)


def job_minutes() -> int:
    """The learning job's minutes from the driver's start to its exit (the driver's progress file)."""
    text = _source_text(f"{S34}/learning-session-progress.txt")
    start, end = (_clock(text, rf"(\d\d:\d\d:\d\d) learning/learning {w}") for w in ("start", "exit 0"))
    return round((end - start).total_seconds() / 60)


def per_token_words() -> tuple[str, ...]:
    """Arm 1's mean old_log_prob after its first step, its tokens a step, and the time a token (the variant's update
    beside it), where arm 1 ran verl's full logits and the variant the chunked log-probs."""
    arm1, fast = (_json(f"{RUNS}/{run}/metrics.json")["recipe"] for run in (ARM1, FAST))
    if (arm1["logits"], fast["logits"]) != ("full", "chunked"):
        return ("<the runs' logits are not full and chunked>",)
    seconds, tokens = (_mean_after_first(ARM1, k) for k in ("timing_s/old_log_prob", "perf/total_num_tokens"))
    return (f"took {seconds:.1f} s a step for about {round(tokens, -3):,.0f} tokens",
            f"some {seconds / tokens * 1e6:.0f} us a token",
            f"its whole update took {_mean_after_first(FAST, 'timing_s/update_actor'):.1f} s")


def seed_arms_chunked() -> bool:
    """The seed profile's logits are chunked and no arm sets its own."""
    return (_yaml("nbs/params/05_grpo_qwen3_4b.h200-seed.yaml")["logits"] == "chunked"
            and not any("logits" in fields for fields in ARMS.values()))
