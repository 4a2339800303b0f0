"""Decoding step by step against both limits, FLOP/s and HBM bandwidth, with and without speculative decoding.

:func:`rlkit.planning.roofline.decode_bound` bounds gen by bandwidth alone. At a GRPO batch the first decode steps
run hundreds of sequences at once and may be bound by arithmetic instead, while the long tail of a few running
sequences re-reads every weight for little work. :func:`decode_roofline` walks the decode steps of one wave of
sequences that start together (as one vLLM replica runs a GRPO batch of at most ``max_num_seqs``) and charges each
step the larger of its bytes over the bandwidth and its FLOPs over the peak. Pure arithmetic; no torch import.

Speculative decoding (:class:`Speculation`): a drafter proposes ``draft_tokens`` tokens, the model scores them and
one more in a single verify step, and rejection sampling keeps each draft token with chance ``acceptance`` given
the ones before it (Leviathan et al. 2023, "Fast Inference from Transformers via Speculative Decoding"), which
leaves the sampled distribution unchanged. A verify step then advances a sequence by (1 - a^(k+1)) / (1 - a)
tokens in expectation, reads the weights and the sequence's KV cache once, and computes k + 1 positions. The
drafter itself is not charged, so this is the bound for a free drafter (prompt lookup on the host, say); a draft
model adds its own reads. A random-init model accepts nothing, which is why this is arithmetic and not a run.
"""
from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from rlkit.models.shape import ModelShape
from rlkit.planning.roofline import kv_bytes_per_token, linear_params


@dataclass(frozen=True)
class Speculation:
    """``draft_tokens`` proposed per verify step, each kept with chance ``acceptance`` given the ones before."""

    draft_tokens: int
    acceptance: float

    def __post_init__(self):
        if self.draft_tokens < 0 or not 0.0 <= self.acceptance <= 1.0:
            raise ValueError(f"draft_tokens={self.draft_tokens}, acceptance={self.acceptance}: draft_tokens must be "
                             ">= 0 and acceptance in [0, 1]")

    @property
    def positions_per_step(self) -> int:
        """Positions the model computes per running sequence in one verify step: the drafts and one more."""
        return self.draft_tokens + 1

    @property
    def tokens_per_step(self) -> float:
        """Expected tokens a verify step adds to a sequence: the accepted drafts and the one sampled after them."""
        a, k = self.acceptance, self.draft_tokens
        return float(k + 1) if a == 1.0 else (1.0 - a ** (k + 1)) / (1.0 - a)


NO_SPECULATION = Speculation(draft_tokens=0, acceptance=0.0)


def _survival(pmf: Mapping[int, float]) -> list[float]:
    """P(r - 1 > d) for d = 0, 1, ...: the chance a response still has a decode token after d of them."""
    out, left = [], 1.0 - pmf.get(1, 0.0)
    for r in range(2, max(pmf) + 1):
        out.append(max(left, 0.0))
        left -= pmf.get(r, 0.0)
    return out


def _step_costs(shape: ModelShape, i: int, running: float, any_running: float, prompt_tokens: float,
                spec: Speculation, dtype_bytes: int) -> tuple[float, float, float]:
    """(weight bytes, KV bytes, FLOPs) of verify step ``i``: the weights read once if any sequence runs, each running
    sequence's KV cache at its context, and k + 1 positions of every weight and of attention over that context each."""
    context = prompt_tokens + 1 + i * spec.tokens_per_step  # tokens in a running sequence's cache at step i
    per_position = 2.0 * linear_params(shape) + 4.0 * shape.layers * shape.q_dim * context
    return (any_running * linear_params(shape) * dtype_bytes,
            running * context * kv_bytes_per_token(shape, dtype_bytes), running * spec.positions_per_step * per_position)


