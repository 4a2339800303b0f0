"""The decode roofline against what it must agree with: roofline.decode_bound's bytes, the expected longest response,
a step-by-step simulation of random lengths and acceptances, and the limits of speculation."""
import math
import random

import pytest

from rlkit.models.lengths import response_length_pmf
from rlkit.models.shape import resolve_model
from rlkit.planning import roofline
from rlkit.planning.decode_roofline import NO_SPECULATION, Speculation, decode_roofline

SHAPE = resolve_model("qwen3-4b")
H200 = {"hbm_bytes_per_s": 4.8e12, "peak_flops": 989.4e12}


def _bound(pmf, sequences=16, prompt=100.0, speculation=NO_SPECULATION, **machine):
    return decode_roofline(SHAPE, sequences=sequences, prompt_tokens=prompt, response_pmf=pmf,
                           speculation=speculation, **{**H200, **machine})


@pytest.mark.parametrize("mean, cap, sequences", [(300, 1024, 16), (1400, 4096, 256), (50, 64, 1)])
def test_without_speculation_and_free_arithmetic_it_is_decode_bound(mean, cap, sequences):
    """decode_bound sums the bytes in closed form (E[r], E[r^2], E[max]); the roofline walks the steps."""
    pmf = response_length_pmf(mean, cap)
    walked = _bound(pmf, sequences, peak_flops=math.inf)
    closed = roofline.decode_bound(SHAPE, sequences=sequences, prompt_tokens=100.0, response_pmf=pmf,
                                   hbm_bytes_per_s=H200["hbm_bytes_per_s"])
    assert walked["limit_s"] == pytest.approx(closed["limit_s"], rel=1e-9)
    assert walked["weight_bytes"] == pytest.approx(closed["weight_bytes"], rel=1e-9)
    assert walked["kv_bytes"] == pytest.approx(closed["kv_bytes"], rel=1e-9)
    assert walked["steps"] == pytest.approx(roofline.expected_max(pmf, sequences) - 1, rel=1e-9)
    assert walked["compute_bound_share"] == 0.0


def _simulate(pmf, sequences, prompt, speculation, rng):
    """One draw: random lengths, random acceptances, each verify step's weight and KV bytes and FLOPs counted."""
    lengths = rng.choices(list(pmf), weights=list(pmf.values()), k=sequences)
    left, cached = [r - 1 for r in lengths], [prompt + 1.0] * sequences
    weights = kv = flops = 0.0
    while any(n > 0 for n in left):
        weights += roofline.linear_params(SHAPE) * 2
        for s in (s for s in range(sequences) if left[s] > 0):
            kv += cached[s] * roofline.kv_bytes_per_token(SHAPE, 2)
            flops += speculation.positions_per_step * (2.0 * roofline.linear_params(SHAPE)
                                                        + 4.0 * SHAPE.layers * SHAPE.q_dim * cached[s])
            kept = next((j for j in range(speculation.draft_tokens) if rng.random() >= speculation.acceptance),
                        speculation.draft_tokens)
            advance = min(kept + 1, left[s])
            left[s] -= advance
            cached[s] += advance
    return weights, kv, flops


@pytest.mark.parametrize("speculation, tolerance", [(NO_SPECULATION, 0.02), (Speculation(2, 0.7), 0.06),
                                                    (Speculation(4, 0.9), 0.06)])
def test_expected_bytes_and_flops_match_a_simulation(speculation, tolerance):
    """The roofline's expectation (each sequence advancing E tokens a step) against the mean of simulated runs; with
    speculation it rounds each sequence's random step count to its mean, hence the wider tolerance."""
    pmf, rng, draws = response_length_pmf(40, 96), random.Random(0), 300
    sims = [_simulate(pmf, 8, 20.0, speculation, rng) for _ in range(draws)]
    walked = _bound(pmf, 8, 20.0, speculation)
    for i, key in enumerate(("weight_bytes", "kv_bytes", "flops")):
        assert walked[key] == pytest.approx(sum(s[i] for s in sims) / draws, rel=tolerance), key


def test_speculation_that_accepts_nothing_costs_arithmetic_and_saves_nothing():
    pmf = response_length_pmf(300, 1024)
    plain, rejected = _bound(pmf), _bound(pmf, speculation=Speculation(3, 0.0))
    assert rejected["tokens_per_step"] == 1.0
    assert rejected["weight_bytes"] == plain["weight_bytes"] and rejected["kv_bytes"] == plain["kv_bytes"]
    assert rejected["flops"] == pytest.approx(4 * plain["flops"])
    assert rejected["limit_s"] >= plain["limit_s"]


def test_perfect_acceptance_reads_once_per_k_plus_one_tokens():
    pmf = {201: 1.0}  # 200 decode tokens each
    plain, perfect = _bound(pmf, 4), _bound(pmf, 4, speculation=Speculation(4, 1.0))
    assert perfect["tokens_per_step"] == 5.0
    assert perfect["steps"] == pytest.approx(40.0) and plain["steps"] == pytest.approx(200.0)
    assert perfect["weight_bytes"] == pytest.approx(plain["weight_bytes"] / 5)


def test_a_bandwidth_bound_decode_turns_compute_bound_when_the_peak_is_low():
    pmf = response_length_pmf(300, 1024)
    assert _bound(pmf, 256)["compute_bound_share"] < 1.0
    slow = _bound(pmf, 256, peak_flops=1e12)
    assert slow["compute_bound_share"] == pytest.approx(1.0) and slow["limit_s"] == pytest.approx(slow["compute_s"])


@pytest.mark.parametrize("k, a", [(-1, 0.5), (2, 1.5), (2, -0.1)])
def test_speculation_refuses_impossible_settings(k, a):
    with pytest.raises(ValueError, match="draft_tokens"):
        Speculation(k, a)
