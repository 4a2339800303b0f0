"""HostAdamW(prefetch_grads=True): each final gradient copied to the host as FSDP1 hands it over in the last
micro-batch's backward, clipped there by verl's coefficient, equals the serial HostAdamW step bit for bit.

Real FSDP1 (NO_SHARD, bf16 compute, fp32 reduce, as verl wraps the actor) on gloo, several micro-batches accumulated
under verl's own ``_gradient_sync_context``, verl's own ``FSDPEngine.optimizer_step`` (FSDP's ``clip_grad_norm_``, its
finite check, the step or ``zero_grad``), ``grad_clip`` small enough that the coefficient is below 1 at every step.
Compared after every step: the parameters (on the CPU each flat parameter is its own fp32 master), ``exp_avg``,
``exp_avg_sq`` and ``step``, with ``torch.equal``. The copies run on :class:`rlkit.optim.overlap.HostCopies`, the CPU
stand-in for CUDA streams; deferred, a copy runs only when something waits for it, so a prefetch that the clip did not
wait for would read clipped gradients and be clipped twice. Arm 5's update (master_on_host wired into verl's train
mode, cast_once) is checked the same way through verl's ``train_mode`` and ``optimizer_step``.
"""
from __future__ import annotations

import json
import math
import sys
import tempfile
import traceback
from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist
from conftest import fresh_paths, gloo_world_of_one, spawn_two_ranks

from rlkit import patches
from rlkit.experiments import update_phase as U
from rlkit.optim import HostAdamW
from rlkit.optim.overlap import HostCopies
from rlkit.patches.fsdp.grad_prefetch import clip_coefficient

pytestmark = pytest.mark.verl
LR, SEQ, VOCAB, MICRO_BATCHES = 1e-2, 16, 512, 3
GRAD_CLIP = 0.05  # below every step's gradient norm here, so the clip coefficient is below 1 (asserted); docs/patches.md


@pytest.fixture(autouse=True)
def no_patches_leak():
    yield
    patches.revert_all()


def _verl_engine(module, optimizer):
    """verl's FSDPEngine around a CPU FSDP1 module, with what ``_gradient_sync_context`` and ``optimizer_step`` read
    (its __init__ builds the model on an accelerator)."""
    from verl.workers.engine.fsdp.transformer_impl import FSDPEngine

    engine = FSDPEngine.__new__(FSDPEngine)
    engine.module, engine.optimizer = module, optimizer
    engine.engine_config = SimpleNamespace()  # use_no_sync_for_gradient_accumulation: verl's default, True
    engine.optimizer_config = SimpleNamespace(clip_grad=GRAD_CLIP)
    engine.scaler, engine._qat_enabled = None, False
    return engine


def _fwd_bwd(engine, tokens: torch.Tensor, poison: bool) -> None:
    """verl's accumulation: every micro-batch but the last under its ``_gradient_sync_context`` (no_sync); ``poison``
    makes the last micro-batch's loss, hence the handed-over gradients, non-finite."""
    chunks = tokens.chunk(MICRO_BATCHES)
    for i, chunk in enumerate(chunks):
        with engine._gradient_sync_context(is_last_micro_batch=i == len(chunks) - 1):
            loss = engine.module(input_ids=chunk, labels=chunk).loss / len(chunks)
            (loss * math.inf if poison and i == len(chunks) - 1 else loss).backward()


def train(prefetch: bool, *, steps: int = 3, poison_step: int | None = None, rank: int = 0, world: int = 1,
          deferred: bool = True, overlap_copies: bool = False, device: str = "cpu", engine=None) -> dict:
    """``steps`` verl updates of the tiny FSDP1 model with HostAdamW, serial or with the gradient prefetch (on CUDA
    with CUDA's streams and pinned buffers, on the CPU with :class:`HostCopies`); ``engine(module, optimizer)``
    stands in for verl's engine where verl is absent (tests/test_grad_prefetch_gpu.py)."""
    if prefetch:
        patches.apply(["grad_prefetch"])
    model = U.build_fsdp_model("tiny", torch.device(device), seed=0, gradient_checkpointing=False)
    params = list(model.parameters())
    optimizer = HostAdamW(params, lr=LR, weight_decay=0.1, prefetch_grads=prefetch, overlap_copies=overlap_copies,
                          copy_streams=HostCopies(deferred=deferred) if device == "cpu" else None)
    engine = (engine or _verl_engine)(model, optimizer)
    out = {"norm": [], "coefficient": [], "prefetched": [], "skipped": [], "state": []}
    for step in range(steps):
        optimizer.zero_grad()
        tokens = U.make_minibatch(VOCAB, 4 * MICRO_BATCHES * world, SEQ, rank=rank, world_size=world, seed=100 + step)
        _fwd_bwd(engine, tokens.to(device), poison=step == poison_step)
        optimizer.last_step_prefetched = -1  # stays -1 when verl skips the step
        norm = engine.optimizer_step()
        out["norm"].append(norm)
        out["coefficient"].append(clip_coefficient(GRAD_CLIP, torch.tensor(norm, dtype=torch.float32)).item())
        out["prefetched"].append(optimizer.last_step_prefetched)
        assert optimizer.last_step_prefetched == -1 or optimizer.last_step_overlapped == overlap_copies
        out["state"].append([(p.detach().clone(), {k: v.clone() for k, v in optimizer.state[p].items()})
                             for p in params])
    out["params"] = len(params)
    return out


