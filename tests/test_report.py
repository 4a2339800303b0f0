"""The README's results block is generated from committed metrics and must match them."""
from rlkit import report
from rlkit.env import REPO_ROOT


def test_readme_results_match_committed_metrics():
    readme = (REPO_ROOT / "README.md").read_text()
    expected = report.replace_block(readme, report.results_block())
    assert readme == expected, "README results are stale: run `python -m rlkit.report --write README.md`"


def test_missing_results_are_said_not_invented(tmp_path):
    block = report.results_block(root=tmp_path)
    assert block.count("no committed GPU results yet") == len(report.SECTIONS) + 2  # + the verl arms and the sweep



def _arm(step_s, peak_gib, *, trained=True, response=256):
    """What arc_summary reads of an arm's metrics.json (outcome() reads launch and steps)."""
    import json

    from rlkit.env import REPO_ROOT

    m = json.loads((REPO_ROOT / "outputs/05_grpo_qwen3_4b/1-fixes-hostadamw/metrics.json").read_text())
    m["recipe"] = {**m["recipe"], "max_response_length": response}
    m["summary"] = {**m["summary"], "step_s": step_s, "actor_max_allocated_gib": peak_gib}
    if not trained:
        m["steps"] = []
    return m


def test_arc_summary_judges_the_full_arc_against_the_targets():
    from rlkit.grpo import ARMS

    later = list(ARMS)[list(ARMS).index(report.FIRST_WORKING_ARM) + 1:]
    base = {report.FIRST_WORKING_ARM: _arm(100.0, 40.0)}
    assert "no complete run yet" in report.arc_summary({})
    partial = report.arc_summary({**base, later[0]: _arm(90.0, 41.0), later[-1]: _arm(50.0, 20.0, response=512)})
    assert f"{later[0]}: step 90.0 s (x0.900), actor peak +1.00 GiB." in partial
    sessions = {report.FIRST_WORKING_ARM: "aaa", later[0]: "bbb"}
    assert "+1.00 GiB (another device session: bbb vs aaa)" in report.arc_summary({**base, later[0]: _arm(90.0, 41.0)}, sessions)
    assert "not measured yet" in partial and later[-1] in partial.split("no complete run of")[1]  # other response length
    met = report.arc_summary({**base, later[-1]: _arm(84.0, 33.0)})
    assert "16.0% shorter (target 16%: met)" in met and "7.00 GiB lower (target 7 GiB: met)" in met
    assert f"arms without a complete run: {', '.join(later[:-1])}." in met
    missed = report.arc_summary({**base, **{a: _arm(85.0, 33.5) for a in later}})
    assert "15.0% shorter (target 16%: not met)" in missed and "6.50 GiB lower (target 7 GiB: not met)" in missed
    assert "arms without" not in missed
    assert "not measured yet" in report.arc_summary({**base, later[-1]: _arm(50.0, 20.0, trained=False)})
