"""HostAdamW's overlapped copies: the schedule, and the streams it runs on (CUDA's, or a host stand-in).

With ``overlap_copies=True``, where every gradient is on a CUDA device, the staging is pinned and no broadcast
follows the step (no ``rank0_owner``), the copies run on a side stream beside the host's work: the next parameter's
gradient comes down while the host steps the current one, and the current one's parameter goes up while the host
steps the next (two staging buffers per direction, so a buffer is written again only after its copy has finished).
The arithmetic is the serial step's, parameter by parameter, so the result is bit-identical; the phases
``grad_d2h`` and ``param_h2d`` then time only the waits. Before returning, the compute stream is made to wait for
the last copies. Anywhere else the option leaves the serial step.

The schedule (:func:`step_overlapped`) touches streams only through a small set of primitives: the compute and side
streams of a device, an asynchronous copy on a stream, and an event recorded on a stream. :class:`CudaCopies`
implements them with CUDA streams and events (what HostAdamW uses by default). :class:`HostCopies` is a stand-in
for tests on a CPU machine: it runs the same schedule on host tensors, with copies that either complete when they
are issued (``deferred=False``: a buffer written too early is overwritten at once) or only when something waits for
them (``deferred=True``: a buffer read before its copy was waited for holds stale data). A schedule that gives the
serial step's bits under both orders waits where it must (tests/test_host_adamw.py).
"""
from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Any

import torch


class CudaCopies:
    """The overlapped schedule's primitives on CUDA: the current stream, one side stream per device, async copies."""

    def __init__(self) -> None:
        self._side: dict[torch.device, Any] = {}

    def usable(self, work, staging) -> bool:
        """DMA beside the host's work needs pinned staging and device gradients."""
        return staging.pinned and all(p.grad.is_cuda for _, p in work)

    def streams(self, device: torch.device):
        """(the compute stream, the side stream) of ``device``."""
        if device not in self._side:
            self._side[device] = torch.cuda.Stream(device)
        return torch.cuda.current_stream(device), self._side[device]

    def copy(self, stream, dst: torch.Tensor, src: torch.Tensor) -> None:
        with torch.cuda.stream(stream):
            dst.copy_(src, non_blocking=True)

    def record(self, stream):
        event = torch.cuda.Event()
        event.record(stream)
        return event


class HostStream:
    """A stream stand-in: work queued in order, run when issued (eager) or when waited for (deferred)."""

    def __init__(self, deferred: bool) -> None:
        self.deferred = deferred
        self._queue: deque[Callable[[], None]] = deque()
        self.issued = 0  # operations enqueued so far
        self.done = 0  # operations run so far (in order)

    def enqueue(self, work: Callable[[], None]) -> None:
        self._queue.append(work)
        self.issued += 1
        if not self.deferred:
            self.run_until(self.issued)

    def run_until(self, mark: int) -> None:
        while self.done < mark:
            self._queue.popleft()()
            self.done += 1

    def synchronize(self) -> None:
        self.run_until(self.issued)

    def wait_stream(self, other: HostStream) -> None:
        # Whatever runs on this stream next runs at once on the host: the other stream's work must be done first.
        other.synchronize()


class HostEvent:
    """An event stand-in: done when its stream has run every operation enqueued before it was recorded."""

    def __init__(self, stream: HostStream) -> None:
        self.stream, self.mark = stream, stream.issued

    def synchronize(self) -> None:
        self.stream.run_until(self.mark)

    def query(self) -> bool:
        return self.stream.done >= self.mark


class HostCopies:
    """The overlapped schedule's primitives on host tensors, for CPU tests of :func:`step_overlapped`.

    ``deferred=False``: a copy runs when it is issued; ``deferred=True``: only when an event recorded after it, its
    stream, or a stream waiting on its stream is synchronized. ``copies`` counts the copies issued."""

    def __init__(self, deferred: bool = False) -> None:
        self.deferred = deferred
        self.compute, self.side = HostStream(deferred), HostStream(deferred)
        self.copies = 0

    def usable(self, work, staging) -> bool:
        return True

    def streams(self, device: torch.device):
        return self.compute, self.side

    def copy(self, stream: HostStream, dst: torch.Tensor, src: torch.Tensor) -> None:
        self.copies += 1
        stream.enqueue(lambda: dst.copy_(src))

    def record(self, stream: HostStream) -> HostEvent:
        return HostEvent(stream)


def step_overlapped(opt, work, copies) -> None:
    """The serial step's arithmetic, parameter by parameter, with its copies on a side stream (module docstring).

    ``opt``: the HostAdamW (its staging pool, phases and ``_host_step``); ``work``: its (group, param) pairs;
    ``copies``: :class:`CudaCopies` or :class:`HostCopies`."""
    compute, side = copies.streams(work[0][1].grad.device)
    side.wait_stream(compute)  # the gradients are final on the compute stream
    up_done: list[Any] = [None, None]  # per param buffer: its last upload has finished

    def grad_down(k: int, buffer: int):
        p = work[k][1]
        prefetched = opt.prefetched_grad(p)  # already on the host (gradient prefetch): nothing to copy
        if prefetched is not None:
            return prefetched, copies.record(side)
        grad = opt.staging.view(f"grad{buffer}", p.numel(), torch.float32).view(p.shape)
        copies.copy(side, grad, p.grad)
        return grad, copies.record(side)

    pending = grad_down(0, 0)
    for k, (group, p) in enumerate(work):
        grad, down_done = pending
        if k + 1 < len(work):  # into the buffer parameter k - 1's host step read (finished), not the one k reads
            pending = grad_down(k + 1, (k + 1) % 2)
        with opt._phase("grad_d2h"):
            down_done.synchronize()
        master, in_place = opt._host_step(group, p, grad)
        if in_place:
            continue
        buffer = k % 2
        with opt._phase("param_pack"):
            if up_done[buffer] is not None:
                up_done[buffer].synchronize()  # the last upload from this buffer (parameter k - 2's) has read it
            out = opt.staging.view(f"param{buffer}", p.numel(), p.dtype).view(p.shape)
            out.copy_(master)
        with opt._phase("param_h2d"):
            copies.copy(side, p, out)
            up_done[buffer] = copies.record(side)
    compute.wait_stream(side)  # the next forward reads the parameters after their uploads
    side.synchronize()  # and the staging buffers are free for the next step
