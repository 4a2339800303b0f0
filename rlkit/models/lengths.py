"""A synthetic length model for random-init checkpoints: responses that end on EOS after a geometric number of tokens.

A random-init model almost never samples its EOS id (probability ~1/vocab per token), so every rollout runs to
``max_response_length`` and every micro-batch is full. The seed's workload has responses of varying length.
This module gives a random model a per-token EOS probability ``p = 1/mean_tokens`` that hardly depends on the
context, so a response's length is (close to) geometric with mean ``mean_tokens``, capped by the rollout's
``max_response_length``: see :func:`expected_response_tokens`. **It is a synthetic length model**: nothing is
learned, the lengths say nothing about a real model's, and the tokens are still noise.

Architecture and parameter count are unchanged (no bias, no extra tensor); it writes values into two places:

1. Column ``k`` (:data:`COORDINATE`) of the token embedding: every row gets the same constant ``c``, the EOS
   row gets 0. (With tied embeddings, Qwen3-4B and the ``tiny`` preset, this is also the lm_head; an untied
   lm_head gets the same column.) Each layer writes outputs whose size is set by its RMS-normalised input,
   so the rest of the residual stream keeps the norm ``r`` it has in the plain random model, while its
   coordinate ``k`` starts at ``c``. With ``c = DOMINANCE x r`` (``r`` measured, largest over positions),
   coordinate ``k`` holds > 99 % of the final residual's norm at every position, so after the final RMSNorm
   ``h_k ~ g_k x sqrt(hidden)`` is the same for every context (to < 1 %).
2. ``g_k``, the final RMSNorm's weight at ``k``. Every non-EOS logit then carries ``c x h_k``, the EOS logit
   ``0 x h_k``; the rest of each logit is the random model's (small: the other coordinates shrank by
   ``~1/DOMINANCE``). A negative ``g_k`` lowers every other logit by the same ``a = -c x h_k``, which is the
   EOS log-odds knob: ``p ~ 1/(1 + (V-1) exp(-a))``. ``g_k`` is found by bisection so that the mean EOS
   probability over random contexts equals ``1/mean_tokens``, with the checkpoint's own dtype and
   numerics (the network runs once; only the final norm and lm_head are re-evaluated per step).

Why these choices, not an extra ``delta`` on the EOS row on top of a constant shared by all rows: in bf16 the
EOS entry ``c + delta`` is rounded by up to ``c x 2^-9``, and that error times ``h_k`` lands on the EOS logit
alone; with ``c`` large enough to dominate the residual it is a large share of the log-odds. Here the EOS entry
is exactly 0, the shared ``c`` is the same bf16 number in every row (it cancels in the softmax), and the one
calibrated number, ``g_k``, carries the log-odds ``a`` with relative error 2^-9 (``a x 2^-9``, about 1 % on
``p``; the closer of the two bf16 values that bracket the target is kept). The EOS logit itself sits near 0,
where bf16 logits are finest.

Side effects, stated: the layers see an input whose RMS-normalised direction is mostly ``e_k``, so their outputs
depend little on the context, and the sampled tokens are near-uniform over the vocabulary. The compute (every
matrix, every FLOP) is the plain model's. An EOS token inside a prompt (the chat template's ``<|im_end|>``)
has coordinate ``k`` = 0, like a plain random embedding. Training (GRPO updates) can move the lengths.
"""
from __future__ import annotations

import math
from typing import Any

COORDINATE = 0  # the hidden coordinate that carries the length model
DOMINANCE = 10.0  # c / (largest norm of the final residual's other coordinates)
CALIBRATION_CONTEXTS = (16, 128)  # random contexts x tokens the calibration forward runs on


def eos_probability(mean_tokens: int) -> float:
    """The per-token EOS probability of a geometric length with this mean (the EOS token counted)."""
    return 1.0 / mean_tokens


def expected_response_tokens(mean_tokens: int, max_response_length: int) -> float:
    """What verl's ``response_length/mean`` should read: ``E[min(L, R)]`` for ``L ~ Geometric(1/mean_tokens)``
    on 1, 2, ... (the EOS token counted, as in verl's response mask) and the rollout's cap ``R``:
    ``(1 - (1 - p)^R) / p``. ``mean_tokens`` 0 (the length model off) gives ``R``."""
    if not mean_tokens:
        return float(max_response_length)
    p = eos_probability(mean_tokens)
    return (1.0 - (1.0 - p) ** max_response_length) / p


def response_length_pmf(mean_tokens: int, max_response_length: int) -> dict[int, float]:
    """The length model's response lengths as a distribution: ``{length: probability}`` of ``min(L, R)`` for
    ``L ~ Geometric(1/mean_tokens)`` on 1, 2, ... and the cap ``R``; its mean is :func:`expected_response_tokens`.
    ``mean_tokens`` 0 (off: a random model never samples EOS) puts every response at ``R``."""
    if not mean_tokens:
        return {max_response_length: 1.0}
    p = eos_probability(mean_tokens)
    pmf = {k: p * (1.0 - p) ** (k - 1) for k in range(1, max_response_length)}
    pmf[max_response_length] = (1.0 - p) ** (max_response_length - 1)  # every response still running at the cap
    return pmf


