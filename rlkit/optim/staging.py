"""Host staging buffers: one growable buffer per tag, reused for every parameter and every step.

The CUDA copy engine DMAs only from page-locked (pinned) memory; a copy from pageable memory is staged
by the runtime through a hidden pinned bounce buffer. HostAdamW therefore moves every gradient down and
every parameter up through one pinned buffer per direction ("grad", "param"), sized to the largest
parameter. One buffer per tag, not one per parameter: per-parameter buffers would pin a second full copy
of the model (seed 000, Step 4).

Pinning needs CUDA. Without it the pool allocates ordinary memory and the copies still happen, so the
CPU code path is the same as the GPU one; :attr:`StagingPool.pinned` records what was obtained.

A pool on a device (``device=``) holds device buffers the same way (HostAdamW's rank-0 owner sends host
masters to the other ranks through one over NCCL).
"""
from __future__ import annotations

import torch


class StagingPool:
    """Growable byte buffers keyed by tag; :meth:`view` hands out a typed view of the first bytes.

    ``pin``: ``True`` pin (requires CUDA), ``False`` pageable, ``None`` pin exactly when CUDA is available.
    ``device``: where the buffers live; ``None`` the host (then ``pin`` applies), else that device (unpinned).
    ``allocations`` counts buffer (re)allocations, so callers and tests can check reuse.
    """

    def __init__(self, pin: bool | None = None, device: torch.device | str | None = None) -> None:
        cuda = torch.cuda.is_available()
        if pin and not cuda:
            raise ValueError("pin_memory=True needs CUDA (page-locked memory is a CUDA allocation). "
                             "Fix: pass pin_memory=None (pin when CUDA is available) or False.")
        self.device = torch.device("cpu") if device is None else torch.device(device)
        self.pinned: bool = device is None and (cuda if pin is None else bool(pin))
        self._buffers: dict[str, torch.Tensor] = {}
        self.allocations: int = 0

    def reserve(self, tag: str, nbytes: int) -> None:
        """Make the ``tag`` buffer hold at least ``nbytes`` (grows, never shrinks)."""
        current = self._buffers.get(tag)
        if current is not None and current.numel() >= nbytes:
            return
        self._buffers.pop(tag, None)  # drop the old one before allocating, so both never coexist
        self._buffers[tag] = torch.empty(nbytes, dtype=torch.uint8, device=self.device, pin_memory=self.pinned)
        self.allocations += 1

    def view(self, tag: str, numel: int, dtype: torch.dtype) -> torch.Tensor:
        """A 1-D ``dtype`` view of ``numel`` elements at the start of the ``tag`` buffer."""
        nbytes = numel * torch.empty((), dtype=dtype).element_size()
        self.reserve(tag, nbytes)
        return self._buffers[tag][:nbytes].view(dtype)

    def nbytes(self) -> dict[str, int]:
        return {tag: buf.numel() for tag, buf in self._buffers.items()}

    def release(self) -> None:
        self._buffers.clear()
