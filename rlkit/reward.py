"""Rewards for the GRPO recipe, in verl's ``custom_reward_function`` signature.

- ``dapo_math``: verl's own DAPO scoring (``verl.utils.reward_score.math_dapo.compute_score``, +1 for
  a correct ``Answer:`` line, -1 otherwise), what ``default_compute_score`` does for
  ``data_source="math_dapo"``. The recipe selects it by leaving ``custom_reward_function`` unset.
- ``synthetic_hash``: for runs with random-init weights. Such a model never answers correctly, so
  DAPO scoring gives -1 everywhere, every group advantage is 0 and every gradient is 0 (measured on
  the GPU node): a run would time nothing but no-ops. This reward is a deterministic function of the
  decoded response text only: the first 8 bytes of BLAKE2b(response) read as an unsigned integer
  ``u`` give ``2 * u / 2**64 - 1`` in [-1, 1). Different responses in a group get different rewards,
  so advantages and gradients are non-zero, and the same text always gets the same reward in every
  process (Python's ``hash`` is salted per process; BLAKE2b is not). It measures nothing about
  correctness; runs record which reward they used.
"""
from __future__ import annotations

import hashlib

REWARDS = ("synthetic_hash", "dapo_math")
# verl loads the custom function from this module path (``pkg://`` = import by module name).
MODULE_PATH = "pkg://rlkit.reward"


def hash_reward(text: str) -> float:
    """BLAKE2b(text) mapped to [-1, 1)."""
    digest = hashlib.blake2b(text.encode("utf-8"), digest_size=8).digest()
    return 2.0 * int.from_bytes(digest, "big") / 2**64 - 1.0


def synthetic_hash(data_source, solution_str, ground_truth, extra_info=None, **kwargs) -> dict:
    """verl custom reward: the response-text hash reward (see module docstring)."""
    return {"score": hash_reward(solution_str)}


def dapo_math(data_source, solution_str, ground_truth, extra_info=None, **kwargs) -> dict:
    """verl's DAPO math score (what verl uses without a custom function for ``math_dapo`` rows)."""
    from verl.utils.reward_score import math_dapo

    return math_dapo.compute_score(solution_str, ground_truth)


def verl_overrides(reward: str) -> list[str]:
    """Hydra overrides selecting ``reward`` in verl 0.9.1."""
    if reward not in REWARDS:
        raise ValueError(f"reward={reward!r} is not one of {list(REWARDS)}")
    if reward == "dapo_math":
        return []  # default_compute_score -> math_dapo for data_source=math_dapo
    return [f"reward.custom_reward_function.path={MODULE_PATH}", f"reward.custom_reward_function.name={reward}"]
