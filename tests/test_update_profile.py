"""rlkit.experiments.update_profile: the seed's update under torch.profiler. On the CPU with the tiny profile (the
command line the node runs): a results folder with the gzipped trace, a summary whose invariants hold (shares sum to
at most 1, gaps non-negative and inside the window, busy + idle = window), whose categories find the attention,
the GEMMs, the chunked log-probs and the optimizer, and which the exported trace reproduces; FLOPs are
rlkit.planning.roofline's for the update's sequences. The micro-batch plan keeps verl's token limit; bad parameters are
refused naming the key. A GPU test checks the CUDA trace's vocabulary (kernels, launches, syncs)."""
from __future__ import annotations

import json

import pytest

from rlkit.core import params as P
from rlkit.experiments import update_profile as U
from rlkit.experiments import verl_update as V
from rlkit.experiments.update_profile_markdown import markdown
from rlkit.measure import trace_summary as T
from rlkit.models.shape import resolve_model
from rlkit.planning import roofline


def _tiny(**overrides):
    return P.build(U.Config, {**U.PROFILES["tiny"], **overrides})


def _run(tmp_path, *params, tag="cpu"):
    argv = ["--tiny", "--out", str(tmp_path), "--tag", tag] + [a for p in params for a in ("-p", p)]
    assert U.main(argv) == 0
    folder = tmp_path / U.NOTEBOOK / tag
    return folder, json.loads((folder / "metrics.json").read_text())


def check_summary(metrics, folder):
    """The invariants every summary keeps, on the CPU and the GPU alike."""
    s = metrics["summary"]
    window, d = s["window"]["ms"], s["device"]
    assert s["window"]["name"] == V.UPDATE and window > 0
    assert 0 <= d["busy_ms"] <= window * (1 + 1e-9) and d["idle_ms"] >= 0
    assert d["busy_ms"] + d["idle_ms"] == pytest.approx(window)
    shares = [c["share"] for c in s["categories"].values()]
    assert all(0 <= x <= 1 for x in shares) and sum(shares) <= 1 + 1e-9
    assert sum(shares) == pytest.approx(1.0)  # every timeline event has a category
    assert sum(c["ms"] for c in s["categories"].values()) == pytest.approx(d["kernel_time_ms"])
    top = s["top_kernels"]
    assert 0 < len(top) <= metrics["config"]["top_kernels"]
    assert all(0 <= r["share"] <= 1 for r in top) and s["top_kernels_share"] <= 1 + 1e-9
    assert all(sum(r["ms_by_category"].values()) == pytest.approx(r["total_ms"]) for r in top)
    assert [r["total_ms"] for r in top] == sorted((r["total_ms"] for r in top), reverse=True)
    gaps = s["idle_gaps"]
    assert gaps["total_ms"] == pytest.approx(d["idle_ms"], abs=1e-6)
    for split in ("histogram", "by_region"):
        assert sum(b["count"] for b in gaps[split].values()) == gaps["count"]
        assert sum(b["ms"] for b in gaps[split].values()) == pytest.approx(gaps["total_ms"])
    largest = gaps["largest"]
    assert len(largest) <= metrics["config"]["top_gaps"]
    assert all(g["ms"] > 0 and 0 <= g["start_ms"] and g["start_ms"] + g["ms"] <= window + 1e-6 for g in largest)
    assert [g["ms"] for g in largest] == sorted((g["ms"] for g in largest), reverse=True)
    # the blocking calls counted are the sync and blocking-copy rows of the per-call table (a CPU trace has none)
    syncs = s["host_syncs"]
    blocking = [r for r in syncs["calls"].values() if r["kind"] in ("sync", "blocking_copy")]
    assert syncs["count"] == sum(r["count"] for r in blocking)
    assert syncs["ms"] == pytest.approx(sum(r["ms"] for r in blocking))
    if metrics["config"]["device"] == "cpu":
        assert syncs["count"] == 0 and not syncs["calls"]  # no CUDA runtime calls in a CPU trace
    # the summary is a function of the exported trace: the kept file gives it again (when it kept the whole update)
    trace = metrics["trace"]
    assert trace["file"] == U.TRACE_FILE and trace["bytes"] <= metrics["config"]["trace_max_mib"] * 2**20
    assert trace["bytes"] == (folder / U.TRACE_FILE).stat().st_size
    if trace["kept"] == "the whole trace":
        again = T.summarize(T.load_events(folder / U.TRACE_FILE), window=V.UPDATE,
                            top_kernels=metrics["config"]["top_kernels"], top_gaps=metrics["config"]["top_gaps"])
        assert json.loads(json.dumps(again)) == s


