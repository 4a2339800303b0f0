"""rlkit.experiments.time_budget (notebook 08): committed runs held against their limits, and what it says of them."""
from __future__ import annotations

import pytest

from rlkit.core import params as P
from rlkit.experiments import time_budget as T


@pytest.mark.parametrize("values,key", [({"min_steps": 1}, "min_steps"), ({"min_steps": True}, "min_steps"),
                                        ({"prefix": 3}, "prefix"), ({"steps": 2}, "steps")])
def test_bad_parameters_name_the_key(values, key):
    with pytest.raises(P.ParamError, match=key):
        P.build(T.Config, {**P.as_dict(T.Config()), **values}, where="test")


def test_the_largest_gap_is_the_phase_furthest_above_its_limit():
    row = {"gen_s": 40.0, "gen_limit_s": 38.0, "update_actor_s": 30.0, "update_actor_limit_s": 10.0,
           "optimizer_step_s": None, "optimizer_step_limit_s": 0.5, "old_log_prob_s": 0.1, "old_log_prob_limit_s": None}
    assert T.largest_gap(row) == ("update_actor", 20.0)
    assert T.largest_gap({"gen_s": None}) is None


def test_no_run_is_said_plainly():
    text = T.describe({"config": {"prefix": "nowhere-", "min_steps": 2}, "rows": [], "source": "x"})
    assert "No committed run" in text and "'nowhere-'" in text


def test_the_findings_name_each_run_and_its_largest_gap():
    metrics = T.run(T.Config())
    text = T.describe(metrics)
    for row in metrics["rows"]:
        phase, seconds = T.largest_gap(row)
        assert f"- {row['arm']} ({row['gpu']}, {row['commit']})" in text
        assert f"the most time above a limit is {phase}'s, {seconds:.1f} s" in text


def _committed_lines(notebook: str, key: str) -> list[tuple[dict, str]]:
    """Each committed ``outputs/<notebook>/<tag>/`` folder's metrics and its findings line; the findings list the
    folders under ``key`` in the order committed_runs gives them, and there is at least one."""
    import json

    from rlkit.core.results import OUTPUTS_DIR, committed_runs

    folders = committed_runs(OUTPUTS_DIR / notebook)
    metrics = T.run(T.Config())
    assert [row["tag"] for row in metrics[key]] == [f.name for f in folders] and folders
    text = T.describe(metrics)
    return [(json.loads((folder / "metrics.json").read_text()),
             next(x for x in text.splitlines() if f"outputs/{notebook}/{folder.name})" in x)) for folder in folders]


def test_the_findings_give_each_speculative_bound_from_its_committed_folder():
    """Each committed outputs/speculative_bound/<tag>/ is one line: its bound, its measured gen and the bound's range of
    speed-ups, read from that folder's metrics.json."""
    for m, line in _committed_lines(T.SPECULATIVE, "speculative"):
        ups = [r["speedup_of_bound"] for r in m["speculative"]]
        assert f"bound at {m['no_speculation']['limit_s']:.1f} s" in line and f"{m['measured_gen_s']:.1f} s measured" in line
        assert f"falls {min(ups):.2f}x to {max(ups):.2f}x" in line and "No acceptance is measured" in line


def test_the_findings_give_each_engine_settings_folder_from_its_committed_metrics():
    """Each committed outputs/engine_settings/<tag>/ is one line: the KV demand against the pool, max_num_seqs against
    the sequences, the prefill's share of gen and the decode bound, read from that folder's metrics.json."""
    for m, line in _committed_lines(T.ENGINE_SETTINGS, "engine_settings"):
        pool, seqs, chunked, _ = m["settings"]
        assert f"at most {pool['demand']['upper_tokens']:,.0f} KV tokens" in line
        assert f"{pool['pool_tokens']:,}-token pool" in line and f"max_num_seqs {seqs['run_value']} runs" in line
        assert f"{chunked['share_of_gen']:.1%} of the measured {m['measured_gen_s']:.1f} s gen" in line
        assert f"bandwidth bound is {m['decode_bound']['limit_s']:.1f} s" in line
