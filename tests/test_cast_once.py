"""cast_once / master_on_host / cast_count on a tiny Qwen3 under real FSDP1 (CPU, gloo, world size 1).

Everything is compared with the unpatched computation: losses, fp32 gradients and updated masters
must be bit-identical (the bf16 compute copy's lifetime and the master's location change; what is
computed does not).
"""
from __future__ import annotations

import os

import pytest
import torch
from conftest import gloo_world_of_one
from torch.distributed.fsdp._flat_param import FlatParamHandle

from rlkit import patches
from rlkit.core.params import ParamError, build
from rlkit.experiments import cast_once as experiment
from rlkit.experiments import update_phase as U
from rlkit.patches.fsdp import cast_once
from rlkit.patches.fsdp.master_on_host import HostMasters, fsdp_handles
from rlkit.patches.instruments.cast_count import CastCounter

LR = 1e-2
SEQ = 16


@pytest.fixture(scope="module", autouse=True)
def module_process_group():
    with gloo_world_of_one():
        yield


@pytest.fixture(autouse=True)
def no_patches_leak():
    yield
    patches.revert_all()


def tiny_fsdp(device: str = "cpu"):
    return U.build_fsdp_model("tiny", torch.device(device), seed=0, gradient_checkpointing=True)


def batch(step: int, sequences: int) -> torch.Tensor:
    return U.make_minibatch(512, sequences, SEQ, seed=100 + step)


def train(arm: str, *, steps: int = 2, micro_batches: int = 3, host_adamw: bool = False, device: str = "cpu") -> dict:
    """``steps`` optimizer steps of arm A-D; returns losses, grads, masters, casts and resident checks."""
    spec = experiment.ARMS[arm]
    patches.apply([n for n in ("master_on_host", "cast_once") if spec[n]])
    model = tiny_fsdp(device)
    params = list(model.parameters())
    masters = HostMasters(model) if spec["master_on_host"] else None
    if masters is not None:
        masters.park()
    if host_adamw:
        optimizer = U.make_optimizer("host_pinned", params, lr=LR, weight_decay=0.1)  # steps exposed masters in place
    else:
        optimizer = torch.optim.AdamW(params, lr=LR, weight_decay=0.1)
    out = {"loss": [], "grads": [], "casts": [], "h2d": [], "resident_diff": [], "resident_after_step": [],
           "handles": len(fsdp_handles(model))}
    counter = CastCounter()
    with counter.active():
        for step in range(steps):
            out["loss"].append(U.run_fwd_bwd(model, batch(step, 2 * micro_batches), micro_batches, None))
            out["resident_diff"].append(cast_once.resident_vs_master_max_abs_diff(model))
            out["grads"].append([p.grad.clone() for p in params])
            if masters is not None:
                masters.step(optimizer)
            else:
                optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            out["resident_after_step"].append(sum(cast_once.is_resident(h) for h in fsdp_handles(model)))
            stats = counter.take()
            out["casts"].append(stats.casts)
            out["h2d"].append(stats.host_to_device_casts)
    if masters is not None:
        masters.unpark()
    out["masters"] = [p.detach().to("cpu", copy=True) for p in params]
    out["grads"] = [[g.to("cpu") for g in step] for step in out["grads"]]
    return out


def assert_bit_identical(result, reference):
    assert result["loss"] == reference["loss"]
    for got_step, ref_step in zip(result["grads"], reference["grads"], strict=True):
        for got, ref in zip(got_step, ref_step, strict=True):
            assert got.dtype == ref.dtype == torch.float32  # accumulated/finalised in fp32 like the baseline
            assert torch.equal(got, ref), (got - ref).abs().max()
    for got, ref in zip(result["masters"], reference["masters"], strict=True):
        assert torch.equal(got, ref), (got - ref).abs().max()


@pytest.fixture(scope="module")
def baseline():
    return train("A")


@pytest.mark.parametrize("arm", ["B", "C", "D"])
def test_arms_match_the_baseline_bit_for_bit(arm, baseline):
    assert_bit_identical(train(arm), baseline)


@pytest.mark.parametrize("micro_batches", [1, 3])
def test_cast_count_is_flat_params_with_cast_once_and_grows_with_micro_batches_without(micro_batches):
    unpatched, patched = train("A", micro_batches=micro_batches), train("D", micro_batches=micro_batches)
    handles = unpatched["handles"]
    # FSDP casts in every pre-forward and every pre-backward unshard of every handle.
    assert unpatched["casts"] == [2 * micro_batches * handles] * 2
    assert patched["casts"] == [handles] * 2


