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


def test_a_failed_arm_is_a_row_with_its_error(tmp_path):
    import shutil

    folder = tmp_path / "05_grpo_qwen3_4b"
    arm = REPO_ROOT / "outputs" / "05_grpo_qwen3_4b" / "1-fixes-hostadamw"
    shutil.copytree(arm, folder / arm.name, ignore=shutil.ignore_patterns("outputs", "plugin_records", "*.log", "*.ipynb"))
    failed = folder / "4-rank0-owner.failed"
    failed.mkdir()
    (failed / "FAILED.txt").write_text("run failed: RuntimeError: verl exited with 1\n  File x\nValueError: a | b\n")
    (folder / "not-an-arm.failed").mkdir()
    rows = [line for line in report.grpo_arms_section(root=tmp_path) if line.startswith("| ")]
    header, failed_row = rows[0], rows[-1]
    assert len(rows) == 3 and failed_row.startswith("| 4-rank0-owner.failed |")
    assert "ValueError: a / b" in failed_row and failed_row.count("|") == header.count("|")
