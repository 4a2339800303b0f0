"""master_on_host wired into verl 0.9.1's FSDP engine: the patch replaces exactly FSDPEngine.to and
FSDPEngine.optimizer_step, leaves them alone unless the engine is in train mode with param offload and
master_on_host is active, and revert restores verl. (The park/step/release cycle it drives is checked
bit-exact on real FSDP in tests/test_cast_once.py; the run inside verl needs a GPU.)"""
import pytest

from rlkit import patches

pytestmark = pytest.mark.verl


@pytest.fixture(autouse=True)
def clean():
    yield
    from rlkit.patches import master_on_host_verl

    master_on_host_verl.PATCH.revert()
    patches.revert_all()


def test_apply_is_idempotent_and_revert_restores_verl():
    from verl.workers.engine.fsdp.transformer_impl import FSDPEngine

    from rlkit.patches import master_on_host_verl

    to, step = FSDPEngine.to, FSDPEngine.optimizer_step
    master_on_host_verl.PATCH.apply()
    patched = (FSDPEngine.to, FSDPEngine.optimizer_step)
    master_on_host_verl.PATCH.apply()
    assert (FSDPEngine.to, FSDPEngine.optimizer_step) == patched and patched[0] is not to and patched[1] is not step
    master_on_host_verl.PATCH.revert()
    assert FSDPEngine.to is to and FSDPEngine.optimizer_step is step


class _Engine:
    """Only the attributes the wiring's decision reads (verl's FSDPEngine needs a GPU to build)."""

    def __init__(self, mode, offload, module):
        from types import SimpleNamespace

        self.mode, self.is_param_offload_enabled, self.module = mode, offload, module
        self.engine_config = SimpleNamespace(forward_only=False)


def test_the_wiring_engages_only_in_train_mode_with_param_offload_and_the_patch():
    import torch
    from conftest import gloo_world_of_one

    from rlkit.experiments import update_phase as U
    from rlkit.patches import master_on_host_verl as wiring

    with gloo_world_of_one():
        module = U.build_fsdp_model("tiny", torch.device("cpu"), seed=0, gradient_checkpointing=False)
        assert not wiring._wired(_Engine("train", True, module))  # master_on_host not active
        patches.apply(["master_on_host"])
        assert wiring._wired(_Engine("train", True, module))
        assert not wiring._wired(_Engine("eval", True, module))  # the old-log-prob pass keeps verl's load
        assert not wiring._wired(_Engine("train", False, module))  # no param offload: nothing on the host to adopt
        assert not wiring._wired(_Engine("train", True, torch.nn.Linear(4, 4)))  # not FSDP1
        assert wiring.host_masters(_Engine("train", True, module)) is None  # never parked
