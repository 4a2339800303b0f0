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
