"""replay_poll: verl's V1 replay buffer checks for finished rollouts every ``RLKIT_REPLAY_POLL_S`` seconds, not 2.

verl 0.9.1's trainer takes each step's batch from ``verl.trainer.ppo.v1.replay_buffer.ReplayBuffer.sample``: a loop
that reads the transfer queue's metadata, returns once enough rollouts are finished, and otherwise sleeps
``poll_interval`` (``_wait_for_next_poll``). The interval is a constructor default, 2.0 s, that the trainer never
sets (``trainer_base._build_replay_buffer`` passes no ``poll_interval``, and no config key reaches it). So the
trainer learns that the last rollout of a step finished up to 2 s late, 1 s on average: the gen times of the
committed runs come in 2-s steps (notebook 06 shows them).

In sync mode (the recipe's, and rlkit's on-policy trainer, which reports itself as "sync") ``sample`` returns only
when the step's whole batch is finished, so the batch it hands on is the same at any interval: the patch changes
when training resumes, not what it trains on. What a shorter interval costs is one more metadata read of the
transfer queue per poll (a call to its controller actor).

The patch wraps ``ReplayBuffer.__init__`` (``ReplayBufferAsync`` inherits it) and sets ``poll_interval`` from
``RLKIT_REPLAY_POLL_S``, which the recipe's ``replay_poll_s`` field sets with the patch (rlkit.recipes.job.launch_env).
"""
from __future__ import annotations

import os

from rlkit.patches import Patch, PatchError, import_target, replace_attr, supported

VERL_MODULE = "verl.trainer.ppo.v1.replay_buffer"
ENV = "RLKIT_REPLAY_POLL_S"
VERL_DEFAULT_S = 2.0  # ReplayBuffer.__init__'s default in verl 0.9.1


def poll_interval_s(environ=os.environ) -> float:
    """The interval this process's replay buffers poll at; a clear error when ``RLKIT_REPLAY_POLL_S`` is unusable."""
    raw = environ.get(ENV, "").strip()
    try:
        value = float(raw)
    except ValueError:
        value = float("nan")
    if not 0.0 < value <= 60.0:
        raise PatchError(f"patch 'replay_poll' needs {ENV} in seconds in (0, 60], got {raw!r}. Fix: set the recipe's "
                         f"replay_poll_s (e.g. 0.2), which sets {ENV} with the patch")
    return value


def _apply():
    interval = poll_interval_s()  # before anything changes: a bad value stops the apply
    buffers = import_target("replay_poll", VERL_MODULE)
    original_init = buffers.ReplayBuffer.__init__

    def __init__(self, *args, **kwargs):
        original_init(self, *args, **kwargs)
        self.poll_interval = interval

    __init__.__doc__ = original_init.__doc__
    __init__.__rlkit_patch__ = "replay_poll"
    return replace_attr(buffers.ReplayBuffer, "__init__", __init__)


PATCH = Patch(
    name="replay_poll",
    summary="verl V1 replay buffer: poll for finished rollouts every RLKIT_REPLAY_POLL_S seconds instead of 2",
    requires=supported("verl"),
    apply_fn=_apply,
    targets=(VERL_MODULE,),
)

apply = PATCH.apply
revert = PATCH.revert
active = PATCH.active
