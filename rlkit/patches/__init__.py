"""Named, reversible patches to PyTorch FSDP1 and verl.

Every optimization in rlkit that changes third-party code is a :class:`Patch`: ``apply()`` is idempotent, ``revert()``
restores the original objects, both refuse to run outside the library versions the patch was written for, and the
registry below tells a run which patches are active so that ``env.json`` can record them.

A patch names the modules it modifies (``targets``). ``apply()`` applies it now, importing them;
``apply_when_imported()`` checks its versions now but applies it only once every target has been
imported (at once if they already are): a post-import hook (:class:`_PostImportFinder`, on
``sys.meta_path`` while any patch waits) wraps the loaders of the modules imported meanwhile, and when
the import statement that brought in the last target has run its modules, the patch is applied, still
inside that statement, so that a failure raises from it. The verl plugin uses this, so that ``import verl`` does not
import verl's FSDP engine in every process just to patch it.
"""
from __future__ import annotations

import importlib
import importlib.abc
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib import metadata

from packaging.specifiers import SpecifierSet
from packaging.version import Version

# Every patch rlkit ships, by name -> module. The module defines ``PATCH`` (a Patch instance).
KNOWN_PATCHES: dict[str, str] = {
    "offload_views": "rlkit.patches.fsdp.offload_views",
    "no_shard": "rlkit.patches.fsdp.no_shard",
    "skip_old_logprob": "rlkit.patches.verl.skip_old_logprob",
    "master_on_host": "rlkit.patches.fsdp.master_on_host",
    "cast_once": "rlkit.patches.fsdp.cast_once",
    "metric_entropy": "rlkit.patches.verl.metric_entropy",
    "chunked_logprobs": "rlkit.patches.kernels.chunked_logprobs",
    "varlen_attention": "rlkit.patches.kernels.varlen_attention",
    "replay_poll": "rlkit.patches.verl.replay_poll",
    "compiled_rmsnorm": "rlkit.patches.kernels.compiled_rmsnorm",
    "compiled_pointwise": "rlkit.patches.kernels.compiled_pointwise",
    "selective_checkpoint": "rlkit.patches.verl.selective_checkpoint",
    "grad_prefetch": "rlkit.patches.fsdp.grad_prefetch",
}


# The plugin's other patches (guard, wiring, instruments), never named in RLKIT_PATCHES: verl_plugin._selection picks them.
PLUGIN_PATCHES: dict[str, str] = {
    "checkpoint_fingerprint": "rlkit.patches.guards.checkpoint_fingerprint",
    "master_on_host_verl": "rlkit.patches.verl.master_on_host_verl",
    "rank_identity": "rlkit.patches.instruments.rank_identity",
    "old_log_prob_memory": "rlkit.patches.instruments.old_log_prob_memory",
}


# The versions rlkit supports, in one place: every patch's guard takes its range from here, and pyproject.toml's
# dependencies and `rlkit doctor` state the same (tests/test_versions.py). The ends: torch 2.11 + transformers 5.17
# (the GPU node), torch 2.13 + transformers 5.10 (CI); verl exactly the release the verl patches were written for.
SUPPORTED: dict[str, str] = {"torch": ">=2.11,<2.15", "transformers": ">=5.5.3,<5.18", "verl": "==0.9.1"}


def supported(*dists: str) -> dict[str, str]:
    """A patch's ``requires``: rlkit's supported range of each of ``dists``."""
    return {dist: SUPPORTED[dist] for dist in dists}


class PatchError(RuntimeError):
    """A patch cannot be applied here (wrong library version, missing target, unknown name)."""


# Where rlkit's tested versions come from (pyproject.toml's extras, environment.yml).
_TESTED_WITH = {"verl": "as rlkit's [verl] or [gpu] extra installs it",
                "torch": "2.11.0 on CUDA, vLLM 0.24.0's pin; 2.13.0 on CPU",
                "transformers": "as rlkit's own dependencies install it"}


def _install_hint(dist: str, spec: str) -> str:
    """How to get ``dist`` into ``spec``: the pip line and where rlkit's tested versions come from."""
    where = _TESTED_WITH.get(dist)
    return f"pip install '{dist}{spec}'" + (f" ({where}; exact pins in environment.yml)" if where else "")


def installed_version(dist: str) -> Version | None:
    try:
        return Version(metadata.version(dist))
    except metadata.PackageNotFoundError:
        return None


def installed_versions(dists) -> dict[str, str | None]:
    """``{dist: version as pip shows it, or None}`` for each of ``dists`` (what records and fingerprints keep)."""
    out = {}
    for dist in dists:
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out[dist] = None
    return out


# Called after a deferred apply: (patch, the module whose import triggered it, None or the error).
OnApply = Callable[["Patch", str, "BaseException | None"], None]


