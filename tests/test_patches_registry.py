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


# ------------------------------------------------------------------------------------------------------------
# deferred application (Patch.apply_when_imported): real modules written to a temporary folder and imported


@pytest.fixture
def modules(tmp_path, monkeypatch):
    """write(name, source) puts a module on sys.path; every module written and every deferral is gone after. A
    deferral made before the test (the verl plugin's, where an earlier test imported verl in this process) waits
    outside it, so that the hook's presence is this test's own, and waits again after."""
    import sys

    earlier = patches.pending()
    for patch in earlier:
        patch.revert()
    monkeypatch.syspath_prepend(str(tmp_path))
    written = []

    def write(name: str, source: str) -> str:
        (tmp_path / f"{name}.py").write_text(source)
        written.append(name)
        return name

    yield write
    for patch in patches.pending():
        patch.revert()
    for name in written:
        sys.modules.pop(name, None)
    for patch in earlier:
        patch.apply_when_imported()


def _setter_patch(module: str, targets=None, value="patched"):
    """A patch that sets ``module.VALUE`` (importing it, as a patch's apply_fn imports its target)."""
    def apply_fn():
        return patches.replace_attr(patches.import_target("demo", module), "VALUE", value)

    return patches.Patch("demo", "sets VALUE", {}, apply_fn, targets=tuple(targets or (module,)))


def _finder_installed() -> bool:
    import sys

    return any(isinstance(f, patches._PostImportFinder) for f in sys.meta_path)


def test_a_deferred_patch_applies_when_its_target_is_imported_and_reverts(modules):
    import importlib.machinery
    import sys

    name = modules("rlkit_demo_target", "VALUE = 'original'\n")
    patch = _setter_patch(name)
    seen = []
    assert patch.apply_when_imported(lambda p, trigger, error: seen.append((p.name, trigger, error))) is False
    assert patch.pending() and not patch.active() and name not in sys.modules and _finder_installed()
    import rlkit_demo_target

    assert rlkit_demo_target.VALUE == "patched" and patch.active() and not patch.pending()
    assert seen == [("demo", name, None)] and not _finder_installed()
    # the module keeps its real loader
    assert isinstance(rlkit_demo_target.__loader__, importlib.machinery.SourceFileLoader)
    assert rlkit_demo_target.__spec__.loader is rlkit_demo_target.__loader__
    patch.apply_when_imported()  # idempotent
    patch.revert()
    patch.revert()
    assert rlkit_demo_target.VALUE == "original" and not patch.active()


def test_targets_already_imported_apply_at_once(modules):
    name = modules("rlkit_demo_present", "VALUE = 'original'\n")
    import rlkit_demo_present

    patch = _setter_patch(name)
    assert patch.apply_when_imported() is True and rlkit_demo_present.VALUE == "patched" and not _finder_installed()
    patch.revert()


def test_a_patch_with_several_targets_applies_when_the_last_is_imported(modules):
    first = modules("rlkit_demo_first", "VALUE = 'original'\n")
    second = modules("rlkit_demo_second", "")
    patch = _setter_patch(first, targets=(first, second))
    patch.apply_when_imported()
    import rlkit_demo_first

    assert rlkit_demo_first.VALUE == "original" and patch.pending()
    import rlkit_demo_second  # noqa: F401

    assert rlkit_demo_first.VALUE == "patched" and not patch.pending()
    patch.revert()


def test_the_apply_waits_until_the_import_that_brought_the_target_in_has_run(modules):
    """The target imported from inside another module's import: the apply needs a name that module defines
    after that line (how skip_old_logprob's apply met a half-initialized verl module) and runs once the outer
    import has run, before that import statement returns."""
    target = modules("rlkit_demo_inner", "VALUE = 'original'\n")
    modules("rlkit_demo_outer", "import rlkit_demo_inner\nVALUE_SEEN_AT_IMPORT = rlkit_demo_inner.VALUE\nLATER = 'defined'\n")

    def apply_fn():
        from rlkit_demo_outer import LATER  # ImportError if the outer module were still half-initialized

        return patches.replace_attr(patches.import_target("demo", target), "VALUE", LATER)

    patch = patches.Patch("demo", "needs the outer module", {}, apply_fn, targets=(target,))
    patch.apply_when_imported()
    import rlkit_demo_outer

    assert rlkit_demo_outer.VALUE_SEEN_AT_IMPORT == "original"  # the window: the rest of the outer import
    assert rlkit_demo_outer.rlkit_demo_inner.VALUE == "defined" and patch.active()
    patch.revert()


def test_a_failing_deferred_apply_raises_from_the_import_and_stays_pending(modules):
    import sys

    name = modules("rlkit_demo_failing", "VALUE = 'original'\n")

    def apply_fn():
        raise AttributeError("no attribute the patch replaces")

    patch = patches.Patch("demo_failing", "fails", {}, apply_fn, targets=(name,))
    errors = []
    patch.apply_when_imported(lambda p, trigger, error: errors.append(error))
    with pytest.raises(patches.PatchError, match=r"patch 'demo_failing' failed to apply after `import rlkit_demo_failing`"
                                                 r".*AttributeError: no attribute the patch replaces"):
        import rlkit_demo_failing
    assert len(errors) == 1 and isinstance(errors[0], patches.PatchError)
    assert name not in sys.modules and patch.pending() and not patch.active()
    with pytest.raises(patches.PatchError, match="demo_failing"):  # never silently unpatched on a retry
        import rlkit_demo_failing  # noqa: F401


def test_revert_cancels_a_deferral_and_removes_the_hook(modules):
    name = modules("rlkit_demo_cancelled", "VALUE = 'original'\n")
    patch = _setter_patch(name)
    patch.apply_when_imported()
    patch.revert()
    assert not patch.pending() and not _finder_installed()
    import rlkit_demo_cancelled

    assert rlkit_demo_cancelled.VALUE == "original" and not patch.active()


def test_apply_now_settles_a_deferral(modules):
    name = modules("rlkit_demo_eager", "VALUE = 'original'\n")
    patch = _setter_patch(name)
    patch.apply_when_imported()
    patch.apply()  # imports the target itself
    assert patch.active() and not patch.pending() and not _finder_installed()
    patch.revert()


def test_a_version_mismatch_fails_before_anything_waits(modules):
    name = modules("rlkit_demo_versioned", "VALUE = 'original'\n")
    patch = _setter_patch(name)
    patch.requires = {"torch": "<1.0"}
    with pytest.raises(patches.PatchError, match="was written for torch <1.0"):
        patch.apply_when_imported()
    assert not patch.pending() and not _finder_installed()


def test_every_shipped_patch_declares_its_targets():
    shipped = patches.shipped()
    assert [p.name for p in shipped] == [*patches.KNOWN_PATCHES, *patches.PLUGIN_PATCHES]
    for patch in shipped:
        assert patch.targets and all(isinstance(t, str) and t.count(".") >= 1 for t in patch.targets), patch.name
        if "verl" in patch.requires:  # verl-level patches wait for a verl module (or transformers', see varlen)
            assert any(t.startswith("verl.") for t in patch.targets), patch.name


def test_replace_attrs_restores_every_attribute_last_first():
    from types import SimpleNamespace

    from rlkit.patches import replace_attrs

    owner = SimpleNamespace(a=1, b=2)
    undo = replace_attrs((owner, "a", 10), (owner, "b", 20), (owner, "a", 100))
    assert (owner.a, owner.b) == (100, 20)
    undo()
    assert (owner.a, owner.b) == (1, 2)  # "a" replaced twice gets its first original back
