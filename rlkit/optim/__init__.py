"""Optimizers verl can build by configuration: ``optim.optimizer_impl=rlkit.optim optim.optimizer=HostAdamW``."""
from rlkit.optim.host_adamw import HostAdamW
from rlkit.optim.host_step import IMPLS
from rlkit.optim.staging import StagingPool

__all__ = ["IMPLS", "HostAdamW", "StagingPool"]