def test_resident_copy_is_fresh_at_steps_1_and_2_and_dropped_by_the_optimizer_step():
    result = train("B")
    assert result["resident_diff"] == [0.0, 0.0]  # step 2: re-cast from the master updated at step 1
    assert result["resident_after_step"] == [0, 0]


def test_host_adamw_steps_fire_the_invalidation_and_match_the_baseline():
    reference = train("A", host_adamw=True)
    for arm in ("B", "D"):
        result = train(arm, host_adamw=True)
        assert result["resident_after_step"] == [0, 0]
        assert_bit_identical(result, reference)


def test_a_master_write_outside_an_optimizer_leaves_a_stale_copy_that_the_check_catches():
    """Negative control: without invalidation the resident copy is stale, and the parity check says so."""
    patches.apply(["cast_once"])
    model = tiny_fsdp()
    micro = batch(0, 2)
    U.run_fwd_bwd(model, micro, 1, None)
    model.zero_grad(set_to_none=True)
    with torch.no_grad():  # an update that no optimizer hook sees
        for p in model.parameters():
            p.add_(0.05)
    stale_diff = cast_once.resident_vs_master_max_abs_diff(model)
    stale_loss = U.run_fwd_bwd(model, micro, 1, None)
    model.zero_grad(set_to_none=True)
    assert stale_diff > 0.0
    assert cast_once.invalidate(model) == len(fsdp_handles(model))
    fresh_loss = U.run_fwd_bwd(model, micro, 1, None)
    assert cast_once.resident_vs_master_max_abs_diff(model) == 0.0
    patches.revert_all()
    # The unpatched model with the same weights computes the re-cast loss, not the stale one.
    reference = tiny_fsdp()
    with torch.no_grad():
        for p in reference.parameters():
            p.add_(0.05)
    reference_loss = U.run_fwd_bwd(reference, micro, 1, None)
    assert fresh_loss == reference_loss != stale_loss


def test_no_grad_forwards_create_no_resident_copy():
    patches.apply(["cast_once"])
    model = tiny_fsdp()
    counter = CastCounter()
    with counter.active(), torch.no_grad():
        model(input_ids=batch(0, 2))
        model(input_ids=batch(0, 2))
    handles = fsdp_handles(model)
    assert not any(cast_once.is_resident(h) for h in handles)
    assert all(h.flat_param._mp_shard.untyped_storage().size() == 0 for h in handles)  # freed as unpatched
    assert counter.take().casts == 2 * len(handles)


def test_parked_master_leaves_the_device_and_comes_back_unchanged():
    patches.apply(["master_on_host"])
    model = tiny_fsdp()
    before = [p.detach().clone() for p in model.parameters()]
    masters = HostMasters(model)
    masters.park()
    for handle in masters.handles:
        assert handle.flat_param.untyped_storage().size() == 0  # device fp32 storage released
        assert handle.flat_param._local_shard is masters.host_master(handle)
        assert handle.flat_param.dtype == torch.float32
    assert masters.host_bytes() == sum(p.numel() * 4 for p in before)
    with masters.exposed() as exposed:
        assert all(torch.equal(p, b) for p, b in zip(exposed, before))
    masters.unpark()
    assert all(torch.equal(p, b) for p, b in zip(model.parameters(), before))
    assert all(h.flat_param._local_shard.untyped_storage().size() > 0 for h in masters.handles)


def test_host_masters_need_the_patch():
    model = tiny_fsdp()
    with pytest.raises(patches.PatchError, match="master_on_host patch"):
        HostMasters(model)


def test_apply_and_revert_restore_fsdp():
    names = ("pre_unshard", "post_reshard", "_use_sharded_flat_param", "_use_low_precision_shard")
    originals = {n: FlatParamHandle.__dict__[n] for n in names}
    patches.apply(["master_on_host", "cast_once"])
    patches.apply(["cast_once"])  # idempotent
    assert FlatParamHandle.__dict__["pre_unshard"] is not originals["pre_unshard"]
    assert FlatParamHandle.__dict__["_use_sharded_flat_param"] is not originals["_use_sharded_flat_param"]
    with CastCounter().active():
        assert FlatParamHandle.__dict__["_use_low_precision_shard"] is not originals["_use_low_precision_shard"]
    patches.revert_all()
    assert {n: FlatParamHandle.__dict__[n] for n in names} == originals
    assert patches.active() == []


