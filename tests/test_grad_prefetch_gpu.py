"""HostAdamW's gradient prefetch on CUDA: FSDP1 hands each gradient over on its reduction stream, the copies run on a
side stream into pinned host buffers beside the rest of backward, and the clip waits for them. The parameters and
both Adam moments after three clipped steps equal the serial step's, bit for bit.

No verl here: the node's profile jobs run on its own torch and transformers alone (the job ``prefetch-test``). The
step is verl 0.9.1's ``FSDPEngine.optimizer_step`` as it runs for an FSDP1 module without a grad scaler (FSDP's
``clip_grad_norm_``, the finite check, then ``step`` or ``zero_grad``) and the accumulation its
``_gradient_sync_context`` (``no_sync`` on every micro-batch but the last); tests/test_grad_prefetch.py runs the same
``train`` through verl itself on the CPU. Deterministic mode, with ``CUBLAS_WORKSPACE_CONFIG`` from the job, and the
serial run reproduces itself first, so a difference is the prefetch's, not the kernels'.
"""
from __future__ import annotations

from contextlib import nullcontext

import pytest
import torch
import torch.distributed as dist
from test_grad_prefetch import GRAD_CLIP, _check_run, assert_bit_identical, train

from rlkit import patches
from rlkit.experiments import update_phase as U

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


class VerlSequence:
    """What ``train`` calls of verl's FSDPEngine, in verl 0.9.1's order (module docstring)."""

    def __init__(self, module, optimizer) -> None:
        self.module, self.optimizer = module, optimizer

    def _gradient_sync_context(self, *, is_last_micro_batch: bool):
        return nullcontext() if is_last_micro_batch else self.module.no_sync()

    def optimizer_step(self) -> float:
        norm = self.module.clip_grad_norm_(GRAD_CLIP)
        if torch.isfinite(norm):
            self.optimizer.step()
        else:
            self.optimizer.zero_grad()
        return norm.item()


@pytest.fixture
def deterministic_world_of_one():
    from rlkit.measure import determinism

    determinism.enable(0)
    U.init_distributed("cuda")
    try:
        yield
    finally:
        dist.destroy_process_group()
        patches.revert_all()
        torch.use_deterministic_algorithms(False)
        torch.utils.deterministic.fill_uninitialized_memory = True  # torch's default, which enable() turned off


@pytest.mark.parametrize("overlap_copies", [False, True])
def test_prefetch_on_the_gpu_is_bit_identical(deterministic_world_of_one, overlap_copies):
    run = dict(device="cuda:0", engine=VerlSequence)
    ref, again = train(False, **run), train(False, **run)
    assert_bit_identical(again, ref)
    got = train(True, overlap_copies=overlap_copies, **run)
    _check_run(got, ref, None)