def check_flops(metrics, model):
    lengths = [metrics["config"]["prompt_tokens"] + r for mb in metrics["workload"]["responses"] for r in mb]
    assert len(lengths) == metrics["workload"]["sequences"] and sum(lengths) == metrics["workload"]["tokens"]
    forward = roofline.forward_flops(resolve_model(model), lengths)
    f = metrics["flops"]
    assert f["model_flops"] == 3 * forward["total"]  # fwd + bwd of the real tokens
    assert f["hardware_flops"] == 4 * forward["total"]  # + the checkpoint recompute (no padding: packed)
    assert f["attention_share_of_model_flops"] == pytest.approx(forward["attention"] / forward["total"])


def test_tiny_profile_on_the_cpu(tmp_path):
    from rlkit.patches.fsdp import cast_once
    from rlkit.patches.kernels import varlen_attention

    folder, metrics = _run(tmp_path)
    assert {p.name for p in folder.iterdir()} == {"params.yaml", "env.json", "metrics.json", U.TRACE_FILE, U.SUMMARY_FILE}
    summary_md = (folder / U.SUMMARY_FILE).read_text()
    assert summary_md == markdown(metrics) and "| chunked_logprob |" in summary_md
    assert f"{metrics['summary']['host_syncs']['count']} " in summary_md
    assert not varlen_attention.PATCH.active() and not cast_once.PATCH.active()  # applied for the run, reverted
    import torch.distributed as dist
    assert not dist.is_initialized()  # its 1-rank FSDP group is gone too

    w = metrics["workload"]
    assert w["micro_batches"] == 2 and all(0 < t <= 256 for t in w["tokens_per_micro_batch"])
    assert sum(w["tokens_per_micro_batch"]) == w["tokens"] <= 0.9 * 2 * 256
    m = metrics["model"]
    assert m["wrap"] == "fsdp_cast_once" and set(m["patches_active"]) >= {"varlen_attention", "cast_once"}
    assert m["attention_calls"] == {"per_sequence_sdpa": 2 * 2 * 2}  # 2 layers x 2 micro-batches x (fwd + recompute)
    assert not m["varlen_kernel"]
    t = metrics["timing"]
    assert len(t["warmup"]) == 1 and len(t["timed"]) == 1 and t["profiled_s"] > 0 and t["peak_allocated_gib"] is None
    assert t["profiled"]["loss"] == pytest.approx(t["timed"][0]["loss"])  # lr 1e-6: the same loss every update
    assert t["profiled"]["grad_norm"] > 0

    s = metrics["summary"]
    assert s["timeline"] == "cpu_ops_self_time"
    check_summary(metrics, folder)
    for category in ("attention", "gemm", "chunked_logprob", "optimizer", "elementwise"):
        assert s["categories"][category]["ms"] > 0, category
    assert s["categories"]["memcpy_memset"]["ms"] == 0
    assert {g["region"] for g in s["idle_gaps"]["largest"]} <= {"micro_batch0", "micro_batch1", V.OPTIMIZER_REGION, None}
    assert set(s["idle_gaps"]["by_region"]) <= {"micro_batch*", V.OPTIMIZER_REGION, "(none)"}
    check_flops(metrics, "tiny")
    assert metrics["flops"]["mfu_timed"] is None and metrics["flops"]["peak_bf16_flops"] is None  # no GPU peak

    # --reanalyze: the same summary from the kept trace, and the commit that made it
    before = metrics["summary"]
    assert U.main(["--reanalyze", str(folder)]) == 0
    after = json.loads((folder / "metrics.json").read_text())
    assert after["summary"] == before and after["analysis"]["trace_kept"] == "the whole trace"
    after["trace"]["kept"] = "micro_batch0 only (...)"  # a trimmed trace: its summary would not be the update's
    (folder / "metrics.json").write_text(json.dumps(after))
    assert U.main(["--reanalyze", str(folder)]) == 2


