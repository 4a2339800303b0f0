import json

import pytest

from rlkit.measure import samplers as measure


def test_phase_timer_accumulates_repeated_phases():
    timer = measure.PhaseTimer()
    for _ in range(3):
        with timer.phase("work"):
            sum(range(1000))
    with timer.phase("other"):
        pass
    out = timer.as_dict()
    assert out["work"]["count"] == 3 and out["other"]["count"] == 1
    assert out["work"]["seconds"] > 0
    assert out["work"]["peak_device_gib"] == 0.0  # no CUDA here
    assert out["work"]["host_rss_gib"] > 0


def test_host_memory_readings_are_consistent():
    rss = measure.host_rss_gib()
    assert 0 < rss <= measure.host_peak_rss_gib() + 1e-3


def test_host_peak_rss_sees_a_large_allocation():
    # The peak is a high-water mark: it must reach the current RSS plus the block, but from an earlier, higher
    # peak it rises by less than the block (seen in CI), so the bar is set from the current RSS.
    current = measure.host_rss_gib()
    block = bytearray(256 * 2**20)
    block[::4096] = b"x" * len(block[::4096])  # touch every page
    assert measure.host_rss_gib() >= current + 0.2
    assert measure.host_peak_rss_gib() >= max(current + 0.2, measure.host_rss_gib() - 0.01)
    del block


def test_metrics_recorder_writes_atomically(tmp_path):
    rec = measure.MetricsRecorder(experiment="demo")
    rec.append("rows", {"a": 1})
    rec.set(total=2)
    path = rec.write(tmp_path)
    assert json.loads(path.read_text()) == {"experiment": "demo", "rows": [{"a": 1}], "total": 2}
    assert not list(tmp_path.glob("*.partial"))


def wait_for_samples(sampler, count: int) -> None:
    """Until the sampler thread has appended ``count`` samples, however busy the machine (no deadline here:
    a thread that never samples is a hang, which pytest-timeout ends)."""
    import time

    while len(sampler.samples) < count:
        time.sleep(0.001)


def test_gpu_sampler_cuts_the_timeline_by_phase():
    import itertools

    values = itertools.count()
    sampler = measure.MemorySampler(interval_s=0.001, reader=lambda: [float(next(values))], source="counter")
    with sampler:
        wait_for_samples(sampler, 1)  # taken before any mark: phase "start"
        for phase in ("rollout", "update"):
            sampler.mark(phase)
            # A sample timed before the mark may still be in flight; the one after it started after the mark.
            wait_for_samples(sampler, len(sampler.samples) + 2)
    timeline = sampler.timeline()
    phases = [row["phase"] for row in timeline]
    order = ["start", "rollout", "update"]
    assert phases == sorted(phases, key=order.index)
    assert set(phases) == set(order)  # every phase holds at least one sample
    summary = sampler.summary()
    assert summary["samples"] == len(timeline)
    for phase in order:  # the counter rises: each phase's peak is its last sample
        assert summary["peak_used_gib_by_phase"][phase] == [max(r["used_gib"][0] for r in timeline if r["phase"] == phase)]
    assert summary["peak_used_gib_by_phase"]["update"] == timeline[-1]["used_gib"]  # stop() samples once more
    assert summary["peak_used_gib"] == [max(r["used_gib"][0] for r in timeline)]


def test_gpu_sampler_without_a_gpu_says_what_is_missing():
    import shutil

    import pytest

    try:
        import pynvml  # noqa: F401
    except ImportError:
        if shutil.which("nvidia-smi") is None:
            with pytest.raises(measure.SamplerUnavailable, match="nvidia-ml-py"):
                measure.gpu_memory_reader()
            return
    pytest.skip("GPU tooling present")


