"""rlkit.verl.logs: verl's per-step metrics from its own file logger, and the console fallback for older runs."""
import json

import numpy as np
import pytest

from rlkit.verl import logs as verl_logs


@pytest.mark.verl
def test_steps_come_from_verls_own_file_logger(tmp_path, monkeypatch):
    """verl's FileLogger (trainer.logger=[console,file]) writes the records; rlkit reads them back merged by step,
    numpy scalars as numbers, and prefers them to the console log of the same folder."""
    from verl.utils.tracking import FileLogger

    monkeypatch.setenv(verl_logs.FILE_LOGGER_ENV, str(tmp_path / verl_logs.METRICS_FILE))
    logger = FileLogger("rlkit", "test")
    logger.log({"timing_s/step": np.float64(12.5), "actor/grad_norm": np.float32(0.25)}, step=1)
    logger.log({"val/score": 0.5}, step=1)
    logger.log({"timing_s/step": 11.0, "actor/grad_norm": 0.5}, step=2)
    logger.finish()
    (tmp_path / verl_logs.CONSOLE_LOG).write_text("(TaskRunner pid=1) step:1 - timing_s/step:99.0\n")
    steps, source = verl_logs.read_steps(tmp_path)
    assert source == verl_logs.METRICS_FILE
    assert steps == [{"step": 1, "timing_s/step": 12.5, "actor/grad_norm": 0.25, "val/score": 0.5},
                     {"step": 2, "timing_s/step": 11.0, "actor/grad_norm": 0.5}]
    assert verl_logs.summarize(steps)["step_s"] == 11.0


def test_a_run_without_the_file_is_read_from_its_console_log(tmp_path):
    (tmp_path / verl_logs.CONSOLE_LOG).write_text(
        "\x1b[36m(TaskRunner pid=7)\x1b[0m step:1 - timing_s/step:np.float64(40.0) - actor/pg_loss:-0.01\n"
        "(TaskRunner pid=7) step:2 - timing_s/step:32.0 - actor/pg_loss:0.02\n")
    (tmp_path / verl_logs.METRICS_FILE).write_text("")  # verl opened it but the run died before a step
    steps, source = verl_logs.read_steps(tmp_path)
    assert source == verl_logs.CONSOLE_LOG and [s["timing_s/step"] for s in steps] == [40.0, 32.0]


def test_only_trained_step_lines_are_marked():
    assert verl_logs.logged_training_step("\x1b[36m(TaskRunner pid=7)\x1b[0m step:3 - timing_s/step:4.0 - x:1") == 3
    assert verl_logs.logged_training_step("(TaskRunner pid=7) step:0 - val/score:0.5") is None
    assert verl_logs.logged_training_step("no step here") is None


def test_file_records_merge_like_the_console(tmp_path):
    path = tmp_path / "m.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in (
        {"step": 2, "data": {"a": 1}}, {"step": 1, "data": {"a": 0}}, {"step": 2, "data": {"b": 2}})) + "\n")
    assert verl_logs.read_file_metrics(path) == [{"step": 1, "a": 0}, {"step": 2, "a": 1, "b": 2}]