def test_plain_module_with_the_device_optimizer(tmp_path):
    folder, metrics = _run(tmp_path, "wrap=plain", "optimizer=gpu_adamw", "micro_batches=1", tag="plain")
    assert metrics["model"]["wrap"] == "plain" and metrics["model"]["patches_active"] == ["varlen_attention"]
    check_summary(metrics, folder)
    assert metrics["summary"]["categories"]["optimizer"]["ms"] > 0
    check_flops(metrics, "tiny")


def test_selective_checkpointing_profiles_the_same_update(tmp_path):
    """The tiny profile through FSDP with every layer checkpointed selectively: the same first-update loss and gradient
    norm as full checkpointing, bit for bit, with the patch active for the run and reverted after."""
    from rlkit.patches.verl import selective_checkpoint

    _, full = _run(tmp_path, tag="full")
    selective_checkpoint.CALLS.clear()
    _, sac = _run(tmp_path, "selective_layers=2", tag="sac")
    assert "selective_checkpoint" in sac["model"]["patches_active"] and not selective_checkpoint.PATCH.active()
    assert selective_checkpoint.CALLS["saved"] > 0  # the policy ran inside FSDP's wrapped layers
    for key in ("loss", "grad_norm"):
        assert sac["timing"]["profiled"][key] == full["timing"]["profiled"][key]


def test_gradient_prefetch_profiles_the_same_updates(tmp_path):
    """HostAdamW's gradient prefetch in the tiny profile: every gradient of the last step came from its prefetched
    copy, and the warm-up, timed and profiled updates report the serial run's loss and gradient norm bit for bit
    (each update starts from the weights the one before stepped to), the patch active for the run and reverted after."""
    from rlkit.patches.fsdp import grad_prefetch

    _, serial = _run(tmp_path, tag="serial")
    _, prefetched = _run(tmp_path, "prefetch_grads=true", tag="prefetch")
    assert "grad_prefetch" in prefetched["model"]["patches_active"] and not grad_prefetch.PATCH.active()
    assert serial["model"]["grads_prefetched"] == 0 and prefetched["model"]["grads_prefetched"] == 3  # 2 layers + root

    def updates(m):
        t = m["timing"]
        return [(u["loss"], u["grad_norm"]) for u in [*t["warmup"], *t["timed"], t["profiled"]]]
    assert updates(prefetched) == updates(serial)


def test_micro_batch_plan_keeps_verls_token_limit():
    cfg = P.build(U.Config, U.PROFILES["h200"])
    plan = V.micro_batch_plan(cfg)
    tokens = [sum(p + r for p, r in mb) for mb in plan]
    assert len(plan) == 4 and max(tokens) <= 24576
    assert sum(tokens) >= 0.9 * 4 * 24576  # the drawn 95 % minus at most a few dropped sequences
    assert all(p == 100 and 1 <= r <= 4096 for mb in plan for p, r in mb)
    assert max(tokens) - min(tokens) <= 4196  # balanced: within one longest sequence
    assert V.micro_batch_plan(cfg) == plan  # deterministic per seed
    assert V.pack([5, 1, 4, 2, 3], 2) == [[0, 1, 3], [2, 4]]  # 5, 4, 3 (to 4), 2 (to 5), 1: 5+1+2 / 4+3


def test_micro_batch_tensors_mask_the_response_labels():
    import torch

    batch = V.make_micro_batch([(3, 2), (2, 4)], vocab=50, gen=torch.Generator().manual_seed(0))
    assert batch["input_ids"].shape == (1, 11)
    assert batch["position_ids"].tolist() == [[0, 1, 2, 3, 4, 0, 1, 2, 3, 4, 5]]
    # label at i is token i + 1; it is a response token from the prompt's last position to the one before the end
    assert batch["loss_mask"].tolist() == [[0, 0, 1, 1, 0, 0, 1, 1, 1, 1, 0]]
    assert (batch["labels"][0, :-1] == batch["input_ids"][0, 1:]).all()
    adv = batch["advantages"][0]
    assert len(set(adv[:5].tolist())) == 1 and len(set(adv[5:].tolist())) == 1


