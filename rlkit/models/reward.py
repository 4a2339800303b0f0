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
- ``target_chars``: a task a random-init model can learn within tens of GRPO steps (notebook 07). Each
  prompt names a small target set of characters, ``TARGET_SIZE`` of ``TARGET_ALPHABET`` (a-z, 0-9); the
  score is the fraction of the response's non-whitespace characters, case-folded, that are in the set:
  in [0, 1], 0 for an empty response. The set is carried in the row's ``extra_info["target_chars"]``
  and derived deterministically from the prompt by :func:`target_set_of` (the prompt's most used
  characters of the alphabet), so any DAPO row, synthetic or real, becomes a row of this task
  (:func:`rlkit.models.data.target_rows` adds the set to ``extra_info`` and a line naming it to the prompt).
  For a DAPO prompt the set hardly varies from row to row (the shared instruction dominates the counts:
  ``eort`` or ``eost`` for the synthetic rows), so a random model can raise its score by shifting which tokens it
  samples, and a real model can read the set in its prompt.

  Why characters, not tokens or words: verl hands the function the decoded text only
  (``tokenizer.decode(response_ids, skip_special_tokens=True)``), and re-encoding that text does not give
  back the sampled ids (byte-level BPE merges differently, special tokens are gone); words need whitespace,
  which a random-init model hardly ever samples, so nearly every response would score 0 and give a group
  no advantage. Characters of the decoded text are the same under any tokenizer (the offline BPE of a
  random-init preset or a real Qwen3's), and at random init every response already has a few of them, with
  a spread within each group: advantages and gradients are non-zero from step 1.
"""
from __future__ import annotations

import hashlib
from collections import Counter
from typing import Any

REWARDS = ("synthetic_hash", "dapo_math", "target_chars")
# verl loads the custom function from this module path (``pkg://`` = import by module name).
MODULE_PATH = "pkg://rlkit.models.reward"


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


TARGET_ALPHABET = "abcdefghijklmnopqrstuvwxyz0123456789"
TARGET_SIZE = 4
TARGET_KEY = "target_chars"  # the extra_info key that carries a row's target set


def target_set_of(prompt_text: str, size: int = TARGET_SIZE) -> str:
    """The ``size`` characters of :data:`TARGET_ALPHABET` that ``prompt_text`` (case-folded) uses most, ties
    broken by alphabet order, returned in alphabet order: a deterministic function of the text."""
    if not 1 <= size <= len(TARGET_ALPHABET):
        raise ValueError(f"target set size {size} must be in [1, {len(TARGET_ALPHABET)}]")
    counts = Counter(c for c in prompt_text.casefold() if c in TARGET_ALPHABET)
    ranked = sorted(TARGET_ALPHABET, key=lambda c: (-counts[c], TARGET_ALPHABET.index(c)))[:size]
    return "".join(sorted(ranked, key=TARGET_ALPHABET.index))


def target_instruction(targets: str) -> str:
    """The line a prompt of the target task starts with, naming its set."""
    return (f"Write your response using only the characters {', '.join(targets[:-1])} and {targets[-1]}: the score is "
            "the share of its non-space characters that are one of them.\n\n")


def target_fraction(text: str, targets: str) -> float:
    """The share of ``text``'s non-whitespace characters (case-folded) that are in ``targets``; 0.0 when it has none."""
    chars = [c for c in text.casefold() if not c.isspace()]
    return sum(c in targets for c in chars) / len(chars) if chars else 0.0


def row_targets(extra_info: dict[str, Any] | None) -> str:
    """The target set a row carries; a row without one raises (its prompt names no set to aim for)."""
    targets = (extra_info or {}).get(TARGET_KEY)
    if not isinstance(targets, str) or not targets:
        raise ValueError(f"the row carries no extra_info[{TARGET_KEY!r}] (got extra_info keys "
                         f"{sorted(extra_info or {})}). Fix: prepare the data with rlkit.models.data.target_rows (the recipe "
                         "does for reward: target_chars), which derives the set from the prompt and names it there")
    return targets


def target_chars(data_source, solution_str, ground_truth, extra_info=None, **kwargs) -> dict:
    """verl custom reward: the share of the response's characters in the row's target set (module docstring)."""
    return {"score": target_fraction(solution_str, row_targets(extra_info))}


def verl_overrides(reward: str) -> list[str]:
    """Hydra overrides selecting ``reward`` in verl 0.9.1."""
    if reward not in REWARDS:
        raise ValueError(f"reward={reward!r} is not one of {list(REWARDS)}")
    if reward == "dapo_math":
        return []  # default_compute_score -> math_dapo for data_source=math_dapo
    return [f"reward.custom_reward_function.path={MODULE_PATH}", f"reward.custom_reward_function.name={reward}"]
