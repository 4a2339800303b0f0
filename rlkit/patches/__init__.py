"""Named, reversible patches to PyTorch FSDP1 and verl.

Every optimization in rlkit that changes third-party code is a :class:`Patch`: ``apply()`` is
idempotent, ``revert()`` restores the original objects, both refuse to run outside the library
versions the patch was written for, and the registry below tells a run which patches are active so
that ``env.json`` can record them.
"""
from __future__ import annotations

import importlib
import threading
from dataclasses import dataclass, field
from importlib import metadata
from typing import Callable

from packaging.specifiers import SpecifierSet
from packaging.version import Version

# Every patch rlkit ships, by name -> module. The module defines ``PATCH`` (a Patch instance).
KNOWN_PATCHES: dict[str, str] = {
    "offload_views": "rlkit.patches.offload_views",
    "no_shard": "rlkit.patches.no_shard",
    "skip_old_logprob": "rlkit.patches.skip_old_logprob",
    "master_on_host": "rlkit.patches.master_on_host",
    "cast_once": "rlkit.patches.cast_once",
    "metric_entropy": "rlkit.patches.metric_entropy",
    "chunked_logprobs": "rlkit.patches.chunked_logprobs",
    "varlen_attention": "rlkit.patches.varlen_attention",
}


class PatchError(RuntimeError):
    """A patch cannot be applied here (wrong library version, missing target, unknown name)."""


def installed_version(dist: str) -> Version | None:
    try:
        return Version(metadata.version(dist))
    except metadata.PackageNotFoundError:
        return None


@dataclass
class Patch:
    """One reversible modification of third-party code.

    ``requires`` maps a distribution name to the version range the patch was written and tested
    for, e.g. ``{"torch": ">=2.11,<2.15"}``. ``apply_fn`` installs the change and returns a callable
    that undoes it.
    """

    name: str
    summary: str
    requires: dict[str, str]
    apply_fn: Callable[[], Callable[[], None]]
    _undo: Callable[[], None] | None = field(default=None, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def check_versions(self) -> None:
        for dist, spec in self.requires.items():
            have = installed_version(dist)
            if have is None:
                raise PatchError(f"patch {self.name!r} needs {dist} {spec}, which is not installed")
            # Compare the public version so local tags such as +cu130 or +cpu do not matter.
            if Version(have.public) not in SpecifierSet(spec, prereleases=True):
                raise PatchError(
                    f"patch {self.name!r} was written for {dist} {spec} but {dist} {have} is installed; "
                    f"re-check the patched code against this version before widening the range"
                )

    def apply(self) -> None:
        with self._lock:
            if self._undo is not None:
                return
            self.check_versions()
            self._undo = self.apply_fn()

    def revert(self) -> None:
        with self._lock:
            if self._undo is None:
                return
            undo, self._undo = self._undo, None
            undo()

    def active(self) -> bool:
        return self._undo is not None


def import_target(patch: str, module: str, fix: str = "install rlkit's [verl] extra (verl==0.9.1)"):
    """The module ``patch`` modifies; a :class:`PatchError` naming the patch, the module and ``fix`` when it
    cannot be imported here."""
    try:
        return importlib.import_module(module)
    except ImportError as err:
        raise PatchError(f"patch {patch!r} patches {module} but it cannot be imported here ({err}). "
                         f"Fix: {fix}.") from err


def get(name: str) -> Patch:
    """The patch called ``name`` (its module is imported on first use)."""
    if name not in KNOWN_PATCHES:
        raise PatchError(f"unknown patch {name!r}; known patches: {', '.join(KNOWN_PATCHES)}")
    module = importlib.import_module(KNOWN_PATCHES[name])
    return module.PATCH


def apply(names) -> list[str]:
    """Apply the named patches in order; returns the names applied."""
    names = [n for n in names if n]
    for name in names:
        get(name).apply()
    return names


def revert_all() -> None:
    for name in reversed(list(KNOWN_PATCHES)):
        patch = _loaded(name)
        if patch is not None:
            patch.revert()


def _loaded(name: str) -> Patch | None:
    module = importlib.sys.modules.get(KNOWN_PATCHES[name])
    return getattr(module, "PATCH", None) if module is not None else None


def active() -> list[str]:
    """Names of the patches active in this process (without importing any patch module)."""
    return [name for name in KNOWN_PATCHES if (p := _loaded(name)) is not None and p.active()]


def replace_attr(owner, attr: str, new) -> Callable[[], None]:
    """Set ``owner.attr = new`` and return a callable that restores the original object."""
    original = owner.__dict__[attr] if isinstance(owner, type) and attr in owner.__dict__ else getattr(owner, attr)
    setattr(owner, attr, new)

    def undo() -> None:
        setattr(owner, attr, original)

    return undo
