"""Measurement helpers shared by every experiment.

- :class:`PhaseTimer`: wall-clock per named phase, synchronised on CUDA so asynchronous kernels are
  counted in the phase that launched them; resets the CUDA peak-memory counter at each phase start
  so every phase reports its own peak.
- :func:`host_rss_gib` / :func:`host_peak_rss_gib`: resident host memory of this process.
- :class:`MetricsRecorder`: collects scalars, rows and phases and writes ``metrics.json`` atomically.
"""
from __future__ import annotations

import os
import resource
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from rlkit.core.jsonio import write_json_atomic

GIB = 2**30


def _cuda():
    try:
        import torch
    except ImportError:
        return None
    return torch.cuda if torch.cuda.is_available() and torch.cuda.is_initialized() else None


def cuda_sync() -> None:
    cuda = _cuda()
    if cuda is not None:
        cuda.synchronize()


def device_allocated_gib() -> float:
    cuda = _cuda()
    return cuda.memory_allocated() / GIB if cuda is not None else 0.0


def host_rss_gib() -> float:
    """Current resident set size of this process (Linux /proc; falls back to the peak)."""
    try:
        with open("/proc/self/statm") as f:
            pages = int(f.read().split()[1])
        return pages * os.sysconf("SC_PAGE_SIZE") / GIB
    except OSError:
        return host_peak_rss_gib()


def host_peak_rss_gib() -> float:
    """Peak resident set size of this process so far (ru_maxrss is KiB on Linux)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / GIB


class PhaseTimer:
    """Times named phases; each phase gets seconds, peak device GiB and host RSS at its end.

    Repeated phases accumulate seconds and keep the maximum peak, so a per-micro-batch phase sums
    naturally over a step.
    """

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self.peak_device_gib: dict[str, float] = {}
        self.host_rss_gib: dict[str, float] = {}
        self.counts: dict[str, int] = {}

    @contextmanager
    def phase(self, name: str):
        cuda = _cuda()
        cuda_sync()
        if cuda is not None:
            cuda.reset_peak_memory_stats()
        start = time.perf_counter()
        try:
            yield
        finally:
            cuda_sync()
            elapsed = time.perf_counter() - start
            self.seconds[name] = self.seconds.get(name, 0.0) + elapsed
            self.counts[name] = self.counts.get(name, 0) + 1
            peak = cuda.max_memory_allocated() / GIB if cuda is not None else 0.0
            self.peak_device_gib[name] = max(self.peak_device_gib.get(name, 0.0), peak)
            self.host_rss_gib[name] = max(self.host_rss_gib.get(name, 0.0), host_rss_gib())

    def as_dict(self) -> dict[str, Any]:
        return {
            name: {
                "seconds": self.seconds[name],
                "count": self.counts[name],
                "peak_device_gib": self.peak_device_gib[name],
                "host_rss_gib": self.host_rss_gib[name],
            }
            for name in self.seconds
        }


class MetricsRecorder:
    """Accumulates a run's metrics and writes them as ``metrics.json``."""

    def __init__(self, **initial: Any) -> None:
        self.data: dict[str, Any] = dict(initial)

    def set(self, **values: Any) -> None:
        self.data.update(values)

    def append(self, key: str, row: dict[str, Any]) -> None:
        self.data.setdefault(key, []).append(row)

    def write(self, out_dir: str | os.PathLike) -> Path:
        return write_json_atomic(Path(out_dir) / "metrics.json", self.data)


class SamplerUnavailable(RuntimeError):
    """The memory a sampler should read cannot be read here (GPU: neither NVML (nvidia-ml-py) nor nvidia-smi;
    host: no /proc/meminfo)."""


def visible_gpus(devices: list[tuple[int, str]], cuda_visible_devices: str | None) -> list[int]:
    """Which of the machine's GPUs (``(index, uuid)`` as NVML lists them) this process's CUDA sees, in CUDA's
    order. NVML ignores ``CUDA_VISIBLE_DEVICES``; a sampler beside a job on some GPUs of a shared machine must
    not read the others. Entries are indices or (prefixes of) UUIDs; as in CUDA, the list ends at the first
    entry that names no device. Unset: every GPU."""
    if cuda_visible_devices is None:
        return [index for index, _ in devices]
    chosen: list[int] = []
    for entry in (e.strip() for e in cuda_visible_devices.split(",")):
        if entry.isdigit():
            match = [index for index, _ in devices if index == int(entry)]
        else:
            match = [index for index, uuid in devices if entry and uuid.startswith(entry)]
        if len(match) != 1 or match[0] in chosen:
            break
        chosen.append(match[0])
    return chosen


