"""Update-phase harness: parameter validation, and an end-to-end tiny run (FSDP1 NO_SHARD on gloo,
fresh processes, torchrun for the 2-rank rank-0-owner arm)."""
from __future__ import annotations

import pytest

from rlkit.core import params as P
from rlkit.core.results import load_profile
from rlkit.experiments import update_phase as U


def tiny(**overrides):
    values = load_profile(U.NOTEBOOK, "tiny")
    values.update(overrides)
    return P.build(U.Config, values)


@pytest.mark.parametrize("profile", ["tiny", "h200"])
def test_profiles_validate(profile):
    values = load_profile(U.NOTEBOOK, profile)
    assert P.as_dict(P.build(U.Config, values)) == values  # every key known, every value kept as given


@pytest.mark.parametrize("overrides, key", [
    ({"arms": ["host_pinned_rank0"]}, "host_pinned_rank0@2"),
    ({"arms": ["adam_on_gpu"]}, "unknown arm"),
    ({"arms": ["host_pinned@x"]}, "bad rank count"),
    ({"num_sequences": 7}, "num_sequences"),
    ({"host_impl": "cuda"}, "host_impl"),
    ({"memory_cap_gib": -1}, "memory_cap_gib"),
])
def test_bad_parameters_name_the_key(overrides, key):
    with pytest.raises(P.ParamError, match=key):
        tiny(**overrides)


def test_parse_arm():
    assert U.parse_arm("host_pinned") == ("host_pinned", 1)
    assert U.parse_arm("host_pinned_rank0@2") == ("host_pinned_rank0", 2)


def test_make_minibatch_splits_one_batch_across_ranks():
    whole = U.make_minibatch(100, 8, 5, seed=3)
    halves = [U.make_minibatch(100, 8, 5, rank=r, world_size=2, seed=3) for r in (0, 1)]
    assert whole.shape == (8, 5)
    assert (halves[0] == whole[:4]).all() and (halves[1] == whole[4:]).all()


def test_tiny_run_end_to_end():
    cfg = tiny(arms=["gpu_adamw", "host_pinned", "host_pinned_rank0@2"], bench_adam_numel=200_000,
               bench_repeats=1)
    metrics = U.run(cfg)
    assert set(metrics) >= {"config", "arms", "bench_copy", "bench_adam", "summary"}
    arms = {a["arm"]: a for a in metrics["arms"]}
    assert all(a["status"] == "ok" for a in arms.values()), {k: a.get("error") for k, a in arms.items()}
    # HostAdamW on the same values is bit-exact to torch AdamW with the matching kernel
    for name in ("host_pinned", "host_pinned_rank0@2"):
        assert arms[name]["parity"]["host_reference"]["max_abs_diff"] == 0.0
        assert arms[name]["parity"]["ok"]
        assert {"grad_d2h", "host_step", "param_pack", "param_h2d"} <= set(arms[name]["phases"])
    assert arms["gpu_adamw"]["parity"]["device_reference"]["max_abs_diff"] == 0.0
    assert "gpu_step" in arms["gpu_adamw"]["phases"]
    owner = arms["host_pinned_rank0@2"]
    assert owner["cross_rank_identical"] is True
    assert "broadcast" in owner["phases"]
    rank0, rank1 = sorted(owner["per_rank"], key=lambda r: r["rank"])
    assert rank1["adam_state_bytes"] == 0 and rank1["master_bytes"] == 0
    assert rank0["adam_state_bytes"] == arms["host_pinned"]["per_rank"][0]["adam_state_bytes"] > 0
    assert metrics["summary"]["parity_ok"] is True
    assert metrics["bench_adam"]["numel"] == 200_000
    rows = U.arms_table(metrics)
    assert [r["arm"] for r in rows] == list(cfg.arms)