def assert_bit_identical(got: dict, ref: dict) -> None:
    assert [repr(n) for n in got["norm"]] == [repr(n) for n in ref["norm"]]  # repr: nan equals nan
    for step, (got_step, ref_step) in enumerate(zip(got["state"], ref["state"], strict=True)):
        for (p, state), (p_ref, state_ref) in zip(got_step, ref_step, strict=True):
            assert torch.equal(p, p_ref), (step, (p - p_ref).abs().max().item())
            assert state.keys() == state_ref.keys() == {"step", "exp_avg", "exp_avg_sq"}
            for key in state:
                assert torch.equal(state[key], state_ref[key]), (step, key, (state[key] - state_ref[key]).abs().max())


def _check_run(got: dict, ref: dict, poison_step: int | None) -> None:
    assert_bit_identical(got, ref)
    for step, (c, prefetched, serial) in enumerate(zip(got["coefficient"], got["prefetched"], ref["prefetched"])):
        if step == poison_step:  # verl's finite check skips the step (zero_grad) in both runs
            assert not math.isfinite(got["norm"][step]) and prefetched == serial == -1
            continue
        assert c < 1.0, f"step {step}: grad_clip {GRAD_CLIP} does not clip (coefficient {c})"
        assert prefetched == got["params"] and serial == 0  # every gradient came from its prefetched copy


@pytest.mark.parametrize("overlap_copies", [False, True])
@pytest.mark.parametrize("deferred", [False, True])
def test_prefetch_through_verls_optimizer_step_is_bit_identical_on_one_rank(deferred, overlap_copies):
    """Also with the overlapped copies' schedule (its gradients then come from the prefetched copies)."""
    with gloo_world_of_one():
        ref = train(False)
        got = train(True, deferred=deferred, overlap_copies=overlap_copies)
    _check_run(got, ref, None)


