"""Skip verl's separate old-log-prob forward when training is strictly on-policy (seed 000, step 3).

Applying the patch registers, in the current verl process, the on-policy policy losses
(``rlkit_onpolicy``, ``rlkit_onpolicy_tis``) and the V1 sync trainer subclass (``rlkit_onpolicy``);
see :mod:`rlkit.patches.verl.onpolicy_verl`. Nothing changes until a run selects them, which
``rlkit.patches.verl.onpolicy.onpolicy_overrides(config)`` does only when ``rlkit.patches.verl.onpolicy.check_on_policy`` passes.
Apply it in every verl process (driver and workers): the trainer runs in the driver, the loss in workers.
"""
from __future__ import annotations

from rlkit.patches import Patch, supported


def _apply():
    from rlkit.patches.verl import onpolicy_verl as verl_onpolicy

    return verl_onpolicy.register()


PATCH = Patch(
    name="skip_old_logprob",
    summary="serve old_log_probs (PPO ratio, truncated IS weights) from the update forward when strictly on-policy",
    requires=supported("torch", "verl"),
    apply_fn=_apply,
    # verl's loss registry; the apply also imports the V1 trainer modules (the trainer registry). The actor
    # workers and the trainer both import core_algos before they look a loss or a trainer up.
    targets=("verl.trainer.ppo.core_algos",),
)
