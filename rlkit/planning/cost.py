"""The source document's cost metric: dollars per million rollout samples for a run's GPUs, price and wall clock."""
from __future__ import annotations

from rlkit.core.params import ParamError


def run_cost(n_gpus: int, price_per_gpu_hour: float, wallclock_hours: float) -> float:
    """Dollars for a run: GPUs x price per GPU-hour x wall-clock hours."""
    for key, v in (("n_gpus", n_gpus), ("price_per_gpu_hour", price_per_gpu_hour), ("wallclock_hours", wallclock_hours)):
        if v < 0:
            raise ParamError(f"{key}: must be >= 0, got {v!r}")
    return n_gpus * price_per_gpu_hour * wallclock_hours


def cost_per_million_samples(n_gpus: int, price_per_gpu_hour: float, wallclock_hours: float, samples: float) -> float:
    """The document's metric: (n_gpus x price_per_gpu_hour x wallclock_hours) / samples_millions."""
    if not samples > 0:
        raise ParamError(f"samples: must be > 0 rollout samples, got {samples!r}")
    return run_cost(n_gpus, price_per_gpu_hour, wallclock_hours) / (samples / 1e6)