@dataclass(eq=False)
class Patch:
    """One reversible modification of third-party code.

    ``requires`` maps a distribution name to the version range the patch was written and tested
    for, e.g. ``{"torch": ">=2.11,<2.15"}``. ``apply_fn`` installs the change and returns a callable
    that undoes it. ``targets`` are the modules whose import makes the patch applicable (see
    :meth:`apply_when_imported`); ``apply_fn`` may import others, provided nothing binds what it
    changes there before the targets are imported.
    """

    name: str
    summary: str
    requires: dict[str, str]
    apply_fn: Callable[[], Callable[[], None]]
    targets: tuple[str, ...] = ()
    _undo: Callable[[], None] | None = field(default=None, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def check_versions(self) -> None:
        """Raise :class:`PatchError` unless every distribution in ``requires`` is installed in its range (the
        version importlib.metadata reports, as ``pip show`` does); the message names the patch, the range, the
        installed version and the fix."""
        for dist in self.requires:
            problem = self.version_problem(dist, installed_version(dist))
            if problem is not None:
                raise PatchError(problem)

    def version_problem(self, dist: str, have: Version | None) -> str | None:
        """Why ``dist`` at version ``have`` (None: not installed) does not fit this patch, or None when it does."""
        spec = self.requires[dist]
        if have is None:
            return f"patch {self.name!r} needs {dist} {spec}, which is not installed. Fix: {_install_hint(dist, spec)}"
        # Compare the public version so local tags such as +cu130 or +cpu do not matter.
        if Version(have.public) in SpecifierSet(spec, prereleases=True):
            return None
        return (f"patch {self.name!r} was written for {dist} {spec} but {dist} {have} is installed; "
                f"re-check the patched code against this version before widening the range. "
                f"Fix: {_install_hint(dist, spec)}, or run without {self.name!r} (leave it out of the recipe's "
                f"patches / RLKIT_PATCHES)")

    def apply(self) -> None:
        """Apply now (importing the targets). A deferral is cancelled first, so that the imports apply_fn makes
        cannot apply the patch a second time."""
        _settle(self)
        with self._lock:
            if self._undo is None:
                self.check_versions()
                self._undo = self.apply_fn()

    def apply_when_imported(self, on_apply: OnApply | None = None) -> bool:
        """Check the versions now; apply now if every target is imported already (True), else once the
        import that brings in the last of them has run (False; ``on_apply`` is called then, and on a
        failure before the error is raised from that import statement)."""
        self.check_versions()
        if self.active():
            return True
        if all(_imported(t) for t in self.targets):
            self.apply()
            return True
        _defer(self, on_apply)
        return False

    def revert(self) -> None:
        """Undo the patch, or cancel its deferral (its hook is removed when nothing else waits)."""
        _settle(self)
        with self._lock:
            if self._undo is None:
                return
            undo, self._undo = self._undo, None
            undo()

    def active(self) -> bool:
        return self._undo is not None

    def pending(self) -> bool:
        """Waiting for its targets to be imported (see :meth:`apply_when_imported`)."""
        return id(self) in _pending


# ----------------------------------------------------------------------------------------------
# deferred application: a post-import hook on sys.meta_path while any patch waits
#
# While a patch waits, every module found through sys.meta_path is loaded through _PostImportLoader, which
# counts the imports in progress in its thread. When the outermost of them has run (the import statement
# that started the chain is about to return), the waiting patches whose targets are all imported apply.
# Not earlier: a patch applied as soon as its target's code has run would import what it needs while the
# modules that imported the target are half-initialized (skip_old_logprob, applied right after
# verl.trainer.ppo.core_algos, met a circular ImportError from verl.trainer.distillation).

_pending: dict[int, tuple[Patch, OnApply | None]] = {}  # id(patch) -> (patch, callback), in deferral order
_registry_lock = threading.RLock()
_depth = threading.local()  # .n: imports in progress through _PostImportLoader in this thread


class _PostImportLoader(importlib.abc.Loader):
    """A found module's loader; when the outermost import in progress has run, waiting patches apply."""

    def __init__(self, loader, fullname: str):
        self.loader, self.fullname = loader, fullname

    def create_module(self, spec):
        create = getattr(self.loader, "create_module", None)
        return create(spec) if create is not None else None

    def exec_module(self, module) -> None:
        # The module keeps its real loader (importlib.resources, inspect and pkgutil read it).
        module.__loader__ = self.loader
        if getattr(module, "__spec__", None) is not None and module.__spec__.loader is self:
            module.__spec__.loader = self.loader
        _depth.n = getattr(_depth, "n", 0) + 1
        ran = False
        try:
            self.loader.exec_module(module)
            ran = True
        finally:
            _depth.n -= 1
            if _depth.n == 0:
                _apply_ready(self.fullname, ran)

    def __getattr__(self, name):
        return getattr(self.loader, name)


class _PostImportFinder(importlib.abc.MetaPathFinder):
    """Finds each module through the finders after it and wraps the loader."""

    def find_spec(self, fullname, path, target=None):
        for finder in sys.meta_path:
            find = getattr(finder, "find_spec", None)
            if finder is self or isinstance(finder, _PostImportFinder) or find is None:
                continue
            spec = find(fullname, path, target)
            if spec is not None:
                break
        else:
            return None
        loader = spec.loader
        if loader is not None and hasattr(loader, "exec_module") and type(loader).__name__ != "NamespaceLoader":
            spec.loader = _PostImportLoader(loader, fullname)
        return spec


_finder = _PostImportFinder()


def _sync_finder() -> None:
    """The finder is on sys.meta_path exactly while some patch waits. The list is replaced, not changed in
    place, so that an import running in another thread keeps iterating the list it started with."""
    installed = any(f is _finder for f in sys.meta_path)
    if _pending and not installed:
        sys.meta_path = [_finder, *sys.meta_path]
    elif not _pending and installed:
        sys.meta_path = [f for f in sys.meta_path if f is not _finder]


def _defer(patch: Patch, on_apply: OnApply | None) -> None:
    with _registry_lock:
        _pending[id(patch)] = (patch, on_apply)
        _sync_finder()


def _settle(patch: Patch) -> None:
    with _registry_lock:
        if _pending.pop(id(patch), None) is not None:
            _sync_finder()


def _imported(module: str) -> bool:
    found = sys.modules.get(module)
    return found is not None and not getattr(getattr(found, "__spec__", None), "_initializing", False)


def _apply_ready(fullname: str, ran: bool) -> None:
    """``import fullname``, the outermost import in progress, has run (``ran``: without an error): apply, in
    deferral order, every waiting patch whose targets are all imported; a failure is raised from that import
    statement. The imports a patch's own apply makes do not re-enter (they may make more patches ready)."""
    if getattr(_depth, "applying", False):
        return

    def imported(module: str) -> bool:  # importlib marks fullname initialized only once this returns
        return (ran and module == fullname) or _imported(module)

    _depth.applying = True
    try:
        while True:
            with _registry_lock:
                ready = [(p, cb) for p, cb in _pending.values() if all(imported(t) for t in p.targets)]
            if not ready:
                return
            patch, on_apply = ready[0]
            try:
                patch.apply()
            except BaseException as err:
                _defer(patch, on_apply)  # still waiting: the next import of a target retries and fails again
                error = PatchError(f"patch {patch.name!r} failed to apply after `import {fullname}` imported its "
                                   f"target(s) {', '.join(patch.targets)}: {type(err).__name__}: {err}")
                if on_apply is not None:
                    on_apply(patch, fullname, error)
                raise error from err
            if on_apply is not None:
                on_apply(patch, fullname, None)
    finally:
        _depth.applying = False


def pending() -> list[Patch]:
    """The patches waiting for their targets, in deferral order."""
    with _registry_lock:
        return [p for p, _ in _pending.values()]


def import_targets() -> list[str]:
    """Import the targets of every waiting patch, so that each applies now; returns their names."""
    waiting = pending()
    for patch in waiting:
        for module in patch.targets:
            import_target(patch.name, module)
    return [p.name for p in waiting]


# ----------------------------------------------------------------------------------------------
# the registry


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


def shipped() -> list[Patch]:
    """Every patch rlkit ships, the selectable ones and the plugin's own (their modules are imported)."""
    return [importlib.import_module(module).PATCH for module in (*KNOWN_PATCHES.values(), *PLUGIN_PATCHES.values())]


def apply(names) -> list[str]:
    """Apply the named patches now, in order; returns the names applied."""
    names = [n for n in names if n]
    for name in names:
        get(name).apply()
    return names


def revert_all() -> None:
    """Revert every known patch and cancel every deferral."""
    for patch in reversed(pending()):
        patch.revert()
    for name in reversed(list(KNOWN_PATCHES)):
        patch = _loaded(name)
        if patch is not None:
            patch.revert()


def _loaded(name: str) -> Patch | None:
    module = sys.modules.get(KNOWN_PATCHES[name])
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


def replace_attrs(*replacements: tuple[object, str, object]) -> Callable[[], None]:
    """:func:`replace_attr` for each ``(owner, attr, new)`` in order; the returned callable restores them all, the
    last one first (so an attribute replaced twice gets its first original back)."""
    undos = [replace_attr(owner, attr, new) for owner, attr, new in replacements]

    def undo() -> None:
        for one in reversed(undos):
            one()

    return undo
