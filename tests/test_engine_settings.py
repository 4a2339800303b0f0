"""rlkit.experiments.engine_settings on a committed run: the engine settings it reads from the run's verl.log, each
row's arithmetic against its inputs, and clear errors for parameters it cannot take."""
import math

import pytest
from conftest import committed_run

from rlkit.core import params as P
from rlkit.core.results import OUTPUTS_DIR
from rlkit.experiments import engine_settings as E
from rlkit.experiments._committed_decode import RUNS_OF


def _cfg(**overrides):
    return P.build(E.Config, {**E.PROFILES["h200-seed"], **overrides}, where="test")


@pytest.fixture(scope="module")
def metrics():
    committed_run(OUTPUTS_DIR / RUNS_OF / E.PROFILES["h200-seed"]["run"])
    return E.run(_cfg())


def test_the_engine_settings_are_the_ones_vllm_was_started_with(metrics):
    """verl 0.9.1's rollout defaults as the run's verl.log shows them, and the KV pool vLLM reported."""
    assert metrics["engine"] == {"gpu_memory_utilization": 0.85, "max_num_seqs": 256, "enable_chunked_prefill": True,
                                 "max_num_batched_tokens": 8192, "enable_prefix_caching": True,
                                 "kv_cache_tokens": 230_944}
    assert [r["setting"] for r in metrics["settings"]] == ["gpu_memory_utilization", "max_num_seqs",
                                                           "enable_chunked_prefill", "enable_prefix_caching"]
    assert metrics["lengths"].startswith("synthetic")  # a random-init model's lengths: the rows must say so


def test_no_setting_adds_concurrency_to_the_seed_wave(metrics):
    pool, seqs = metrics["settings"][:2]
    demand = pool["demand"]
    assert demand["upper_tokens"] == pytest.approx(demand["mean_tokens"] + 4 * demand["sigma_tokens"])
    assert demand["upper_tokens"] < pool["pool_tokens"] and not pool["sequences_may_wait"]
    assert seqs["sequences"] == seqs["run_value"] == metrics["sequences"] and not seqs["sequences_may_wait"]


def test_the_prefill_rows_are_its_linear_flops_at_the_peak_and_seven_eighths_of_them(metrics):
    from rlkit.models.shape import resolve_model
    from rlkit.planning.roofline import linear_params, peak_bf16_flops

    chunked, cached = metrics["settings"][2:]
    tokens = metrics["sequences"] * metrics["prompt_tokens"]
    compute_s = 2 * linear_params(resolve_model(metrics["model"])) * tokens / peak_bf16_flops(metrics["gpu"])[0]
    assert chunked["prefill_tokens"] == tokens and chunked["prefill_chunks"] == math.ceil(tokens / 8192)
    assert chunked["prefill_bound_s"] == pytest.approx(compute_s)  # compute-bound: its 3 weight reads take less
    assert chunked["prefill_weight_reads_s"] < compute_s
    assert chunked["share_of_gen"] == pytest.approx(compute_s / metrics["measured_gen_s"])
    assert cached["cached_prefill_s"] == pytest.approx(compute_s * 7 / 8) and cached["rollout_n"] == 8


def test_the_decode_bound_is_the_speculative_bounds_without_speculation(metrics):
    """The same run through rlkit.experiments.speculative_bound: the same decode, the same bound."""
    from rlkit.experiments import speculative_bound as SB

    plain = SB.run(P.build(SB.Config, SB.PROFILES["h200-seed"], where="test"))["no_speculation"]
    assert metrics["decode_bound"]["limit_s"] == pytest.approx(plain["limit_s"])
    assert metrics["measured_gen_s"] > metrics["decode_bound"]["limit_s"]


def test_a_pool_below_the_demand_says_sequences_may_wait():
    demand = {"upper_tokens": 1000.0}
    row = E._kv_pool_row({"gpu_memory_utilization": 0.5, "kv_cache_tokens": 999}, demand)
    assert row["sequences_may_wait"] and "larger pool could" in row["says"]
    assert E._max_num_seqs_row({"max_num_seqs": 128}, 256)["sequences_may_wait"]


@pytest.mark.parametrize("overrides, key", [({"run": "no-such-run"}, "run="), ({"sigmas": -1}, "sigmas="),
                                            ({"margin": 3}, "margin")])
def test_bad_parameters_name_the_key(overrides, key):
    with pytest.raises(P.ParamError, match=key):
        _cfg(**overrides)


def test_the_command_line_writes_a_results_folder(tmp_path):
    committed_run(OUTPUTS_DIR / RUNS_OF / E.PROFILES["tiny"]["run"])
    assert E.main(["--tiny", "--out", str(tmp_path)]) == 0
    folder = tmp_path / E.NOTEBOOK / "tiny"
    assert {p.name for p in folder.iterdir()} >= {"params.yaml", "env.json", "metrics.json"}
    assert E.main(["--tiny", "--out", str(tmp_path), "-p", "sigmas=-2"]) == 2
