"""The README's results block is generated from committed metrics and must match them."""
from rlkit import report
from rlkit.env import REPO_ROOT


def test_readme_results_match_committed_metrics():
    readme = (REPO_ROOT / "README.md").read_text()
    expected = report.replace_block(readme, report.results_block())
    assert readme == expected, "README results are stale: run `python -m rlkit.report --write README.md`"


def test_missing_results_are_said_not_invented(tmp_path):
    block = report.results_block(root=tmp_path)
    assert block.count("no committed GPU results yet") == len(report.SECTIONS) + 1  # + the verl arms

