"""Emulate a smaller GPU (seed 000's 48 GB RTX A6000: 47.4 GiB CUDA total) on a bigger one.

Two things make a process behave as on a card of ``E`` GiB shared by every process on that GPU:

1. ``torch.cuda.mem_get_info`` reports that card: total ``E`` and free ``E - used``, where ``used`` is
   what every process on the real device holds (``total - free`` as the driver reports it). vLLM reads
   exactly this at start-up (``MemorySnapshot.measure`` -> ``current_platform.mem_get_info``, resolved
   on ``torch.cuda`` at call time) to check ``gpu_memory_utilization`` against free memory and to size
   its KV cache, so vLLM sizes itself as on the small card and fails the same check the seed's Step 0
   hit when the actor still holds memory. Differences of two readings are unchanged (the shift is a
   constant), so vLLM's profiling arithmetic is unaffected.
2. The caching allocator of the process is capped at ``E`` on the device it uses
   (``torch.cuda.set_per_process_memory_fraction``), so an actor that needs more than the card raises
   the same ``OutOfMemoryError`` it would raise there. The cap is set when the process selects a device
   (``torch.cuda.set_device``, which verl's workers and vLLM's workers call) or, with one visible device,
   when it first initialises CUDA (``torch.cuda._lazy_call``); this module never creates a CUDA
   context on a device the process would not use.

What one process cannot see is the sum over processes: the cap is per process, so a check that the
actor and the sleeping vLLM together stay within ``E`` is made from the device-wide 1 Hz samples
(:class:`rlkit.measure.samplers.MemorySampler`), which the recipe records as ``peak_used_gib`` per GPU.

verl processes install this through the rlkit plugin when ``RLKIT_EMULATE_GPU_GIB`` is set.
"""
from __future__ import annotations

import os

ENV = "RLKIT_EMULATE_GPU_GIB"
GIB = 2**30
_state: dict = {}


def requested_gib(environ=os.environ) -> float | None:
    """The emulated card size from ``RLKIT_EMULATE_GPU_GIB`` (None when unset, blank or 0)."""
    raw = environ.get(ENV, "").strip()
    if not raw:
        return None
    try:
        gib = float(raw)
    except ValueError as err:
        raise ValueError(f"{ENV}={raw!r} is not a number. Fix: the emulated card's memory in GiB, e.g. 47.4, "
                         f"or unset it") from err
    if gib < 0:
        raise ValueError(f"{ENV}={raw!r} is negative. Fix: a size in GiB such as 47.4, or 0 for no emulation")
    return gib or None


def emulated_mem_info(free: int, total: int, card_bytes: int) -> tuple[int, int]:
    """(free, total) of the emulated card given the real device's reading."""
    if card_bytes >= total:
        return free, total
    used = total - free
    return max(card_bytes - used, 0), card_bytes


def install(gib: float) -> dict:
    """Emulate a card of ``gib`` GiB in this process (idempotent; a second size is an error)."""
    import torch

    if _state:
        if _state["gib"] != gib:
            raise ValueError(f"card emulation already installed at {_state['gib']} GiB; cannot switch to {gib}")
        return dict(_state["info"])
    card_bytes = int(gib * GIB)
    real_mem_get_info = torch.cuda.mem_get_info

    def mem_get_info(device=None):
        free, total = real_mem_get_info(device)
        return emulated_mem_info(free, total, card_bytes)

    mem_get_info.__wrapped__ = real_mem_get_info
    torch.cuda.mem_get_info = mem_get_info
    caps: dict[int, float] = {}

    def cap(index: int) -> None:
        total = torch.cuda.get_device_properties(index).total_memory
        caps[index] = min(1.0, card_bytes / total)
        torch.cuda.set_per_process_memory_fraction(caps[index], index)

    def cap_single_device() -> None:
        # With several devices visible, capping here would touch (and create a context on) a device the
        # process may never use; the set_device wrapper caps the device it selects instead.
        if torch.cuda.device_count() == 1 and 0 not in caps:
            cap(0)

    real_set_device = torch.cuda.set_device

    def set_device(device) -> None:
        real_set_device(device)
        index = torch.cuda._utils._get_device_index(device)
        if index >= 0 and index not in caps:
            cap(index)

    set_device.__wrapped__ = real_set_device
    torch.cuda.set_device = set_device
    torch.cuda._lazy_call(cap_single_device)
    info = {"gib": gib, "mem_get_info": "emulated", "allocator_cap": "per process, on the device it selects"}
    _state.update(gib=gib, info=info, caps=caps, real=real_mem_get_info, real_set_device=real_set_device)
    return dict(info)


def uninstall() -> None:
    """Restore ``torch.cuda.mem_get_info`` and lift the caps set so far (tests, interactive use)."""
    import torch

    if not _state:
        return
    torch.cuda.mem_get_info = _state["real"]
    torch.cuda.set_device = _state["real_set_device"]
    for index in _state["caps"]:
        torch.cuda.set_per_process_memory_fraction(1.0, index)
    _state.clear()


def caps() -> dict[int, float]:
    """Allocator fractions applied per device index so far (empty before CUDA initialised)."""
    return dict(_state.get("caps", {}))