def _forward_that_fails_midway(model):
    """A forward that raises inside the first decoder layer's FSDP unit, as an OOM there does: its bf16 copy is in use."""
    layer = next(m for m in model.modules() if type(m).__name__ == "Qwen3DecoderLayer")

    def out_of_memory(*_):
        raise torch.OutOfMemoryError("CUDA out of memory (raised by the test inside the layer)")

    layer.mlp.register_forward_pre_hook(out_of_memory)
    with pytest.raises(torch.OutOfMemoryError):
        U.run_fwd_bwd(model, batch(0, 2), 1, None)


def test_revert_after_a_forward_failed_midway_still_restores_fsdp():
    names = ("pre_unshard", "post_reshard")
    originals = {n: FlatParamHandle.__dict__[n] for n in names}
    patches.apply(["cast_once"])
    _forward_that_fails_midway(tiny_fsdp())
    with pytest.raises(RuntimeError, match="while forward/backward is using it"):
        cast_once.PATCH.revert()  # the copy the failed forward holds is reported
    assert {n: FlatParamHandle.__dict__[n] for n in names} == originals  # and FSDP is restored all the same
    assert not cast_once.PATCH.active()
    assert not cast_once._resident_handles  # nothing of the failed model is left for a later invalidate()


@pytest.mark.gpu
def test_on_cuda_the_master_is_cast_from_the_host_and_arms_stay_bit_exact():
    # Parity across arms needs deterministic kernels; cuBLAS reads its setting when its handle is created. The
    # raising mode: with warn_only=True torch keeps the non-deterministic attention backward (rlkit.measure.determinism).
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(True)
    try:
        reference = train("A", host_adamw=True, device="cuda")
        for arm in ("B", "C", "D"):
            result = train(arm, host_adamw=True, device="cuda")
            assert_bit_identical(result, reference)
            handles = result["handles"]
            expected_h2d = {"B": 0, "C": 2 * 3 * handles, "D": handles}[arm]
            assert result["h2d"] == [expected_h2d] * 2
    finally:
        torch.use_deterministic_algorithms(False)


@pytest.mark.parametrize("override, key", [
    ({"arms": ["B", "D"]}, "arms"),
    ({"steps": 1}, "steps"),
    ({"num_sequences": 5}, "num_sequences"),
    ({"device": "tpu"}, "device"),
])
def test_config_errors_name_the_key(override, key):
    from rlkit.core.results import load_profile

    values = {**load_profile(experiment.NOTEBOOK, "tiny"), **override}
    values.pop("noise_dir")  # notebook-only: left in, its own error (which lists every key) would match any key
    with pytest.raises(ParamError, match=rf"\b{key}="):  # the message starts with the offending key=value
        build(experiment.Config, values)


def test_verl_offload_cycle_adopts_the_host_masters_and_matches_the_baseline():
    """The cycle verl's param offload runs with master_on_host wired in (rlkit.patches.verl.master_on_host_verl):
    masters already on the host are adopted (no copy), FSDP computes from casts of them, the host optimizer
    steps them in place, and release leaves them where verl's offload expects them."""
    reference = train("A", host_adamw=True)
    patches.apply(["master_on_host", "cast_once"])
    model = tiny_fsdp()
    params = list(model.parameters())
    masters = HostMasters(model)
    optimizer = U.make_optimizer("host_pinned", params, lr=LR, weight_decay=0.1)
    losses = []
    for step in range(2):
        host = [p.data.data_ptr() for p in params]
        masters.park_offloaded()
        assert masters.parked and [m.data_ptr() for m in masters.masters()] == host  # adopted, not copied
        losses.append(U.run_fwd_bwd(model, batch(step, 6), 3, None))
        masters.step(optimizer)
        optimizer.zero_grad(set_to_none=True)
        masters.release_to_host()
        assert not masters.parked and [p.data_ptr() for p in params] == host
    assert losses == reference["loss"]
    for got, ref in zip(params, reference["masters"], strict=True):
        assert torch.equal(got.detach(), ref), (got.detach() - ref).abs().max()
