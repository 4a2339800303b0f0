"""What a pre-flight check of a verl config returns and what it is given besides the config.

A :class:`Finding` is one result (severity ``error`` / ``warning`` / ``info``, the dotted config key, a message, a fix
and the name of the check); a :class:`Context` holds what the config does not say (active rlkit patches, environment,
Ray version, GPU and host memory, planner options). It also holds the config keys that both :mod:`rlkit.planning.preflight`
and :mod:`rlkit.planning.preflight_memory` read, and imports neither.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass

SEVERITIES = ("error", "warning", "info")
ACTOR_FSDP = "actor_rollout_ref.actor.fsdp_config"
ROLLOUT = "actor_rollout_ref.rollout"


@dataclass(frozen=True)
class Finding:
    severity: str  # error | warning | info
    key: str  # dotted config key
    message: str
    fix: str
    check: str = ""  # name of the check that produced it

    def __post_init__(self) -> None:
        if self.severity not in SEVERITIES:
            raise ValueError(f"severity {self.severity!r} is not one of {SEVERITIES}")

    def as_dict(self) -> dict[str, str]:
        return asdict(self)


@dataclass
class Context:
    active_patches: list[str]
    env: Mapping[str, str]
    ray_version: str | None
    gpu_gib: float | None
    planner_options: list[str]
    host_available_gib: float | None = None  # host memory a job can get on a node (MemAvailable); None: unknown
    link_gbps: float | None = None  # each node's network link in Gbit/s; None: rlkit.planning.multinode.DEFAULT_LINK_GBPS