def _two_rank_worker(rank: int, store_path: str, out_dir: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{store_path}", rank=rank, world_size=2)
    try:
        result = {}
        for poison_step in (None, 1):
            ref = train(False, steps=3, poison_step=poison_step, rank=rank, world=2)
            got = train(True, steps=3, poison_step=poison_step, rank=rank, world=2)
            patches.revert_all()
            try:
                _check_run(got, ref, poison_step)
                result[str(poison_step)] = "ok"
            except AssertionError:
                result[str(poison_step)] = f"FAILED: {traceback.format_exc()}"
        with open(f"{out_dir}/rank{rank}.json", "w") as fh:
            json.dump(result, fh)
    finally:
        dist.destroy_process_group()


def test_prefetch_on_two_gloo_ranks_with_accumulation_clipping_and_a_non_finite_step_is_bit_identical():
    """Two ranks, different data, gradients all-reduced by FSDP in the last micro-batch's backward; three verl steps
    with the coefficient below 1, then the same with the middle step's gradients non-finite (verl skips it)."""
    with tempfile.TemporaryDirectory() as tmp:
        _, out_dir = spawn_two_ranks(_two_rank_worker, fresh_paths(tmp, "rdzv", ""))
        for rank in range(2):
            with open(f"{out_dir}/rank{rank}.json") as fh:
                assert json.load(fh) == {"None": "ok", "1": "ok"}, rank


def _arm5(prefetch: bool, steps: int = 2) -> dict:
    """Arm 5's update through verl's own engine: master_on_host (its verl wiring: the masters adopted from verl's param
    offload, exposed to HostAdamW in ``optimizer_step``) and cast_once, with the clip active."""
    from test_master_on_host_verl import _verl_engine as train_mode_engine

    from rlkit.patches.verl import master_on_host_verl

    patches.apply(["master_on_host", "cast_once", *(["grad_prefetch"] if prefetch else [])])
    master_on_host_verl.PATCH.apply()
    try:
        model = U.build_fsdp_model("tiny", torch.device("cpu"), seed=0, gradient_checkpointing=True)
        params = list(model.parameters())
        optimizer = HostAdamW(params, lr=LR, weight_decay=0.1, prefetch_grads=prefetch)
        engine = train_mode_engine(model, optimizer)
        engine.optimizer_config.clip_grad = GRAD_CLIP
        out = {"norm": [], "prefetched": [], "state": []}
        for step in range(steps):
            with engine.train_mode(), engine.train_mode(disable_auto_offload=True):
                assert master_on_host_verl.host_masters(engine) is not None
                _fwd_bwd(engine, U.make_minibatch(VOCAB, 4 * MICRO_BATCHES, SEQ, seed=100 + step), poison=False)
                out["norm"].append(engine.optimizer_step())
                out["prefetched"].append(optimizer.last_step_prefetched)
            out["state"].append([(p.detach().clone(), {k: v.clone() for k, v in optimizer.state[p].items()})
                                 for p in params])
        out["params"] = len(params)
        return out
    finally:
        master_on_host_verl.PATCH.revert()
        patches.revert_all()


def test_prefetch_under_arm_5s_train_mode_through_verls_engine_is_bit_identical(monkeypatch):
    from verl.utils import fsdp_utils
    from verl.workers.engine import base
    from verl.workers.engine.fsdp import transformer_impl

    # A CPU machine has no accelerator: let verl's context switch name one (the wiring never loads to it).
    for module in (base, transformer_impl):
        monkeypatch.setattr(module, "get_device_name", lambda: "cuda")
    monkeypatch.setattr(fsdp_utils, "get_torch_device", lambda: SimpleNamespace(empty_cache=lambda: None))
    with gloo_world_of_one():
        ref, got = _arm5(False), _arm5(True)
    assert_bit_identical(got, ref)
    assert all(clip_coefficient(GRAD_CLIP, torch.tensor(n)).item() < 1.0 for n in got["norm"])
    assert ref["prefetched"] == [0, 0] and got["prefetched"] == [got["params"]] * 2


def test_the_coefficient_is_the_one_fsdps_clip_multiplied_by():
    """The recomputed coefficient times each unclipped gradient is FSDP's clipped gradient, bit for bit."""
    with gloo_world_of_one():
        model = U.build_fsdp_model("tiny", torch.device("cpu"), seed=0, gradient_checkpointing=False)
        tokens = U.make_minibatch(VOCAB, 4, SEQ, seed=7)
        model(input_ids=tokens, labels=tokens).loss.backward()
        unclipped = [p.grad.clone() for p in model.parameters()]
        coefficient = clip_coefficient(GRAD_CLIP, model.clip_grad_norm_(GRAD_CLIP))
        assert coefficient.item() < 1.0
        for p, grad in zip(model.parameters(), unclipped, strict=True):
            assert torch.equal(grad * coefficient, p.grad)


def test_hostadamws_own_non_finite_skip_is_unchanged():
    """Stepped without verl's finite check, HostAdamW's own skip leaves everything untouched, prefetch or not."""
    with gloo_world_of_one():
        runs = []
        for prefetch in (False, True):
            if prefetch:
                patches.apply(["grad_prefetch"])
            model = U.build_fsdp_model("tiny", torch.device("cpu"), seed=0, gradient_checkpointing=False)
            optimizer = HostAdamW(list(model.parameters()), lr=LR, prefetch_grads=prefetch)
            tokens = U.make_minibatch(VOCAB, 4, SEQ, seed=3)
            (model(input_ids=tokens, labels=tokens).loss * math.inf).backward()
            model.clip_grad_norm_(GRAD_CLIP)
            optimizer.step()
            assert optimizer.last_step_skipped and not optimizer.state
            runs.append([p.detach().clone() for p in model.parameters()])
        assert all(map(torch.equal, *runs))


def test_without_fsdp_or_a_clip_the_step_copies_the_gradient_down():
    """No process group, a plain module: nothing is handed over, so the step is the serial one (and a prefetch is
    used only after a clip that followed it)."""
    patches.apply(["grad_prefetch"])
    runs = []
    for prefetch in (False, True):
        torch.manual_seed(0)
        model = torch.nn.Linear(8, 4)
        optimizer = HostAdamW(list(model.parameters()), lr=LR, prefetch_grads=prefetch)
        for _ in range(2):
            optimizer.zero_grad()
            model(torch.ones(2, 8)).square().sum().backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), GRAD_CLIP)
            optimizer.step()
            assert optimizer.last_step_prefetched == 0
        runs.append([p.detach().clone() for p in model.parameters()])
    assert all(map(torch.equal, *runs))


def test_prefetch_without_the_patch_is_a_clear_error():
    with pytest.raises(ValueError, match="grad_prefetch patch.*Fix"):
        HostAdamW([torch.nn.Parameter(torch.zeros(2))], prefetch_grads=True)


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