def sample_response_lengths(mean_tokens: int, max_response_length: int, n: int, *, seed: int = 0) -> list[int]:
    """``n`` response lengths the way the length model makes them, without a model: geometric on 1, 2, ... with
    per-token EOS probability ``1/mean_tokens`` (the EOS token counted), capped at ``max_response_length``; their
    expectation is :func:`expected_response_tokens`. ``mean_tokens`` 0 (off) gives ``max_response_length`` each.
    Pure Python (``random.Random(seed)``): for workloads that need the lengths, not the tokens."""
    import random

    if isinstance(mean_tokens, bool) or not isinstance(mean_tokens, int) or mean_tokens < 0 or mean_tokens == 1:
        raise ValueError(f"mean_tokens={mean_tokens!r}: must be 0 (off) or an integer >= 2")
    if max_response_length < 1:
        raise ValueError(f"max_response_length={max_response_length}: must be >= 1")
    if not mean_tokens:
        return [max_response_length] * n
    log_q = math.log1p(-eos_probability(mean_tokens))
    rng = random.Random(seed)
    # P(L > k) = (1 - p)^k: L = floor(ln u / ln(1 - p)) + 1 for u uniform on (0, 1]
    return [min(int(math.log(1.0 - rng.random()) / log_q) + 1, max_response_length) for _ in range(n)]


def validate_mean(mean_tokens: int, vocab_size: int) -> None:
    if isinstance(mean_tokens, bool) or not isinstance(mean_tokens, int) or mean_tokens < 0:
        raise ValueError(f"response_length_mean={mean_tokens!r}: must be an integer >= 0 (0 = off)")
    if mean_tokens and not 2 <= mean_tokens < vocab_size:
        raise ValueError(f"response_length_mean={mean_tokens}: must be 0 (off) or in [2, vocab_size={vocab_size}): "
                         f"a random model already ends with probability ~1/vocab_size per token")


def _final_residual(model, ids):
    """The input of the final RMSNorm (the last residual stream) over ``ids``, as [positions, hidden]."""
    import torch

    captured = {}
    hook = model.model.norm.register_forward_pre_hook(lambda mod, args: captured.__setitem__("x", args[0].detach()))
    try:
        with torch.no_grad():
            model(input_ids=ids)
    finally:
        hook.remove()
    return captured["x"].reshape(-1, captured["x"].shape[-1])


def _solve_norm_weight(p_eos, target: float, guess: float) -> float:
    """The final-norm weight ``gamma`` at which ``p_eos(gamma)``'s mean is closest to ``target``: a bracket
    grown from ``4 x guess`` outwards, then bisection."""
    lo, hi = 4.0 * guess, 0.0  # p_eos falls as gamma rises towards 0
    for _ in range(30):
        if p_eos(lo).mean().item() >= target:
            break
        lo *= 2.0
    else:
        raise RuntimeError(f"length model: no final-norm weight reaches an EOS probability of {target} (last {lo})")
    for _ in range(50):
        mid = 0.5 * (lo + hi)
        if p_eos(mid).mean().item() > target:
            lo = mid
        else:
            hi = mid
    # the stored dtype is discrete: keep whichever end of the bracket lands closer to the target
    ends = sorted((abs(p_eos(g).mean().item() - target), g) for g in (lo, hi))
    return ends[0][1]


def apply_length_model(model, mean_tokens: int, *, seed: int = 0) -> dict[str, Any]:
    """Give ``model`` (a random-init Qwen2/Qwen3 causal LM, in place) the per-token EOS probability ``1/mean_tokens``.

    Returns the calibration record stored in the checkpoint's marker (coordinate, constants, dominance, and the
    EOS probability reached over the calibration contexts: mean, min, max).
    """
    import torch

    config = model.config
    validate_mean(mean_tokens, config.vocab_size)
    eos, vocab, hidden, k = config.eos_token_id, config.vocab_size, config.hidden_size, COORDINATE
    emb = model.get_input_embeddings().weight
    out = model.get_output_embeddings().weight
    norm_weight = model.model.norm.weight
    n_ctx, n_tok = CALIBRATION_CONTEXTS
    gen = torch.Generator().manual_seed(seed + 1)
    ids = torch.randint(0, vocab - 1, (n_ctx, n_tok), generator=gen)
    ids = (ids + (ids >= eos).long()).to(emb.device)  # uniform over the non-EOS ids

    rest = _final_residual(model, ids).float().norm(dim=-1).max().item()  # the plain model: r, all positions
    c = DOMINANCE * rest
    with torch.no_grad():
        for weight in {id(emb): emb, id(out): out}.values():  # once when tied
            weight[:, k] = c
            weight[eos, k] = 0.0
    c_stored = float(emb.detach()[1 if eos == 0 else 0, k])  # the bf16 value every non-EOS row holds
    x = _final_residual(model, ids)
    xf = x.float()
    dominance = (xf[:, k].abs() / xf.norm(dim=-1)).min().item()

    def p_eos(gamma: float):
        with torch.no_grad():
            norm_weight[k] = gamma
            logits = model.lm_head(model.model.norm(x)).float()
            return logits.softmax(-1)[:, eos]

    target = eos_probability(mean_tokens)
    # log-odds a = ln((V-1) p / (1-p)) if the other logits were equal; h_k ~ g_k sqrt(hidden)
    guess = -math.log((vocab - 1) * target / (1 - target)) / (c_stored * math.sqrt(hidden))
    p = p_eos(_solve_norm_weight(p_eos, target, guess))
    record = {
        "response_length_mean": mean_tokens, "coordinate": k, "dominance_factor": DOMINANCE,
        "embedding_constant": c_stored, "final_norm_weight": float(norm_weight.detach()[k]),
        "residual_norm_plain": rest, "coordinate_share_min": dominance,
        "calibration_contexts": list(CALIBRATION_CONTEXTS), "calibration_seed": seed + 1,
        "eos_probability": {"target": target, "mean": p.mean().item(), "min": p.min().item(), "max": p.max().item()},
    }
    if dominance < 0.99:
        raise RuntimeError(f"length model: coordinate {k} holds only {dominance:.3f} of the final residual's norm "
                           f"somewhere (want > 0.99); the EOS probability would depend on the context: {record}")
    return record
