"""Count the fp32 -> bf16 casts FSDP1 performs, and the bytes they read, for any arm.

FSDP1 with ``MixedPrecision(param_dtype=bf16)`` builds the bf16 compute copy of a flat parameter in
``FlatParamHandle._use_low_precision_shard``::

    flat_param._mp_shard.copy_(flat_param._local_shard.to(self.device, non_blocking=True))

For ``NO_SHARD`` that line runs in every pre-forward *and* every pre-backward unshard of every
handle, i.e. ``2 x micro-batches x flat params`` times per optimizer step; when the fp32 master
(``_local_shard``) lives on the host each call is also a host-to-device transfer of the fp32 bytes.
:class:`CastCounter` wraps exactly that method, so it counts real casts whatever else is patched
(``cast_once`` skips the call when the resident copy is valid; ``master_on_host`` only changes where
``_local_shard`` lives).
"""
from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, field

from rlkit.patches import replace_attr


@dataclass
class CastStats:
    """Casts since the last reset: how many, fp32 bytes read, and how many of those crossed host->device."""

    casts: int = 0
    bytes_read: int = 0
    host_to_device_casts: int = 0
    host_to_device_bytes: int = 0
    per_handle: dict[int, int] = field(default_factory=dict)  # id(handle) -> casts

    def as_dict(self) -> dict[str, int]:
        return {
            "casts": self.casts,
            "bytes_read": self.bytes_read,
            "host_to_device_casts": self.host_to_device_casts,
            "host_to_device_bytes": self.host_to_device_bytes,
            "handles_cast": len(self.per_handle),
        }


class CastCounter:
    """Wraps ``FlatParamHandle._use_low_precision_shard`` while active and tallies every call.

    Use ``with counter.active(): ...`` around the measured work and ``counter.take()`` to read and
    reset the tally at each optimizer-step boundary.
    """

    def __init__(self) -> None:
        self.stats = CastStats()

    @contextmanager
    def active(self):
        from torch.distributed.fsdp._flat_param import FlatParamHandle

        original = FlatParamHandle._use_low_precision_shard
        counter = self

        def counted_use_low_precision_shard(handle):
            source = handle.flat_param._local_shard
            nbytes = source.numel() * source.element_size()
            stats = counter.stats
            stats.casts += 1
            stats.bytes_read += nbytes
            if source.device != handle.device:
                stats.host_to_device_casts += 1
                stats.host_to_device_bytes += nbytes
            stats.per_handle[id(handle)] = stats.per_handle.get(id(handle), 0) + 1
            return original(handle)

        undo = replace_attr(FlatParamHandle, "_use_low_precision_shard", counted_use_low_precision_shard)
        try:
            yield self
        finally:
            undo()

    def take(self) -> CastStats:
        """The tally since the previous ``take()`` (and start a new one)."""
        stats, self.stats = self.stats, CastStats()
        return stats
