"""What the compiled patches share (compiled_rmsnorm, compiled_pointwise): one way to compile a function of
transformers' own expression, and one error for a compile that fails."""
from __future__ import annotations

import functools
from collections.abc import Callable

import torch

from rlkit.patches import PatchError

QWEN3_MODULE = "transformers.models.qwen3.modeling_qwen3"  # what both patch
REQUIRES = {"torch": ">=2.11,<2.15", "transformers": ">=5.5.3,<5.18"}  # the versions their guards were checked on


def like_eager(fn: Callable) -> Callable:
    """``fn`` through torch.compile, built at its first call: Inductor, dynamic shapes (token counts change every
    micro-batch), the whole function one graph (a graph break is an error, not a silent eager fallback), and
    ``emulate_precision_casts``, which keeps eager's rounding to bf16 between fused ops instead of eliding it."""
    compiled = None

    @functools.wraps(fn)
    def call(*args):
        nonlocal compiled
        if compiled is None:
            compiled = torch.compile(fn, dynamic=True, fullgraph=True, options={"emulate_precision_casts": True})
        return compiled(*args)

    return call


def compile_failed(patch: str, field: str, device, err: Exception) -> PatchError:
    """The error of a compile that failed, naming the patch, what Inductor needs and how to run without it."""
    inner = getattr(err, "inner_exception", err)
    return PatchError(f"patch {patch!r}: torch.compile could not compile for {device} ({type(inner).__name__}: "
                      f"{str(inner)[:300]}). Fix: give Inductor what it needs there (a C compiler for CPU code; "
                      f"Triton for CUDA), or run without {patch} (recipe field {field}: eager)")