def decode_roofline(shape: ModelShape, *, sequences: int, prompt_tokens: float, response_pmf: Mapping[int, float],
                    hbm_bytes_per_s: float, peak_flops: float, dtype_bytes: int = 2,
                    speculation: Speculation = NO_SPECULATION) -> dict[str, Any]:
    """The least time one engine can take to decode ``sequences`` responses of lengths ``response_pmf``
    ({tokens: probability}) that start together, each step at the larger of its bandwidth and compute times.

    A response of r tokens has r - 1 decode tokens (prefill samples the first) and takes (r - 1) / E verify steps,
    E = ``speculation.tokens_per_step`` (1 without it); at step i, ``sequences`` x P((r - 1) / E > i) are running,
    each with prompt + 1 + i E tokens cached, and the weights are read if any is: with probability
    1 - P((r - 1) / E <= i)^sequences. Without speculation the bytes equal :func:`roofline.decode_bound`'s. Prefill,
    sampling, scheduling and the drafter are not counted: a lower bound."""
    if sequences < 1:
        raise ValueError(f"sequences={sequences}: decode at least one sequence")
    survival, per_step = _survival(response_pmf), speculation.tokens_per_step
    totals = {"weight_bytes": 0.0, "kv_bytes": 0.0, "flops": 0.0, "bandwidth_s": 0.0, "compute_s": 0.0, "limit_s": 0.0,
              "compute_bound_s": 0.0, "steps": 0.0}
    for i in range(math.ceil(len(survival) / per_step)):
        alive = survival[math.floor(i * per_step)]  # P(d > i E) = P(d > floor(i E)) for whole d
        any_running = 1.0 - (1.0 - alive) ** sequences
        weights, kv, flops = _step_costs(shape, i, sequences * alive, any_running, prompt_tokens, speculation, dtype_bytes)
        bandwidth_s, compute_s = (weights + kv) / hbm_bytes_per_s, flops / peak_flops
        totals["weight_bytes"] += weights
        totals["kv_bytes"] += kv
        totals["flops"] += flops
        totals["bandwidth_s"] += bandwidth_s
        totals["compute_s"] += compute_s
        totals["limit_s"] += max(bandwidth_s, compute_s)
        totals["compute_bound_s"] += compute_s if compute_s > bandwidth_s else 0.0
        totals["steps"] += any_running
    return {"basis": "each decode step at max(bytes / HBM bandwidth, FLOPs / peak bf16 FLOP/s)",
            "draft_tokens": speculation.draft_tokens, "acceptance": speculation.acceptance,
            "tokens_per_step": per_step, **totals,
            "compute_bound_share": totals["compute_bound_s"] / totals["limit_s"] if totals["limit_s"] else 0.0}


VLLM_BLOCK_TOKENS = 16  # vLLM's default KV-cache block size (CacheConfig block_size on CUDA); it allocates whole blocks


def kv_demand(*, sequences: int, prompt_tokens: float, response_pmf: Mapping[int, float],
              block_tokens: int = VLLM_BLOCK_TOKENS, sigmas: float = 4.0) -> dict[str, Any]:
    """The KV-cache tokens one wave of ``sequences`` responses (lengths ``response_pmf``) holds while it decodes: at the
    step where the expected holding plus ``sigmas`` standard deviations is largest, that step, the expected holding,
    its standard deviation and the sum (``upper``).

    At decode step i a running sequence holds its prompt + 1 + i tokens, rounded up to whole blocks of
    ``block_tokens`` (h_i tokens); a finished one has freed its blocks. It still runs with chance s_i
    (:func:`_survival`), and the sequences are independent: the batch holds n h_i s_i tokens in expectation with
    variance n h_i^2 s_i (1 - s_i). ``prompt_tokens`` is the batch's mean prompt, each sequence's own prompt blocks are
    counted, and the prefix cache's sharing of a group's prompt is ignored, so this is an upper bound on the demand."""
    if sequences < 1 or block_tokens < 1:
        raise ValueError(f"sequences={sequences}, block_tokens={block_tokens}: both must be >= 1")
    peak = {"step": 0, "mean_tokens": 0.0, "sigma_tokens": 0.0, "upper_tokens": 0.0}
    for i, running in enumerate(_survival(response_pmf)):
        held = math.ceil((prompt_tokens + 1 + i) / block_tokens) * block_tokens
        mean, sigma = sequences * held * running, held * math.sqrt(sequences * running * (1.0 - running))
        if mean + sigmas * sigma > peak["upper_tokens"]:
            peak = {"step": i, "mean_tokens": mean, "sigma_tokens": sigma, "upper_tokens": mean + sigmas * sigma}
    return {"basis": f"expected KV tokens held plus {sigmas:g} sigma, each running sequence in whole "
                     f"{block_tokens}-token blocks, no prefix sharing (an upper bound)",
            "sequences": sequences, "block_tokens": block_tokens, "sigmas": sigmas, **peak}