def test_sampler_reads_only_the_gpus_cuda_sees():
    gpus = [(0, "GPU-aaaa-0"), (1, "GPU-bbbb-1"), (2, "GPU-cccc-2")]
    assert measure.visible_gpus(gpus, None) == [0, 1, 2]
    assert measure.visible_gpus(gpus, "2,0") == [2, 0]  # CUDA's order: cuda:0 is GPU 2
    assert measure.visible_gpus(gpus, "GPU-bbbb") == [1]  # a unique UUID prefix
    assert measure.visible_gpus(gpus, "1,7,2") == [1]  # CUDA stops at the first entry naming no device
    assert measure.visible_gpus(gpus, "GPU-") == []  # ambiguous prefix
    assert measure.visible_gpus(gpus, "") == []


def test_host_memory_reader_reports_the_nodes_used_memory():
    import os

    import pytest

    try:
        read = measure.host_memory_reader()
    except measure.SamplerUnavailable:
        pytest.skip("no /proc/meminfo")
    (used,) = read()
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / measure.GIB
    assert 0 < used < total


def test_launch_samplers_and_host_summary():
    from rlkit.experiments import grpo

    sampler = measure.MemorySampler(interval_s=0.01, reader=lambda: [0.0], source="scripted")  # never started
    sampler.samples = [(0.0, [10.0]), (1.0, [12.5]), (2.0, [30.0]), (3.0, [11.0])]
    summary = grpo.host_memory_summary(sampler)
    assert summary["baseline_gib"] == 10.0 and summary["peak_used_gib"] == 30.0
    assert summary["peak_above_baseline_gib"] == 20.0 and summary["source"] == "scripted"
    gpu, host = grpo._start_samplers()  # this machine: no GPU to read, host memory from /proc/meminfo
    try:
        assert gpu is None and host is not None and host.source == "/proc/meminfo"
    finally:
        if host is not None:
            host.stop()


def test_compute_apps_are_summed_per_process_on_the_gpus_cuda_sees():
    # the format of `nvidia-smi --query-compute-apps=gpu_uuid,pid,used_memory --format=csv,noheader,nounits` (MiB)
    text = "GPU-aaaa, 101, 2048\nGPU-bbbb, 202, 1024\nGPU-aaaa, 303, [N/A]\nGPU-bbbb, 101, 512\n"
    assert measure.parse_compute_apps(text, ["GPU-aaaa"]) == {101: 2.0, 303: 0.0}
    assert measure.parse_compute_apps(text, ["GPU-aaaa", "GPU-bbbb"]) == {101: 2.5, 202: 1.0, 303: 0.0}
    assert measure.parse_compute_apps("", ["GPU-aaaa"]) == {}


def test_a_second_sampler_shares_the_first_ones_clock():
    import time

    first = measure.MemorySampler(interval_s=0.01, reader=lambda: [0.0], source="a")
    time.sleep(0.01)
    created = time.time() - first.origin  # on the first sampler's clock, before the second exists
    second = measure.MemorySampler(interval_s=0.01, reader=lambda: [[1, 0.5, "x"]], source="b", origin=first.origin)
    with second:
        wait_for_samples(second, 1)
    assert second.origin == first.origin
    assert second.samples[0][0] >= created > 0  # ordering on one clock, not a duration
    assert second.samples[0][1] == [[1, 0.5, "x"]]


def test_process_names_come_from_proc():
    import os

    assert "python" in measure._process_name(os.getpid()).lower() or "pytest" in measure._process_name(os.getpid())
    assert measure._process_name(2**22 + 12345) == ""  # no such pid


@pytest.mark.gpu
def test_per_process_reader_sees_this_process_on_the_gpu():
    import os

    import torch

    block = torch.empty(2 * measure.GIB, dtype=torch.uint8, device="cuda")
    rows = measure.gpu_process_memory_reader()()
    assert sum(gib for _, gib, _ in rows) >= 2.0, rows
    mine = [gib for pid, gib, _ in rows if pid == os.getpid()]
    assert not mine or mine[0] >= 2.0, rows  # in another PID namespace NVML lists host pids: this pid is absent
    del block
