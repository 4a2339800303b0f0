"""HostAdamW's gradient prefetch (``prefetch_grads=True``): the gradients' copy down overlapped with backward, exact.

During the last micro-batch's backward FSDP1 hands each flat parameter's final gradient over as its reduction
finishes (the ``grad_prefetch`` patch, :mod:`rlkit.patches.fsdp.grad_prefetch`); :class:`GradPrefetch` copies it at
once into a host buffer of its own (pinned on CUDA, on a side stream; on the CPU a plain copy), so the copies run
beside the rest of backward. Before ``clip_grad_norm_`` scales the device gradients in place, the compute stream
waits for those copies (they must read the unclipped gradients); after it, the patch hands over the clip coefficient
``c`` exactly as torch formed it. HostAdamW's step then takes each host gradient times ``c`` instead of copying the
clipped device gradient down: one IEEE fp32 multiplication of the same two operands the device multiplied, correctly
rounded on the CPU as on the GPU (neither is built with flush-to-zero), so the host gradient equals the one the serial
step copies down, bit for bit, and the AdamW after it is the serial step's. Nothing is stepped before the step, so
the non-finite skip is unchanged.

What a prefetched gradient needs to be used: fp32, handed over since the last step, and a clip after its hand-over
(verl's ``optimizer_step`` always clips). Without a clip, or after a later backward, the step copies the device
gradient down as before (exact either way). The buffers hold every gradient: 4 bytes a parameter of host memory on
each stepping rank, which the pre-flight counts (:func:`rlkit.planning.host_memory.host_adamw_bytes`).
"""
from __future__ import annotations

import torch

from rlkit.patches.fsdp import grad_prefetch


class GradPrefetch:
    """The host copies of ``params``' final gradients and the clip coefficient that followed them.

    ``staging``: the optimizer's :class:`rlkit.optim.staging.StagingPool` (a buffer per parameter, tagged
    ``prefetch<i>``); ``copies``: the stream primitives (:class:`rlkit.optim.overlap.CudaCopies`, or
    :class:`rlkit.optim.overlap.HostCopies` in CPU tests)."""

    def __init__(self, params, staging, copies) -> None:
        if not grad_prefetch.active():
            raise ValueError("HostAdamW(prefetch_grads=True) needs the grad_prefetch patch, which hands it FSDP's "
                             "final gradients and the clip coefficient. Fix: apply it first (RLKIT_PATCHES=...,"
                             "grad_prefetch, or the recipe's host_prefetch_grads: true), or pass prefetch_grads=False.")
        params = list(params)
        self._index = {id(p): i for i, p in enumerate(params)}  # ids only: holding a parameter would keep it alive
        self._staging, self._copies = staging, copies
        self._copied: dict[int, tuple[torch.Tensor, object]] = {}  # id(param) -> (host copy, its copy's event)
        self._sides: dict[torch.device, object] = {}  # device -> the side stream its copies ran on
        self._coefficient: torch.Tensor | None = None  # host fp32 clip coefficient since the last hand-over
        grad_prefetch.listen(params, self)

    # ------------------------------------------------------------------ the patch's listener
    def final_grad(self, param: torch.Tensor, grad: torch.Tensor) -> None:
        """Copy ``grad`` (as FSDP hands it over) to this parameter's host buffer, beside the backward."""
        self._coefficient = None  # a clip before this hand-over does not apply to it
        if grad.dtype != torch.float32:
            self._copied.pop(id(param), None)  # a clip of a low-precision gradient rounds the norm: copy it later
            return
        host = self._staging.view(f"prefetch{self._index[id(param)]}", grad.numel(), torch.float32).view(grad.shape)
        if not self._copies.usable([(None, param)], self._staging):  # a CPU gradient, or pageable staging: copy now
            host.copy_(grad)
            self._copied[id(param)] = (host, None)
            return
        compute, side = self._copies.streams(grad.device)  # compute: the stream FSDP reduced the gradient on
        self._sides[grad.device] = side
        side.wait_stream(compute)
        self._copies.copy(side, host, grad)
        self._copied[id(param)] = (host, self._copies.record(side))

    def before_clip(self) -> None:
        """The clip scales the gradients in place: the copies reading them finish first."""
        for device, side in self._sides.items():
            compute, _ = self._copies.streams(device)  # the stream the clip runs on
            compute.wait_stream(side)

    def clipped(self, coefficient: torch.Tensor) -> None:
        self._coefficient = coefficient.to("cpu") if coefficient.dtype == torch.float32 else None

    # ------------------------------------------------------------------ HostAdamW's side
    def take(self, param: torch.Tensor) -> torch.Tensor | None:
        """``param``'s clipped gradient on the host (its copy times the coefficient), or None: copy it down."""
        entry = self._copied.pop(id(param), None)
        if entry is None or self._coefficient is None or entry[0].shape != param.grad.shape:
            return None
        host, copied = entry
        if copied is not None:
            copied.synchronize()
        return host.mul_(self._coefficient)

    def discard(self) -> None:
        """Forget the copies and the coefficient (after a step, a skipped step, ``zero_grad``); pending copies finish
        first, so no device gradient is freed while a copy still reads it."""
        for _, copied in self._copied.values():
            if copied is not None:
                copied.synchronize()
        self._copied.clear()
        self._coefficient = None
