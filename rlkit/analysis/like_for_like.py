"""Whether two runs of notebook 05 may be compared for a target (issue 41), one rule for every report block.

A target is judged ("met" / "not met") only on a like-for-like pair:

- one lease (:func:`launch_window`: both launches inside one device machine's 30-minute hold), the same GPU (a run's
  ``gpu``, from its env.json, where the caller read it), the same rlkit commit, the same profile (the workload's shape: :data:`PROFILE_FIELDS`), the same lr, the same
  tokens per micro-batch and the same attention path (:data:`SETTING_FIELDS`), apart from the fields the comparison
  is about (``varies``: a padded variant differs from its base in its attention path by design); or
- for a step-1 comparison only, the two runs saw the same sampled tokens at step 1: step 1's rollout comes before
  any update, so neither lr nor commit enters it, and the same token count and response mean are the evidence that
  prompts, model and lengths were the same (vLLM's sampling is not bit-reproducible across launches, so runs that
  sampled slightly differently are not taken as the same).

Any other pair is "not like for like", with what differs, and :func:`judge` never calls it met.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# The recipe fields that make a profile's workload: model, data, lengths, batch, GPUs, card and number of steps.
PROFILE_FIELDS = ("model", "model_seed", "response_length_mean", "data", "data_rows", "reward", "max_prompt_length",
                  "max_response_length", "train_batch_size", "rollout_n", "ppo_mini_batch_size", "ppo_epochs", "n_gpus",
                  "emulate_gpu_gib", "gpu_memory_utilization", "steps")
# The settings issue 41 names beside commit and profile: lr, tokens per micro-batch and the attention path.
SETTING_FIELDS = ("lr", "ppo_max_token_len_per_gpu", "attn_implementation", "use_remove_padding")
# The attention path as one switch, for ``varies``.
ATTENTION_PATH = ("attn_implementation", "use_remove_padding")


# A device machine is held at most 30 minutes (the device service's rule, docs/offline-node.md): two launches further
# apart than that came from two leases.
LEASE_S = 1800.0


def launch_window(metrics: dict[str, Any]) -> tuple[float, float] | None:
    """(start, end) of a launch on the node's clock, in seconds since the epoch: from the first plugin record (the
    earliest verl process) to that plus the launcher's wall time, or the last record if later; None where the run
    recorded no timed plugin records."""
    launch = metrics.get("launch") or {}
    times = [r["time"] for r in launch.get("plugin_records") or [] if r.get("time")]
    if not times:
        return None
    start = min(times)
    return start, max(max(times), start + (launch.get("wall_s") or 0.0))


def lease_difference(a: dict[str, Any], b: dict[str, Any]) -> str | None:
    """Why two runs cannot be from one lease, or None where both launches fit in one 30-minute hold."""
    wa, wb = launch_window(a), launch_window(b)
    if wa is None or wb is None:
        return "no launch times recorded, so one lease is not shown"
    span = max(wa[1], wb[1]) - min(wa[0], wb[0])
    return None if span <= LEASE_S else f"not one lease (the launches span {span / 60:.0f} min, a lease at most {LEASE_S / 60:.0f})"


@dataclass(frozen=True)
class Pairing:
    """Whether two runs compare like for like, and on what grounds (or what differs)."""

    like: bool
    basis: str


def _step1(metrics: dict[str, Any]) -> dict[str, Any] | None:
    from rlkit.verl.logs import training_steps

    first = training_steps(metrics.get("steps", []))[:1]
    return first[0] if first else None


def same_step1_sample(a: dict[str, Any], b: dict[str, Any]) -> int | None:
    """The token count both runs processed at step 1 when it and the response mean are the same, else None."""
    first_a, first_b = _step1(a), _step1(b)
    if first_a is None or first_b is None:
        return None
    keys = ("perf/total_num_tokens", "response_length/mean")
    if any(first_a.get(k) is None or first_a.get(k) != first_b.get(k) for k in keys):
        return None
    return int(first_a["perf/total_num_tokens"])


def differences(a: dict[str, Any], b: dict[str, Any], commit_a: str, commit_b: str,
                varies: tuple[str, ...] = ()) -> list[str]:
    """What differs between two runs among lease, GPU, commit, profile and settings, less the fields in ``varies``."""
    out = [f"commit {commit_a} against {commit_b}"] if commit_a != commit_b or commit_a in ("", "-") else []
    if a.get("gpu") != b.get("gpu"):
        out.append(f"GPU {a.get('gpu')!r} against {b.get('gpu')!r}")
    if (lease := lease_difference(a, b)) is not None:
        out.append(lease)
    ra, rb = a["recipe"], b["recipe"]
    for key in (*PROFILE_FIELDS, *SETTING_FIELDS):
        if key not in varies and ra.get(key) != rb.get(key):
            out.append(f"{key} {ra.get(key)!r} against {rb.get(key)!r}")
    return out


def pair(a: dict[str, Any], b: dict[str, Any], commit_a: str, commit_b: str, *, varies: tuple[str, ...] = (),
         step1: bool = False) -> Pairing:
    """Whether runs ``a`` and ``b`` (metrics.json) compare like for like; ``step1`` admits the same-sample route."""
    differ = differences(a, b, commit_a, commit_b, varies)
    if not differ:
        return Pairing(True, f"like for like: one lease, the same commit ({commit_a}), profile and settings"
                             + (f" apart from {', '.join(varies)}" if varies else ""))
    # The same sample on another GPU still times another machine: the step-1 route needs the same GPU.
    tokens = same_step1_sample(a, b) if step1 and a.get("gpu") == b.get("gpu") else None
    if tokens is not None:
        return Pairing(True, f"like for like at step 1: the same sampled tokens ({tokens:,}) and response mean, though "
                             f"{'; '.join(differ)}")
    return Pairing(False, f"not like for like: {'; '.join(differ)}")


def judge(pairing: Pairing, met: bool) -> str:
    """A target's verdict: "met" or "not met" for a like-for-like pair, "not judged" for any other (the line that
    shows it gives the pairing's basis, which says what differs)."""
    if not pairing.like:
        return "not judged"
    return "met" if met else "not met"