def _nvml_visible_handles(pynvml) -> list:
    """NVML handles of the GPUs this process's CUDA sees, in CUDA's order."""
    pynvml.nvmlInit()
    handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
    uuids = [pynvml.nvmlDeviceGetUUID(h) for h in handles]
    devices = [(i, u.decode() if isinstance(u, bytes) else u) for i, u in enumerate(uuids)]
    return [handles[i] for i in visible_gpus(devices, os.environ.get("CUDA_VISIBLE_DEVICES"))]


def _nvml_reader():
    import pynvml  # provided by nvidia-ml-py

    handles = _nvml_visible_handles(pynvml)

    def read() -> list[float]:
        return [pynvml.nvmlDeviceGetMemoryInfo(h).used / GIB for h in handles]

    return read


def _require_nvidia_smi() -> None:
    import shutil

    if not shutil.which("nvidia-smi"):
        raise SamplerUnavailable("no NVML bindings (pip install nvidia-ml-py) and no nvidia-smi on PATH")


def _smi(query: str) -> str:
    """``nvidia-smi --query-<query> --format=csv,noheader,nounits``."""
    import subprocess

    return subprocess.run(["nvidia-smi", f"--query-{query}", "--format=csv,noheader,nounits"],
                          capture_output=True, text=True, timeout=10, check=True).stdout


def _smi_rows(query: str) -> list[list[str]]:
    """:func:`_smi`'s rows, each split into its stripped fields."""
    return [[field.strip() for field in line.split(",")] for line in _smi(query).strip().splitlines()]


def _smi_reader():
    _require_nvidia_smi()
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")

    def read() -> list[float]:
        rows = _smi_rows("gpu=index,uuid,memory.used")
        used = {int(index): int(mib) / 1024 for index, _, mib in rows}
        return [used[i] for i in visible_gpus([(int(index), uuid) for index, uuid, _ in rows], visible)]

    return read


def gpu_memory_reader():
    """A function returning used GiB per GPU this process's CUDA sees (``CUDA_VISIBLE_DEVICES``): NVML where
    nvidia-ml-py is installed, else nvidia-smi."""
    try:
        return _nvml_reader(), "nvml"
    except ImportError:
        return _smi_reader(), "nvidia-smi"


PROCESS_NAME_CHARS = 80  # of a process title kept with its per-process samples


def _process_name(pid: int) -> str:
    """The process's title as Ray and vLLM set it (``ray::WorkerDict...``, ``VLLM::Worker...``); "" where this
    process cannot see ``pid`` (another PID namespace)."""
    for name, read in (("cmdline", lambda b: b.replace(b"\0", b" ").strip()), ("comm", lambda b: b.strip())):
        try:
            text = read(Path(f"/proc/{pid}/{name}").read_bytes()).decode(errors="replace")
        except OSError:
            continue
        if text:
            return text[:PROCESS_NAME_CHARS]
    return ""


def parse_compute_apps(csv_text: str, uuids: list[str]) -> dict[int, float]:
    """GiB per pid on the GPUs named by ``uuids``, from ``nvidia-smi --query-compute-apps=gpu_uuid,pid,used_memory
    --format=csv,noheader,nounits`` (MiB; a process on several of those GPUs is summed; "[N/A]" counts 0)."""
    held: dict[int, float] = {}
    for line in csv_text.strip().splitlines():
        uuid, pid, mib = (field.strip() for field in line.split(","))
        if uuid in uuids:
            held[int(pid)] = held.get(int(pid), 0.0) + (int(mib) / 1024 if mib.isdigit() else 0.0)
    return held


def gpu_process_memory_reader():
    """A function returning ``[[pid, GiB, name], ...]``: what each process holds on the GPUs this process's CUDA
    sees (NVML's per-process accounting, else nvidia-smi), largest first. It splits the device-wide reading of
    :func:`gpu_memory_reader` between the processes that share a card (a verl actor and its vLLM engine)."""
    try:
        import pynvml  # provided by nvidia-ml-py
    except ImportError:
        pynvml = None
    if pynvml is not None:
        try:
            handles = _nvml_visible_handles(pynvml)
        except pynvml.NVMLError as err:
            raise SamplerUnavailable(f"NVML cannot be read here: {err!r}") from err

        def held() -> dict[int, float]:
            out: dict[int, float] = {}
            for h in handles:
                for p in pynvml.nvmlDeviceGetComputeRunningProcesses(h):
                    used = p.usedGpuMemory if isinstance(p.usedGpuMemory, int) else 0
                    out[p.pid] = out.get(p.pid, 0.0) + used / GIB
            return out
    else:
        _require_nvidia_smi()
        rows = _smi_rows("gpu=index,uuid")
        chosen = visible_gpus([(int(i), u) for i, u in rows], os.environ.get("CUDA_VISIBLE_DEVICES"))
        uuids = [u for i, u in rows if int(i) in chosen]

        def held() -> dict[int, float]:
            return parse_compute_apps(_smi("compute-apps=gpu_uuid,pid,used_memory"), uuids)

    try:
        held()  # a driver or container without per-process accounting fails here, not in the sampling thread
    except Exception as err:  # pynvml.NVMLError, subprocess errors
        raise SamplerUnavailable(f"per-process GPU memory cannot be read here: {err!r}") from err
    names: dict[int, str] = {}

    def read() -> list[list]:
        out = held()
        for pid in out:
            if pid not in names:
                names[pid] = _process_name(pid)
        return [[pid, gib, names[pid]] for pid, gib in sorted(out.items(), key=lambda kv: -kv[1])]

    return read


