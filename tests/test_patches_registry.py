import types

import pytest

from rlkit import patches


def _counter_patch(requires):
    target = types.SimpleNamespace(value="original")
    calls = []

    def apply_fn():
        calls.append("apply")
        return patches.replace_attr(target, "value", "patched")

    return patches.Patch("demo", "test patch", requires, apply_fn), target, calls


def test_apply_is_idempotent_and_revert_restores():
    patch, target, calls = _counter_patch({"torch": ">=2.0"})
    patch.apply()
    patch.apply()
    assert calls == ["apply"] and target.value == "patched" and patch.active()
    patch.revert()
    patch.revert()
    assert target.value == "original" and not patch.active()


def test_version_guard_refuses_other_versions():
    patch, target, _ = _counter_patch({"torch": "<1.0"})
    with pytest.raises(patches.PatchError, match="was written for torch <1.0"):
        patch.apply()
    assert target.value == "original"


def test_missing_distribution_is_named():
    patch, _, _ = _counter_patch({"surely-not-installed-dist": ">=1"})
    with pytest.raises(patches.PatchError, match="surely-not-installed-dist"):
        patch.apply()


def test_unknown_patch_name_lists_known_ones():
    with pytest.raises(patches.PatchError, match="known patches: offload_views"):
        patches.get("nope")


def test_replace_attr_on_class_keeps_function_identity():
    class A:
        def f(self):
            return 1

    original = A.__dict__["f"]
    undo = patches.replace_attr(A, "f", lambda self: 2)
    assert A().f() == 2
    undo()
    assert A.__dict__["f"] is original


def test_a_target_that_cannot_be_imported_names_patch_module_and_fix():
    with pytest.raises(patches.PatchError, match=r"patch 'demo' patches no_such_module_rlkit .* Fix: install it\."):
        patches.import_target("demo", "no_such_module_rlkit", "install it")
