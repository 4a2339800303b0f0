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


# Session 21's verl.log (outputs/05_grpo_qwen3_4b/h200-seed-5-master-on-host-cast-once.session21/, lines 1034-1070),
# some option pairs left out, with another process's line interleaved: the ``vllm serve`` list verl pprints.
_SERVE_LINES = [
    "['serve',",
    " '/tmp/arc/data/generated/models/qwen3-4b-random-seed0-len1400',",
    " '--dtype',",
    " 'bfloat16',",
    " '--max_num_seqs',",
    " '256',",
    " '--enable_chunked_prefill',",
    " '--max_num_batched_tokens',",
    " '8192',",
    " '--enable_prefix_caching',",
    " '--enable_sleep_mode',",
    " '--gpu_memory_utilization',",
    " '0.85',",
    " '--override_generation_config',",
    " '{\"temperature\": 1.0, \"top_k\": -1, \"top_p\": 1, \"repetition_penalty\": 1.0, '",
    " '\"max_new_tokens\": 4096}',",
    " '--compilation_config',",
    " '{\"cudagraph_mode\": \"FULL_AND_PIECEWISE\"}']",
]


def test_the_engine_options_verl_started_vllm_with_are_read_from_the_printed_list():
    lines = [f"\x1b[36m(vLLMHttpServer pid=3052)\x1b[0m {line}" for line in _SERVE_LINES]
    lines.insert(3, "\x1b[36m(WorkerDict pid=2671)\x1b[0m ['not', 'this']")
    (engine,) = verl_logs.parse_vllm_serve_args("\n".join(["(TaskRunnerV1 pid=2206) 'max_num_seqs': 1024,", *lines]))
    assert engine["model"].endswith("qwen3-4b-random-seed0-len1400") and engine["dtype"] == "bfloat16"
    assert (engine["max_num_seqs"], engine["max_num_batched_tokens"], engine["gpu_memory_utilization"]) == (256, 8192, 0.85)
    assert engine["enable_chunked_prefill"] is True and engine["enable_prefix_caching"] is True
    assert engine["override_generation_config"].endswith('"max_new_tokens": 4096}')
    assert engine["compilation_config"] == '{"cudagraph_mode": "FULL_AND_PIECEWISE"}'


def test_serve_args_turn_negated_flags_false_and_repeated_values_into_lists():
    text = "(vLLMHttpServer pid=1) ['serve', 'm', '--no-enable-prefix-caching', '--cudagraph_capture_sizes', '1', '2']"
    assert verl_logs.parse_vllm_serve_args(text) == [{"model": "m", "enable_prefix_caching": False,
                                                      "cudagraph_capture_sizes": [1, 2]}]
    assert verl_logs.parse_vllm_serve_args("no list here") == []