MEMINFO = Path("/proc/meminfo")


def read_meminfo(path: str | os.PathLike = MEMINFO) -> dict[str, int] | None:
    """The fields of a Linux ``/proc/meminfo`` in bytes (``MemTotal``, ``MemAvailable``, ...); None where the
    file does not exist (not Linux)."""
    path = Path(path)
    if not path.exists():
        return None
    fields = {}
    for line in path.read_text().splitlines():
        key, _, rest = line.partition(":")
        if rest.split():
            fields[key] = int(rest.split()[0]) * (1024 if rest.strip().endswith("kB") else 1)
    return fields


def host_available_bytes(path: str | os.PathLike = MEMINFO) -> int | None:
    """``MemAvailable`` of this host in bytes (what new allocations can get without swapping); None where unknown."""
    fields = read_meminfo(path)
    return None if fields is None or "MemAvailable" not in fields else fields["MemAvailable"]


def host_memory_reader():
    """A function returning ``[used host GiB]``: MemTotal - MemAvailable from /proc/meminfo (memory new
    allocations cannot get, all processes of the node). Raises :class:`SamplerUnavailable` without it."""
    if not MEMINFO.exists():
        raise SamplerUnavailable("no /proc/meminfo: host memory sampling needs Linux")

    def read() -> list[float]:
        fields = read_meminfo(MEMINFO)
        return [(fields["MemTotal"] - fields["MemAvailable"]) / GIB]

    return read


class MemorySampler:
    """Samples used memory at a fixed rate in a background thread: by default GPU memory (device-wide, all
    processes) of the GPUs this process's CUDA sees.

    ``mark(phase)`` stamps phase boundaries so the timeline can be cut per phase; ``summary()``
    gives the peak per phase and overall (for readers returning GiB lists; a per-process reader's samples are
    read from ``samples``). Device-wide memory is what vLLM's start-up check reads,
    so it is the number to hold a planner against, unlike one process's allocator statistics. Any other
    ``reader`` (a function returning a list of GiB) is sampled the same way, e.g. :func:`host_memory_reader`.
    """

    def __init__(self, interval_s: float = 1.0, reader=None, source: str | None = None,
                 origin: float | None = None) -> None:
        import threading

        if reader is None:
            reader, source = gpu_memory_reader()
        self.read, self.source = reader, source or "custom"
        self.interval_s = interval_s
        self.samples: list[tuple[float, list[float]]] = []
        self.marks: list[tuple[float, str]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        # time.time() that t = 0 stands for: a second sampler given another's origin shares its clock
        self.origin = time.time() if origin is None else origin

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.samples.append((time.time() - self.origin, self.read()))
            self._stop.wait(self.interval_s)

    def start(self) -> "MemorySampler":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()
        self.samples.append((time.time() - self.origin, self.read()))

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()

    def mark(self, phase: str) -> None:
        self.marks.append((time.time() - self.origin, phase))

    def phase_of(self, t: float) -> str:
        current = "start"
        for stamp, phase in self.marks:
            if stamp <= t:
                current = phase
        return current

    def timeline(self) -> list[dict[str, Any]]:
        return [{"t": t, "phase": self.phase_of(t), "used_gib": used} for t, used in self.samples]

    def summary(self) -> dict[str, Any]:
        peaks: dict[str, list[float]] = {}
        for row in self.timeline():
            best = peaks.setdefault(row["phase"], [0.0] * len(row["used_gib"]))
            peaks[row["phase"]] = [max(a, b) for a, b in zip(best, row["used_gib"])]
        overall = [max(col) for col in zip(*(s for _, s in self.samples))] if self.samples else []
        return {"source": self.source, "interval_s": self.interval_s, "samples": len(self.samples),
                "peak_used_gib": overall, "peak_used_gib_by_phase": peaks}
