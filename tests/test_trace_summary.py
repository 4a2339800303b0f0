"""rlkit.measure.trace_summary on hand-made Chrome-trace events whose answers are known: busy time counts overlapping kernels
once, the idle gaps are the holes between them (with their neighbours and what the host did), kernels fall into the
categories their names and host stacks say, and syncs and device-to-host copies are counted where they were called.
Plus the CPU fallback (operators' self time) and the capped, trimmed export."""
from __future__ import annotations

import gzip
import json

import pytest

from rlkit.measure import trace_stacks
from rlkit.measure import trace_summary as T

HOST = {"pid": 1, "tid": 1}
STREAM = {"pid": 0, "tid": 7}


def x(name, cat, ts, end, where=HOST, **args):
    event = {"ph": "X", "cat": cat, "name": name, "ts": float(ts), "dur": float(end - ts), **where}
    if args:
        event["args"] = args
    return event


def launch(ts, corr, name="cudaLaunchKernel"):
    return x(name, "cuda_runtime", ts, ts + 5, correlation=corr)


def kernel(name, ts, end, corr, where=STREAM, cat="kernel", **args):
    return x(name, cat, ts, end, where, correlation=corr, **args)


GEMM = "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x256x64"
CHUNK_GEMM = "nvjet_tst_128x256_64x4_1x2_h_bz_coopB_TNT"
EXP = "void at::native::vectorized_elementwise_kernel<4, at::native::exp_kernel_cuda>"
FLASH = "void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<128, 128, 64, 4>>"
COPY = "void at::native::elementwise_kernel<128, 2, copy_kernel>"
ADD = "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>>"
ADAM = "void at::native::multi_tensor_apply_kernel<FusedAdamMathFunctor>"
D2H = "Memcpy DtoH (Device -> Pageable)"


@pytest.fixture
def events():
    """An update window of 1000 us: host stack on thread 1, kernels on streams 7 and 8 (see the test for the answers)."""
    return [
        {"ph": "M", "name": "process_name", "pid": 1, "tid": 0, "args": {"name": "python"}},
        x("rlkit_update", "user_annotation", 0, 1000),
        x("micro_batch0", "user_annotation", 10, 600),
        x("aten::mm", "cpu_op", 20, 40), launch(25, 1),
        x("_ChunkedLinearLogProbs", "cpu_op", 50, 150),
        x("aten::mm", "cpu_op", 60, 80), launch(65, 2),
        x("aten::exp", "cpu_op", 90, 100), launch(92, 3),
        x("aten::item", "cpu_op", 200, 400),
        x("aten::_local_scalar_dense", "cpu_op", 201, 399),
        launch(205, 4, "cudaMemcpyAsync"),
        x("cudaStreamSynchronize", "cuda_runtime", 210, 398, correlation=5),
        x("rlkit_varlen_attention", "user_annotation", 450, 500),
        launch(455, 6), launch(470, 7),
        launch(505, 9),  # the add on the second stream, launched after the attention call
        x("optimizer_step", "user_annotation", 610, 990),
        x("aten::_foreach_add_", "cpu_op", 620, 640), launch(625, 8),
        x("cudaDeviceSynchronize", "cuda_runtime", 900, 990, correlation=10),
        kernel(GEMM, 100, 300, 1),
        kernel(CHUNK_GEMM, 300, 350, 2),
        kernel(EXP, 350, 360, 3),
        kernel(D2H, 360, 362, 4, cat="gpu_memcpy", bytes=4),
        kernel(FLASH, 500, 690, 6),
        kernel(COPY, 690, 720, 7),
        kernel(ADD, 650, 710, 9, where={"pid": 0, "tid": 8}),  # overlaps the flash kernel: busy counts it once
        kernel(ADAM, 800, 850, 8),
        kernel("after_the_window", 1100, 1200, 99),
        {"ph": "s", "cat": "ac2g", "name": "ac2g", "id": 1, "ts": 25.0, **HOST},  # flow events are ignored
    ]


