"""master_on_host wired into verl 0.9.1's FSDP engine: the patch replaces exactly FSDPEngine.to and
FSDPEngine.optimizer_step, leaves them alone unless the engine is in train mode with param offload and
master_on_host is active, and revert restores verl. (The park/step/release cycle it drives is checked
bit-exact on real FSDP in tests/test_cast_once.py, and below through verl's own engine methods on CPU.)"""
import pytest

from rlkit import patches

pytestmark = pytest.mark.verl


@pytest.fixture(autouse=True)
def clean():
    yield
    from rlkit.patches.verl import master_on_host_verl

    master_on_host_verl.PATCH.revert()
    patches.revert_all()


def test_apply_is_idempotent_and_revert_restores_verl():
    from verl.workers.engine.fsdp.transformer_impl import FSDPEngine

    from rlkit.patches.verl import master_on_host_verl

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
    from rlkit.patches.verl import master_on_host_verl as wiring

    with gloo_world_of_one():
        module = U.build_fsdp_model("tiny", torch.device("cpu"), seed=0, gradient_checkpointing=False)
        assert not wiring._wired(_Engine("train", True, module))  # master_on_host not active
        patches.apply(["master_on_host"])
        assert wiring._wired(_Engine("train", True, module))
        assert not wiring._wired(_Engine("eval", True, module))  # the old-log-prob pass keeps verl's load
        assert not wiring._wired(_Engine("train", False, module))  # no param offload: nothing on the host to adopt
        assert not wiring._wired(_Engine("train", True, torch.nn.Linear(4, 4)))  # not FSDP1
        assert wiring.host_masters(_Engine("train", True, module)) is None  # never parked



def _verl_engine(module, optimizer):
    """A real verl FSDPEngine around a CPU FSDP1 module and HostAdamW, with the attributes its train-mode
    path reads (its __init__ builds the model on an accelerator)."""
    from types import SimpleNamespace

    from verl.workers.engine.fsdp.transformer_impl import FSDPEngine

    engine = FSDPEngine.__new__(FSDPEngine)
    engine.module, engine.optimizer, engine.mode = module, optimizer, None
    engine._is_offload_param, engine._is_offload_optimizer = True, False
    engine.engine_config = SimpleNamespace(forward_only=False, fsdp_size=1)
    engine.optimizer_config = SimpleNamespace(clip_grad=1e9)  # clip coefficient clamps to 1.0: grads unchanged
    engine.ulysses_parallel_group, engine.scaler, engine._qat_enabled = None, None, False
    return engine


def test_verl_train_mode_cycle_through_its_own_engine_matches_the_baseline(monkeypatch):
    """The cycle the GRPO arm runs, through verl's own code: ``engine.train_mode()`` (its `to`, which checks
    its arguments) with train_batch's nested ``train_mode`` inside, fwd/bwd, verl's ``optimizer_step`` (clip,
    finite check, HostAdamW on the exposed host masters), and both exits (zero_grad; release, verl's offload). Starts from verl's offloaded layout (fp32
    on the host). Losses and masters must equal the unpatched computation bit for bit."""
    from types import SimpleNamespace

    import torch
    from conftest import gloo_world_of_one
    from test_cast_once import LR, batch, tiny_fsdp, train
    from verl.utils import fsdp_utils
    from verl.workers.engine import base
    from verl.workers.engine.fsdp import transformer_impl

    from rlkit.experiments import update_phase as U
    from rlkit.patches.verl import master_on_host_verl as wiring

    # A CPU machine has no accelerator: let verl's context switch name one (the wiring never loads to it).
    for module in (base, transformer_impl):
        monkeypatch.setattr(module, "get_device_name", lambda: "cuda")
    monkeypatch.setattr(fsdp_utils, "get_torch_device", lambda: SimpleNamespace(empty_cache=lambda: None))
    with gloo_world_of_one():
        reference = train("A", host_adamw=True)
        patches.apply(["master_on_host", "cast_once"])
        wiring.PATCH.apply()
        model = tiny_fsdp()
        params = list(model.parameters())
        engine = _verl_engine(model, U.make_optimizer("host_pinned", params, lr=LR, weight_decay=0.1))
        losses = []
        for step in range(2):
            host = [p.data.data_ptr() for p in params]
            # As verl's train_mini_batch: its train_mode context around train_batch's own (no auto offload),
            # whose exit zeroes the grads and resets engine.mode to None before the outer exit offloads.
            with engine.train_mode():
                assert wiring.host_masters(engine) is not None
                with engine.train_mode(disable_auto_offload=True):
                    losses.append(U.run_fwd_bwd(model, batch(step, 6), 3, None))
                    grad_norm = engine.optimizer_step()
                    assert grad_norm > 0 and torch.isfinite(torch.tensor(grad_norm))
                assert engine.mode is None and wiring.host_masters(engine) is not None
            assert wiring.host_masters(engine) is None and [p.data_ptr() for p in params] == host
        assert losses == reference["loss"]
        for got, ref in zip(params, reference["masters"], strict=True):
            assert torch.equal(got.detach(), ref), (got.detach() - ref).abs().max()