@pytest.mark.parametrize("overrides, words", [
    ({"micro_batchez": 4}, ["micro_batchez", "Fix: correct the spelling or remove the key"]),
    ({"wrap": "fsdp2"}, ["wrap='fsdp2'", "plain"]),
    ({"optimizer": "host_adamw", "wrap": "plain"}, ["host_adamw", "Fix: -p wrap=fsdp"]),
    ({"response_cap": 300}, ["max_tokens_per_micro_batch=256", "Fix"]),
    ({"micro_batch_fill": 1.5}, ["micro_batch_fill=1.5"]),
    ({"model": "qwen3-5b"}, ["model='qwen3-5b'"]),
    ({"selective_layers": 2, "gradient_checkpointing": False}, ["selective_layers=2", "gradient_checkpointing=true"]),
    ({"prefetch_grads": True, "optimizer": "gpu_adamw"}, ["prefetch_grads=true", "Fix: -p optimizer=host_adamw"]),
])
def test_bad_parameters_are_refused_naming_the_key(overrides, words):
    with pytest.raises(P.ParamError) as err:
        _tiny(**overrides)
    for word in words:
        assert word in str(err.value)


def test_the_command_line_refuses_without_a_results_folder(tmp_path, capsys):
    assert U.main(["--tiny", "--out", str(tmp_path), "-p", "micro_batchez=4"]) == 2
    assert "micro_batchez" in capsys.readouterr().err
    assert not (tmp_path / U.NOTEBOOK).exists()


def test_profiles_validate():
    for values in U.PROFILES.values():
        assert P.as_dict(P.build(U.Config, values)) == values  # every key known, every value kept as given


@pytest.mark.gpu
def test_tiny_model_on_the_gpu(tmp_path):
    """The CUDA trace's vocabulary: kernels with launches, the varlen kernel, the .item() syncs, the D2H copies."""
    folder, metrics = _run(tmp_path, "device=cuda", tag="gpu")
    s = metrics["summary"]
    assert s["timeline"] == "gpu_kernels" and metrics["model"]["varlen_kernel"]
    check_summary(metrics, folder)
    for category in ("attention", "gemm", "chunked_logprob", "optimizer"):
        assert s["categories"][category]["ms"] > 0, category
    # verl's loss.item() per micro-batch, the segments' .item(), grad_norm.item(), the final synchronize
    assert s["host_syncs"]["count"] >= metrics["workload"]["micro_batches"] + 2
    assert s["host_syncs"]["d2h_copies"]["count"] >= metrics["workload"]["micro_batches"]
    assert any(src["op"] != "(no operator)" for src in s["host_syncs"]["by_source"])
    check_flops(metrics, "tiny")
    assert metrics["timing"]["peak_allocated_gib"] > 0


def test_a_failed_run_keeps_its_own_error_when_a_revert_fails_too():
    """Session 23's OOM at 36 selective layers was recorded as cast_once's revert error; the run's own error wins."""
    import torch
    from conftest import gloo_world_of_one
    from test_cast_once import _forward_that_fails_midway, tiny_fsdp

    from rlkit import patches
    from rlkit.patches.fsdp import cast_once

    with gloo_world_of_one():
        try:
            patches.apply(["cast_once"])
            with pytest.raises(torch.OutOfMemoryError, match="the run's own failure"):
                try:
                    _forward_that_fails_midway(tiny_fsdp())  # leaves a bf16 copy in use, as the OOM did
                    raise torch.OutOfMemoryError("the run's own failure")
                finally:
                    U._revert([cast_once.PATCH])
            assert not cast_once.PATCH.active()
            patches.apply(["cast_once"])
            _forward_that_fails_midway(tiny_fsdp())
            with pytest.raises(RuntimeError, match="while forward/backward is using it"):
                U._revert([cast_once.PATCH])  # with no error in flight, the revert's own error is raised
        finally:
            patches.revert_all()