def test_busy_idle_and_gaps(events):
    s = T.summarize(events)
    assert s["timeline"] == "gpu_kernels" and s["window"] == {"name": "rlkit_update", "ms": 1.0}
    d = s["device"]
    assert d["events"] == 8  # the kernel after the window is out
    assert d["kernel_time_ms"] == pytest.approx(0.592)  # summed durations
    assert d["busy_ms"] == pytest.approx(0.532)  # [100, 362] + [500, 720] + [800, 850]: the overlap once
    assert d["idle_ms"] == pytest.approx(0.468) and d["idle_fraction"] == pytest.approx(0.468)
    gaps = s["idle_gaps"]
    assert gaps["count"] == 4 and gaps["total_ms"] == pytest.approx(0.468)
    assert [v for g in gaps["largest"] for v in (g["start_ms"], g["ms"])] == pytest.approx(
        [0.85, 0.15, 0.362, 0.138, 0.0, 0.1, 0.72, 0.08])
    first, second, third, _ = gaps["largest"]
    assert (first["before"], first["after"]) == (ADAM, None)
    assert first["host"] == ["cudaDeviceSynchronize"] and first["region"] == "optimizer_step"
    assert (second["before"], second["after"]) == (D2H, FLASH)
    assert second["host"] == ["micro_batch0"] and second["region"] == "micro_batch0"
    assert (third["before"], third["after"]) == (None, GEMM)
    assert gaps["by_region"] == {"micro_batch*": {"count": 2, "ms": pytest.approx(0.238)},
                                 "optimizer_step": {"count": 2, "ms": pytest.approx(0.23)}}
    assert gaps["histogram"]["10-100us"]["count"] == 1 and gaps["histogram"]["0.1-1ms"]["count"] == 3  # 100 us: 0.1-1ms
    assert sum(b["count"] for b in gaps["histogram"].values()) == gaps["count"]


def test_kernels_and_categories(events):
    s = T.summarize(events, top_kernels=3)
    top = s["top_kernels"]
    assert [r["name"] for r in top] == [GEMM, FLASH, ADD]
    assert top[0] == {"name": GEMM, "category": "gemm", "count": 1, "total_ms": pytest.approx(0.2),
                      "mean_us": pytest.approx(200.0), "share": pytest.approx(200 / 592),
                      "ms_by_category": {"gemm": pytest.approx(0.2)}}
    assert top[1]["category"] == "attention" and top[2]["category"] == "elementwise"
    assert s["kernel_names"] == 8 and s["top_kernels_share"] == pytest.approx(450 / 592)
    ms = {c: round(v["ms"] * 1000, 6) for c, v in s["categories"].items()}
    # the nvjet GEMM and the exp inside _ChunkedLinearLogProbs are the log-prob's; the copy launched inside the
    # annotated attention call is attention's; the multi-tensor kernel inside optimizer_step is the optimizer's
    assert ms == {"attention": 220.0, "gemm": 200.0, "chunked_logprob": 60.0, "elementwise": 60.0, "optimizer": 50.0,
                  "memcpy_memset": 2.0, "other": 0.0}
    assert sum(v["share"] for v in s["categories"].values()) == pytest.approx(1.0)


def test_host_syncs_and_their_sources(events):
    syncs = T.summarize(events)["host_syncs"]
    assert syncs["count"] == 2 and syncs["ms"] == pytest.approx(0.188 + 0.090)
    assert syncs["calls"] == {
        "cudaMemcpyAsync (DtoH)": {"kind": "d2h_copy", "count": 1, "ms": pytest.approx(0.005)},
        "cudaStreamSynchronize": {"kind": "sync", "count": 1, "ms": pytest.approx(0.188)},
        "cudaDeviceSynchronize": {"kind": "sync", "count": 1, "ms": pytest.approx(0.090)},
    }
    assert syncs["d2h_copies"] == {"count": 1, "ms": pytest.approx(0.002), "bytes": 4}
    item, optimizer = syncs["by_source"]
    assert item["op"] == "aten::item > aten::_local_scalar_dense" and item["count"] == 2
    assert item["kinds"] == {"d2h_copy": 1, "sync": 1} and item["regions"] == {"micro_batch*": 2}
    assert optimizer["op"] == "(no operator)" and optimizer["regions"] == {"optimizer_step": 1}


