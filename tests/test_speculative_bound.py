"""rlkit.experiments.speculative_bound on a committed run: its rows, its bandwidth-only bound as the run's limits
give it, and clear errors for a run it cannot read."""
import pytest
from conftest import committed_run

from rlkit.core import params as P
from rlkit.core.results import OUTPUTS_DIR
from rlkit.experiments import speculative_bound as SB
from rlkit.experiments._committed_decode import RUNS_OF


def _cfg(**overrides):
    return P.build(SB.Config, {**SB.PROFILES["h200-seed"], **overrides}, where="test")


def test_rows_cover_the_grid_and_more_acceptance_never_slows_the_bound():
    committed_run(OUTPUTS_DIR / RUNS_OF / SB.PROFILES["h200-seed"]["run"])
    m = SB.run(_cfg())
    grid = [(k, a) for k in SB.PROFILES["h200-seed"]["draft_tokens"] for a in SB.PROFILES["h200-seed"]["acceptance"]]
    assert [(r["draft_tokens"], r["acceptance"]) for r in m["speculative"]] == grid
    for k in {k for k, _ in grid}:
        limits = [r["limit_s"] for r in m["speculative"] if r["draft_tokens"] == k]
        assert limits == sorted(limits, reverse=True)
    assert all(r["speedup_of_bound"] == pytest.approx(m["no_speculation"]["limit_s"] / r["limit_s"])
               for r in m["speculative"])
    assert m["lengths"].startswith("synthetic")  # a random-init model's lengths: the rows must say so


def test_its_bandwidth_only_bound_is_the_one_the_run_limits_report():
    """The same run through rlkit.experiments.estimates.phase_limits, the route the results table takes."""
    from rlkit.core.env import gpu_name, read_saved
    from rlkit.core.results import read_metrics
    from rlkit.experiments.estimates import phase_limits

    folder = committed_run(OUTPUTS_DIR / RUNS_OF / SB.PROFILES["h200-seed"]["run"])
    limits = phase_limits(read_metrics(folder), gpu_name(read_saved(folder)))
    assert SB.run(_cfg())["bandwidth_only"]["limit_s"] == pytest.approx(limits["phases"]["gen"]["hbm_bound"]["limit_s"])


@pytest.mark.parametrize("overrides, key", [({"run": "no-such-run"}, "run="), ({"draft_tokens": [0]}, "draft_tokens="),
                                            ({"acceptance": [1.2]}, "acceptance=")])
def test_bad_parameters_name_the_key_and_the_fix(overrides, key):
    with pytest.raises(P.ParamError, match=key):
        _cfg(**overrides)


def test_a_run_without_trained_steps_is_refused():
    stock = committed_run(OUTPUTS_DIR / RUNS_OF / "h200-seed-0-stock.session21")  # vLLM refused to start
    with pytest.raises(P.ParamError, match="needs trained steps"):
        SB.run(_cfg(run=stock.name))
