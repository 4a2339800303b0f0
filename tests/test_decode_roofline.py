"""The decode roofline against what it must agree with: roofline.decode_bound's bytes, the expected longest response,
a step-by-step simulation of random lengths and acceptances, and the limits of speculation; the KV-cache demand of a
wave against a hand count and a simulation of random lengths."""
import math
import random
import statistics

import pytest

from rlkit.models.lengths import response_length_pmf
from rlkit.models.shape import resolve_model
from rlkit.planning import roofline
from rlkit.planning.decode_roofline import NO_SPECULATION, Speculation, decode_roofline, kv_demand

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


def test_kv_demand_by_hand():
    """Prompt 14, 16-token blocks, two sequences of 2 or 4 decode tokens (3 or 5 tokens) with chance 1/2 each. Steps
    0..3 hold 15, 16, 17, 18 tokens, 16, 16, 32, 32 in blocks; steps 2 and 3 run with chance 1/2: 2 x 32 x 1/2 = 32
    tokens expected, variance 2 x 32^2 x 1/4 = 512. Steps 0 and 1 hold 32 tokens surely; step 2 comes first of the
    largest."""
    d = kv_demand(sequences=2, prompt_tokens=14.0, response_pmf={3: 0.5, 5: 0.5})
    assert (d["step"], d["mean_tokens"], d["sigma_tokens"]) == (2, 32.0, pytest.approx(math.sqrt(512)))
    assert d["upper_tokens"] == pytest.approx(32.0 + 4 * math.sqrt(512))
    sure = kv_demand(sequences=3, prompt_tokens=0.0, response_pmf={33: 1.0})  # 32 decode steps: step 16 first holds 2 blocks
    assert (sure["step"], sure["mean_tokens"], sure["sigma_tokens"], sure["upper_tokens"]) == (16, 3 * 32.0, 0.0, 96.0)


def _simulated_holding(pmf, sequences, prompt, draws, rng, block=16):
    """Per decode step, the mean and standard deviation over ``draws`` of the tokens a wave holds: each sequence of
    random length r holds its prompt + 1 + i tokens in whole blocks while i < r - 1, nothing after."""
    steps = max(pmf) - 1
    totals = [[0.0] * draws for _ in range(steps)]
    for d in range(draws):
        for r in rng.choices(list(pmf), weights=list(pmf.values()), k=sequences):
            for i in range(r - 1):
                totals[i][d] += math.ceil((prompt + 1 + i) / block) * block
    return [statistics.fmean(t) for t in totals], [statistics.pstdev(t) for t in totals]


def test_kv_demand_matches_a_simulation_of_random_lengths():
    """4,000 seeded draws of 8 sequences. Tolerances, from the draws' own noise: the simulated mean of a step lies
    within 4 of its standard errors (sigma / sqrt(4000)); the simulated sigma within 6% where 10% to 90% of the
    sequences run (there the sum's excess kurtosis is at most 0.64, so the sample sigma's relative standard error is
    at most sqrt(2.64 / 4000) / 2 = 1.3%: 6% is over 4 of them); the simulated peak of mean + 4 sigma, and of the mean
    alone, within 3% (the first's error is about the mean's standard error plus 4 of the sigma's: at this peak, where
    sigma is a sixth of mean + 4 sigma, some 1% of it; the second's is smaller)."""
    pmf, sequences, prompt, draws = response_length_pmf(40, 96), 8, 20.0, 4000
    mean, sigma = _simulated_holding(pmf, sequences, prompt, draws, random.Random(0))
    d = kv_demand(sequences=sequences, prompt_tokens=prompt, response_pmf=pmf)
    step = d["step"]
    assert abs(mean[step] - d["mean_tokens"]) <= 4 * d["sigma_tokens"] / math.sqrt(draws)
    assert sigma[step] == pytest.approx(d["sigma_tokens"], rel=0.06)
    assert max(m + 4 * s for m, s in zip(mean, sigma)) == pytest.approx(d["upper_tokens"], rel=0.03)
    of_the_mean = kv_demand(sequences=sequences, prompt_tokens=prompt, response_pmf=pmf, sigmas=0.0)
    assert of_the_mean["mean_tokens"] == pytest.approx(max(mean), rel=0.03)


def test_kv_demand_refuses_an_empty_wave():
    with pytest.raises(ValueError, match="sequences"):
        kv_demand(sequences=0, prompt_tokens=10.0, response_pmf={5: 1.0})