def test_a_kernel_name_in_two_categories_reports_both():
    events = [x("rlkit_update", "user_annotation", 0, 100), x("aten::mm", "cpu_op", 1, 2), launch(1.5, 1),
              x("_ChunkedLinearLogProbs", "cpu_op", 3, 9), launch(4, 2), launch(5, 3),
              kernel(GEMM, 10, 20, 1), kernel(GEMM, 20, 50, 2), kernel(GEMM, 50, 60, 3)]
    (row,) = T.summarize(events)["top_kernels"]
    assert row["count"] == 3 and row["category"] == "chunked_logprob"
    assert row["ms_by_category"] == {"chunked_logprob": pytest.approx(0.04), "gemm": pytest.approx(0.01)}


def test_classify_order():
    assert T.classify("Memcpy HtoD (Pinned -> Device)", "gpu_memcpy", ["_ChunkedLinearLogProbs"]) == "memcpy_memset"
    assert T.classify(GEMM, "kernel", ["autograd::engine::evaluate_function: _ChunkedLinearLogProbsBackward"]) \
        == "chunked_logprob"
    assert T.classify(ADD, "kernel", ["Optimizer.step#AdamW.step"]) == "optimizer"
    assert T.classify("flash_bwd_dq_dk_dv_loop_seqk_parallel_kernel", "kernel", []) == "attention"
    assert T.classify("cutlass3x_sm90_tensorop_gemm", "kernel", ["aten::mm"]) == "gemm"
    assert T.classify("void at::native::reduce_kernel<512, 1>", "kernel", ["aten::sum"]) == "other"
    assert T.classify("aten::addmm", "cpu_op", ["aten::linear"]) == "gemm"
    assert T.classify("aten::mul_", "cpu_op", []) == "elementwise"
    assert T.classify("triton_poi_fused__to_copy_mul_0", "kernel", []) == "elementwise"  # Inductor's pointwise
    assert T.classify("triton_per_fused__to_copy_add_mean_mul_pow_rsqrt_0", "kernel", []) == "other"  # a fused norm


def test_without_device_events_the_cpu_operators_self_time_is_the_timeline():
    events = [x("A", "cpu_op", 0, 100), x("aten::mm", "cpu_op", 10, 50), x("aten::add", "cpu_op", 150, 200),
              x("B", "cpu_op", 300, 350, where={"pid": 1, "tid": 2})]  # another thread
    s = T.summarize(events, window=None)
    assert s["timeline"] == "cpu_ops_self_time" and s["window"] == {"name": None, "ms": 0.35}
    ms = {r["name"]: r["total_ms"] for r in s["top_kernels"]}
    assert ms == pytest.approx({"A": 0.06, "aten::mm": 0.04, "aten::add": 0.05, "B": 0.05})
    assert s["device"]["busy_ms"] == pytest.approx(0.2) and s["device"]["idle_ms"] == pytest.approx(0.15)
    assert [v for g in s["idle_gaps"]["largest"] for v in (g["start_ms"], g["ms"])] == pytest.approx([0.2, 0.1, 0.1, 0.05])
    assert s["categories"]["gemm"]["ms"] == pytest.approx(0.04)
    assert s["host_syncs"]["count"] == 0


def test_an_empty_trace_gives_zeros():
    s = T.summarize([])
    assert s["device"]["busy_ms"] == 0 and s["top_kernels"] == [] and s["idle_gaps"]["count"] == 0


def test_capped_export_keeps_the_whole_trace_or_the_first_micro_batch(tmp_path, events):
    big = [x(f"aten::op{i}", "cpu_op", 700 + i * 1e-3, 700 + i * 1e-3 + 1e-4) for i in range(3000)]  # after micro_batch0
    mb0 = x("micro_batch0", "gpu_user_annotation", 100, 362, STREAM)
    doc = {"schemaVersion": 1, "traceEvents": events + [mb0] + big}
    whole = T.write_capped(doc, tmp_path / "a.json.gz", 2**24, fallback="micro_batch0")
    assert whole["kept"] == "the whole trace" and whole["bytes"] == (tmp_path / "a.json.gz").stat().st_size
    assert T.load_doc(tmp_path / "a.json.gz") == json.loads(json.dumps(doc))
    assert T.annotation_extent(doc["traceEvents"], "micro_batch0") == (10.0, 600.0)  # host and device ranges joined
    cap = whole["bytes"] // 2
    part = T.write_capped(doc, tmp_path / "b.json.gz", cap, fallback="micro_batch0")
    assert part["kept"].startswith("micro_batch0 only") and part["bytes"] <= cap
    kept = T.load_events(tmp_path / "b.json.gz")
    assert len(kept) == part["events_kept"] < len(doc["traceEvents"])
    assert all(e.get("ph") == "M" or (e["ts"] <= 600 and e["ts"] + e.get("dur", 0) >= 10) for e in kept)
    assert "rlkit_update" in {e["name"] for e in kept}  # it overlaps the range
    none = T.write_capped(doc, tmp_path / "c.json.gz", 100, fallback="micro_batch0")
    assert none["file"] is None and none["kept"].startswith("nothing") and not (tmp_path / "c.json.gz").exists()
    with gzip.open(tmp_path / "a.json.gz", "rt") as f:
        assert json.load(f)["schemaVersion"] == 1


