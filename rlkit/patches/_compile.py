"""What the compiled patches share (compiled_rmsnorm, compiled_pointwise): one way to compile a function of
transformers' own expression (with one error for a compile that fails), and one refusal of a transformers that
computes otherwise."""
from __future__ import annotations

import functools
from collections.abc import Callable

import torch

from rlkit.patches import PatchError

QWEN3_MODULE = "transformers.models.qwen3.modeling_qwen3"  # what both patch
REQUIRES = {"torch": ">=2.11,<2.15", "transformers": ">=5.5.3,<5.18"}  # the versions their guards were checked on


def like_eager(fn: Callable, *, patch: str, field: str) -> Callable:
    """``fn`` through torch.compile, built at its first call: Inductor, dynamic shapes (token counts change every
    micro-batch), the whole function one graph (a graph break is an error, not a silent eager fallback), and
    ``emulate_precision_casts``, which keeps eager's rounding to bf16 between fused ops instead of eliding it. A
    compile that fails raises a :class:`PatchError` naming ``patch``, what Inductor needs and the recipe ``field``
    that runs without it."""
    compiled = None

    @functools.wraps(fn)
    def call(first: torch.Tensor, *args):
        nonlocal compiled
        if compiled is None:
            compiled = torch.compile(fn, dynamic=True, fullgraph=True, options={"emulate_precision_casts": True})
        try:
            return compiled(first, *args)
        except torch._dynamo.exc.BackendCompilerFailed as err:
            inner = getattr(err, "inner_exception", err)
            raise PatchError(f"patch {patch!r}: torch.compile could not compile for {first.device} "
                             f"({type(inner).__name__}: {str(inner)[:300]}). Fix: give Inductor what it needs there "
                             f"(a C compiler for CPU code; Triton for CUDA), or run without {patch} (recipe field "
                             f"{field}: eager)") from err

    return call


def expression_changed(patch: str, field: str, theirs: str, ours: str, probe: str) -> PatchError:
    """The refusal of a transformers whose ``theirs`` no longer computes rlkit's ``ours`` on a ``probe``."""
    import transformers

    return PatchError(f"patch {patch!r}: transformers {transformers.__version__}'s {theirs} no longer computes "
                      f"rlkit's {ours} ({probe} probe differs). Fix: re-check rlkit.patches.{patch} against it, or "
                      f"run without {patch} (recipe field {field}: eager)")
