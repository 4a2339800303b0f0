"""What the compiled patches share (compiled_rmsnorm, compiled_pointwise): one way to compile a function of
transformers' own expression (with one error for a compile that fails), and one refusal of a transformers that
computes otherwise."""
from __future__ import annotations

import functools
from collections.abc import Callable

import torch

from rlkit.patches import PatchError, supported

QWEN3_MODULE = "transformers.models.qwen3.modeling_qwen3"  # what both patch
REQUIRES = supported("torch", "transformers")  # the versions their guards were checked on


def like_eager(fn: Callable, *, patch: str, field: str, bit_exact: bool = False) -> Callable:
    """``fn`` through torch.compile, built at its first call: Inductor, dynamic shapes (token counts change every
    micro-batch), the whole function one graph (a graph break is an error, not a silent eager fallback), and
    ``emulate_precision_casts``, which keeps eager's rounding to bf16 between fused ops instead of eliding it. A
    compile that fails raises a :class:`PatchError` naming ``patch``, what Inductor needs and the recipe ``field``
    that runs without it.

    ``bit_exact``: the patch claims eager's results bit for bit, so the first call on each device type and dtype
    also runs ``fn`` eagerly on the same inputs and raises a :class:`PatchError` if any output element differs
    (torch 2.11's Inductor C++ backend, for one, drops the roundings ``emulate_precision_casts`` asks it to keep).
    """
    compiled = None
    checked: set[tuple[str, torch.dtype]] = set()

    @functools.wraps(fn)
    def call(first: torch.Tensor, *args):
        nonlocal compiled
        if compiled is None:
            compiled = torch.compile(fn, dynamic=True, fullgraph=True, options={"emulate_precision_casts": True})
        try:
            out = compiled(first, *args)
        except torch._dynamo.exc.BackendCompilerFailed as err:
            inner = getattr(err, "inner_exception", err)
            raise PatchError(f"patch {patch!r}: torch.compile could not compile for {first.device} "
                             f"({type(inner).__name__}: {str(inner)[:300]}). Fix: give Inductor what it needs there "
                             f"(a C compiler for CPU code; Triton for CUDA), or run without {patch} (recipe field "
                             f"{field}: eager)") from err
        key = (first.device.type, first.dtype)
        if bit_exact and key not in checked:
            with torch.no_grad():
                _require_same(fn(first, *args), out, name=fn.__name__, patch=patch, field=field,
                              where=f"{first.device} ({first.dtype})")
            checked.add(key)
        return out

    return call


def _require_same(eager, compiled, *, name: str, patch: str, field: str, where: str) -> None:
    from torch.utils._pytree import tree_leaves

    pairs = [(a, b.detach()) for a, b in zip(tree_leaves(eager), tree_leaves(compiled), strict=True)]
    if all(torch.equal(a, b) for a, b in pairs):
        return
    differ = sum(int((a != b).sum()) for a, b in pairs)
    total = sum(a.numel() for a, _ in pairs)
    largest = max(float((a.float() - b.float()).abs().max()) for a, b in pairs)
    raise PatchError(f"patch {patch!r}: {name} compiled by torch {torch.__version__} on {where} is not eager's result bit for bit "
                     f"({differ} of {total} elements differ, by at most {largest:.3g}), which the patch claims. Fix: "
                     f"run without {patch} (recipe field {field}: eager), or a torch whose Inductor keeps eager's "
                     "roundings there (on the CPU, 2.13 does and 2.11 does not)")


def expression_changed(patch: str, field: str, theirs: str, ours: str, probe: str) -> PatchError:
    """The refusal of a transformers whose ``theirs`` no longer computes rlkit's ``ours`` on a ``probe``."""
    import transformers

    return PatchError(f"patch {patch!r}: transformers {transformers.__version__}'s {theirs} no longer computes "
                      f"rlkit's {ours} ({probe} probe differs). Fix: re-check rlkit.patches.{patch} against it, or "
                      f"run without {patch} (recipe field {field}: eager)")