def test_passes_split_the_kernel_time_into_forward_recompute_backward_and_optimizer():
    """A backward node's own GEMM is backward; a GEMM under an operator that records an autograd sequence number
    inside that node is the checkpoint's recompute; an optimizer kernel is the optimizer's; the rest is forward."""
    seq = {"Sequence number": 7}
    node = "autograd::engine::evaluate_function: MmBackward0"
    events = [
        x("rlkit_update", "user_annotation", 0, 1000),
        x("aten::linear", "cpu_op", 10, 30, **seq), x("aten::mm", "cpu_op", 11, 29), launch(12, 1),
        x(node, "cpu_op", 100, 400), x("MmBackward0", "cpu_op", 101, 399, **seq),
        x("aten::linear", "cpu_op", 110, 150, **seq), x("aten::mm", "cpu_op", 111, 149), launch(112, 2),
        x("aten::mm", "cpu_op", 200, 220), launch(201, 3),  # the node's own gradient GEMM
        x("optimizer_step", "user_annotation", 500, 600), launch(510, 4),
        kernel(GEMM, 40, 60, 1), kernel(GEMM, 160, 190, 2), kernel(GEMM, 230, 270, 3), kernel(ADAM, 520, 530, 4),
    ]
    passes = T.summarize(events)["passes"]
    assert {p: round(v["ms"] * 1000, 6) for p, v in passes.items()} == {"forward": 20.0, "recompute": 30.0,
                                                                        "backward": 40.0, "optimizer": 10.0}
    assert passes["recompute"]["ms_by_category"] == {"gemm": pytest.approx(0.03)}
    assert sum(v["share"] for v in passes.values()) == pytest.approx(1.0)
    assert T.pass_of([]) == "forward" and T.pass_of([{"name": node, "cat": "cpu_op"}]) == "backward"


def test_passes_find_a_real_checkpoint_recompute_in_a_cpu_profile(tmp_path):
    """torch.profiler on this CPU: two blocks of linear-silu-linear, the first under non-reentrant checkpointing.
    The recompute is the first block's forward again (its GEMMs and silu, nothing of the backward's plain mm); the
    forward is both blocks; the backward holds every gradient GEMM."""
    import torch
    from torch.utils.checkpoint import checkpoint

    torch.manual_seed(0)
    first, second = (torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.SiLU(), torch.nn.Linear(32, 16))
                     for _ in range(2))
    x = torch.randn(8, 16, requires_grad=True)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        with torch.profiler.record_function("rlkit_update"):
            second(checkpoint(first, x, use_reentrant=False)).square().mean().backward()
    prof.export_chrome_trace(str(tmp_path / "trace.json"))
    thread = trace_stacks.Thread([e for e in T.load_events(tmp_path / "trace.json") if e.get("cat") == "cpu_op"])
    seen: dict[tuple[str, str], int] = {}
    for i, e in enumerate(thread.events):
        if e["name"] in ("aten::addmm", "aten::mm", "aten::silu"):
            key = (T.pass_of([e, *thread.chain(thread.parent[i])]), e["name"])
            seen[key] = seen.get(key, 0) + 1
    assert seen[("forward", "aten::addmm")] == 4 and seen[("forward", "aten::silu")] == 2
    assert seen[("recompute", "aten::silu")] == 1 and 1 <= seen[("recompute", "aten::addmm")] <= 2
    assert ("recompute", "aten::mm") not in seen and seen[("backward", "aten::mm")] >= 6
