"""rlkit.patches.instruments.emulate_card: the arithmetic of the emulated card and its install/uninstall (CPU: no CUDA needed)."""
import pytest
import torch

from rlkit.patches.instruments import emulate_card

GIB = 2**30


def test_mem_info_is_the_small_card_minus_everything_used_on_the_device():
    # H200 139.8 GiB with 16.5 GiB used by the actor: the A6000 view has 47.4 - 16.5 free.
    free, total = emulate_card.emulated_mem_info(int(123.3 * GIB), int(139.8 * GIB), int(47.4 * GIB))
    assert total == int(47.4 * GIB)
    assert free == int(47.4 * GIB) - (int(139.8 * GIB) - int(123.3 * GIB))
    # More used than the card holds: nothing free (vLLM then refuses, as on the card).
    assert emulate_card.emulated_mem_info(10 * GIB, 139 * GIB, 47 * GIB) == (0, 47 * GIB)
    # A card at least as large as the device changes nothing.
    assert emulate_card.emulated_mem_info(5, 100, 100) == (5, 100)


def test_differences_of_two_readings_are_unchanged():
    card = 47 * GIB
    a = emulate_card.emulated_mem_info(120 * GIB, 139 * GIB, card)
    b = emulate_card.emulated_mem_info(110 * GIB, 139 * GIB, card)
    assert a[0] - b[0] == 10 * GIB


@pytest.mark.parametrize("raw,expected", [("", None), ("0", None), ("47.4", 47.4), (" 24 ", 24.0)])
def test_requested_size_from_the_environment(raw, expected):
    assert emulate_card.requested_gib({emulate_card.ENV: raw}) == expected


@pytest.mark.parametrize("raw,match", [("big", "not a number"), ("-3", "negative")])
def test_bad_sizes_name_the_variable_and_the_fix(raw, match):
    with pytest.raises(ValueError, match=match) as err:
        emulate_card.requested_gib({emulate_card.ENV: raw})
    assert emulate_card.ENV in str(err.value) and "Fix" in str(err.value)


def test_install_wraps_and_uninstall_restores_torch_cuda():
    real_info, real_set = torch.cuda.mem_get_info, torch.cuda.set_device
    try:
        info = emulate_card.install(47.4)
        assert info["gib"] == 47.4
        assert torch.cuda.mem_get_info is not real_info and torch.cuda.set_device is not real_set
        assert emulate_card.install(47.4) == info  # idempotent
        with pytest.raises(ValueError, match="already installed"):
            emulate_card.install(24.0)
    finally:
        emulate_card.uninstall()
    assert torch.cuda.mem_get_info is real_info and torch.cuda.set_device is real_set
