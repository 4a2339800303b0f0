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

Host memory too small: a host buffer larger than the host's available memory (``MemAvailable``) is refused
before anything is allocated, and an allocation torch itself refuses (the CPU allocator, or CUDA's page-locked
``cudaHostAlloc``) is re-raised; both as :class:`HostMemoryError`, naming the buffer, the bytes asked for and
available, and the fix. Checking first matters for pinned memory: page-locked pages cannot be swapped out, so
an over-large pin that the kernel grants page by page ends with the OOM killer's SIGKILL of a Ray worker, not
an error. ``rlkit preflight`` makes the same comparison for the whole of HostAdamW's host state before a launch.
"""
from __future__ import annotations

from collections.abc import Callable

import torch

from rlkit.measure.samplers import host_available_bytes

GIB = 2**30


class HostMemoryError(MemoryError):
    """A staging buffer does not fit in this host's memory; the message names the buffer, the sizes and the fix."""


class StagingPool:
    """Growable byte buffers keyed by tag; :meth:`view` hands out a typed view of the first bytes.

    ``pin``: ``True`` pin (requires CUDA), ``False`` pageable, ``None`` pin exactly when CUDA is available.
    ``device``: where the buffers live; ``None`` the host (then ``pin`` applies), else that device (unpinned).
    ``allocations`` counts buffer (re)allocations, so callers and tests can check reuse.
    """

    def __init__(self, pin: bool | None = None, device: torch.device | str | None = None, *,
                 available_bytes: Callable[[], int | None] = host_available_bytes) -> None:
        cuda = torch.cuda.is_available()
        if pin and not cuda:
            raise ValueError("pin_memory=True needs CUDA (page-locked memory is a CUDA allocation). "
                             "Fix: pass pin_memory=None (pin when CUDA is available) or False.")
        self.device = torch.device("cpu") if device is None else torch.device(device)
        self.pinned: bool = device is None and (cuda if pin is None else bool(pin))
        self._buffers: dict[str, torch.Tensor] = {}
        self.allocations: int = 0
        self._available_bytes = available_bytes  # this host's MemAvailable (None: unknown, torch's own check only)

    def reserve(self, tag: str, nbytes: int) -> None:
        """Make the ``tag`` buffer hold at least ``nbytes`` (grows, never shrinks)."""
        current = self._buffers.get(tag)
        if current is not None and current.numel() >= nbytes:
            return
        on_host = self.device.type == "cpu"
        available = self._available_bytes() if on_host else None
        if available is not None and nbytes > available + (current.numel() if current is not None else 0):
            raise self._too_large(tag, nbytes, available, "")
        self._buffers.pop(tag, None)  # drop the old one before allocating, so both never coexist
        try:
            self._buffers[tag] = torch.empty(nbytes, dtype=torch.uint8, device=self.device, pin_memory=self.pinned)
        except RuntimeError as err:  # torch.OutOfMemoryError and CUDA's errors are RuntimeErrors
            if not on_host:
                raise
            raise self._too_large(tag, nbytes, self._available_bytes(), f" torch refused it: {err}") from err
        self.allocations += 1

    def _too_large(self, tag: str, nbytes: int, available: int | None, detail: str) -> HostMemoryError:
        kind = "pinned (page-locked)" if self.pinned else "pageable"
        have = f"{available / GIB:.2f} GiB available (MemAvailable)" if available is not None else "its available memory unknown"
        return HostMemoryError(
            f"HostAdamW staging buffer {tag!r}: {nbytes / GIB:.2f} GiB of {kind} host memory requested, this host has "
            f"{have}.{detail} The buffer is sized to the largest flat parameter (4 bytes per fp32 element), next to "
            f"HostAdamW's fp32 master and Adam moments (12 bytes per parameter on each stepping rank). Fix: run "
            f"`rlkit preflight --host-gib auto` on the node for the whole host budget; free host memory (other jobs, "
            f"verl's param_offload copy), use rank0_owner=True (only rank 0 keeps Adam state and the grad buffer), "
            f"master_on_host (no separate master copy or param buffer), or a node with more memory.")

    def view(self, tag: str, numel: int, dtype: torch.dtype) -> torch.Tensor:
        """A 1-D ``dtype`` view of ``numel`` elements at the start of the ``tag`` buffer."""
        nbytes = numel * torch.empty((), dtype=dtype).element_size()
        self.reserve(tag, nbytes)
        return self._buffers[tag][:nbytes].view(dtype)

    def nbytes(self) -> dict[str, int]:
        return {tag: buf.numel() for tag, buf in self._buffers.items()}

    def release(self) -> None:
        self._buffers.clear()
