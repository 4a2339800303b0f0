"""grad_prefetch: FSDP1 hands each flat parameter's final gradient to a listener as its reduction finishes, and tells
the listener the coefficient ``clip_grad_norm_`` scaled the gradients by.

What it is for: ``HostAdamW(prefetch_grads=True)`` (:mod:`rlkit.optim.prefetch`) copies each gradient to the host
during the last micro-batch's backward instead of after it, and multiplies the host copy by the clip coefficient
itself (docs/patches.md, "The host step overlapped with backward").

Which gradient is final: FSDP1 reduces a gradient (for NO_SHARD, all-reduces ``flat_param.grad`` in place) only in a
backward that synchronizes gradients, i.e. outside ``no_sync()``; verl 0.9.1's ``forward_backward_batch`` runs every
micro-batch but the last under ``no_sync()`` (``_gradient_sync_context``). The patch wraps
``torch.distributed.fsdp._runtime_utils._post_reduce_grad_callback``, which FSDP calls right after that reduction
(and the cast to the parameter's dtype), on the stream the reduction ran on; it calls the listener of the flat
parameter with ``flat_param.grad``, which FSDP's final callback leaves as it is for NO_SHARD. So a listener hears of
a gradient exactly when FSDP hands it over, once per synchronizing backward (with verl's
``use_no_sync_for_gradient_accumulation=false`` every micro-batch synchronizes and the last hand-over wins).
Sharded strategies (the gradient becomes a shard later) and FSDP's own CPU offload are not handed over.

The coefficient: ``FullyShardedDataParallel.clip_grad_norm_`` is wrapped: before it the listeners are told
(``before_clip``: their copies must have read the gradients before the clip scales them in place), after it they get
:func:`clip_coefficient` of the norm it returned, formed with torch's own ops, dtypes and device (the same
deterministic elementwise ops on the same operands give the same bits).
"""
from __future__ import annotations

import functools
import weakref
from typing import Protocol

import torch
from torch.utils.weak import WeakIdKeyDictionary

from rlkit.patches import Patch, replace_attrs, supported

RUNTIME = "torch.distributed.fsdp._runtime_utils"
FSDP_MODULE = "torch.distributed.fsdp.fully_sharded_data_parallel"
CLIP_EPS = 1e-6  # torch's clip_grad_norm_ (FSDP's and torch.nn.utils'): max_norm / (total_norm + 1e-6)


class Listener(Protocol):
    def final_grad(self, param: torch.Tensor, grad: torch.Tensor) -> None: ...
    def before_clip(self) -> None: ...
    def clipped(self, coefficient: torch.Tensor) -> None: ...


# flat parameter -> a weak reference to its Listener: neither keeps the other alive (an optimizer that goes away
# stops listening; a listener holds no parameter).
_listeners = WeakIdKeyDictionary()


def listen(params, listener: Listener) -> None:
    """Hand ``params``' final gradients and the clip coefficients of the modules holding them to ``listener`` (the
    last listener of a parameter replaces an earlier one)."""
    for p in params:
        _listeners[p] = weakref.ref(listener)


def listener_of(param: torch.Tensor) -> Listener | None:
    ref = _listeners.get(param)
    return ref() if ref is not None else None


def clip_coefficient(max_norm: float, total_norm: torch.Tensor) -> torch.Tensor:
    """The clamped coefficient ``clip_grad_norm_`` multiplies every gradient by, formed as torch 2.11-2.14 forms it
    (``torch.nn.utils._clip_grads_with_norm_`` and FSDP's sharded path alike), on ``total_norm``'s device and dtype."""
    return torch.clamp(float(max_norm) / (total_norm + CLIP_EPS), max=1.0)


def _hands_over(handle) -> bool:
    """The gradient in ``flat_param.grad`` after the reduction is the one the optimizer reads."""
    return not handle.uses_sharded_strategy and not handle._offload_params


def _apply():
    from torch.distributed.fsdp import _runtime_utils as runtime
    from torch.distributed.fsdp.fully_sharded_data_parallel import FullyShardedDataParallel as FSDP

    original_callback, original_clip = runtime._post_reduce_grad_callback, FSDP.clip_grad_norm_

    @functools.wraps(original_callback)
    def _post_reduce_grad_callback(state, handle, grad_to_offload):
        original_callback(state, handle, grad_to_offload)
        listener = listener_of(handle.flat_param)
        if listener is not None and _hands_over(handle) and handle.flat_param.grad is not None:
            listener.final_grad(handle.flat_param, handle.flat_param.grad)

    @functools.wraps(original_clip)
    def clip_grad_norm_(self, max_norm, norm_type=2.0):
        listeners = [one for one in dict.fromkeys(map(listener_of, self.parameters())) if one is not None]
        for listener in listeners:
            listener.before_clip()
        total_norm = original_clip(self, max_norm, norm_type)
        if listeners:
            coefficient = clip_coefficient(max_norm, total_norm)
            for listener in listeners:
                listener.clipped(coefficient)
        return total_norm

    _post_reduce_grad_callback.__rlkit_patch__ = clip_grad_norm_.__rlkit_patch__ = "grad_prefetch"
    return replace_attrs((runtime, "_post_reduce_grad_callback", _post_reduce_grad_callback),
                         (FSDP, "clip_grad_norm_", clip_grad_norm_))


PATCH = Patch(
    name="grad_prefetch",
    summary="FSDP1 NO_SHARD: hand each flat parameter's reduced gradient and the clip coefficient to a listener "
            "(HostAdamW's gradient prefetch)",
    requires=supported("torch"),
    apply_fn=_apply,
    targets=(RUNTIME, FSDP_MODULE),
)

apply = PATCH.apply
revert = PATCH.revert
active = PATCH.active
