"""Deterministic mode for the measuring experiments, and the yardstick a parity check is read against.

A parity check (patched vs unpatched) on a GPU only shows bit-exactness if the unpatched run reproduces
itself: kernels that accumulate with atomics (flash / memory-efficient attention backward, some scatter
ops) give run-to-run differences that look like a patch's. So every check records two numbers,
``patched_vs_unpatched`` and ``unpatched_vs_itself`` (the baseline run twice), and a verdict (:func:`check`).

Deterministic mode (:func:`enable`, called inside the measuring child process) is
``torch.use_deterministic_algorithms(True)`` in its raising form: with ``warn_only=True`` torch keeps the
non-deterministic flash / memory-efficient attention backward and only warns, which is why earlier GPU runs
did not reproduce themselves. Also ``torch.backends.cudnn.deterministic=True``, ``benchmark=False``, fixed
seeds, and ``CUBLAS_WORKSPACE_CONFIG=:4096:8``, which cuBLAS reads when it creates its first handle: the
launcher puts it into the child's environment (:func:`child_env`), before CUDA starts. SDPA keeps its
backends: under the raising mode flash and memory-efficient attention run their deterministic backward and
cuDNN attention is not selected; the math backend stays enabled as the fallback. An op that has no
deterministic implementation raises; :func:`recording_nondeterministic_op` turns that into a result (the
op's name) instead of a crash.
"""
from __future__ import annotations

import os
import random
import re
from contextlib import contextmanager
from typing import Any

CUBLAS_WORKSPACE_CONFIG = ":4096:8"
# torch's message when an op has no deterministic implementation (aten's alertNotDeterministic and the
# Python-side torch._prims_common.alert_not_deterministic use the same words).
_NO_DETERMINISTIC_IMPL = re.compile(r"^\s*(?P<op>.+?) does not have a deterministic implementation", re.MULTILINE)
# cuBLAS refusing to run deterministically without its workspace setting.
_CUBLAS_UNSET = "CUBLAS_WORKSPACE_CONFIG"


def child_env(deterministic: bool) -> dict[str, str]:
    """Environment additions for a measuring child (:func:`rlkit.measure.launch.run_module` ``env=``)."""
    return {"CUBLAS_WORKSPACE_CONFIG": CUBLAS_WORKSPACE_CONFIG} if deterministic else {}


def enable(seed: int) -> dict[str, Any]:
    """Deterministic mode for this process; returns the settings as read back (recorded in metrics).

    Call it in the child before the measured work. ``CUBLAS_WORKSPACE_CONFIG`` is expected from the
    launcher (:func:`child_env`); if it is missing it is set here, which still precedes cuBLAS's first
    handle as long as no matrix product ran yet, and the record says it was not inherited.
    """
    inherited = os.environ.get("CUBLAS_WORKSPACE_CONFIG")
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", CUBLAS_WORKSPACE_CONFIG)
    import torch

    torch.use_deterministic_algorithms(True, warn_only=False)
    # The raising mode would also fill every new allocation (pinned masters, staging buffers, re-allocated
    # compute copies) with NaN: a write per allocation that no arm pays in training, and every experiment
    # here writes what it reads.
    torch.utils.deterministic.fill_uninitialized_memory = False
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False
    random.seed(seed)
    torch.manual_seed(seed)  # seeds every CUDA device too
    try:
        import numpy

        numpy.random.seed(seed)
    except ImportError:
        pass
    return settings(inherited_cublas_config=inherited, seed=seed)


def settings(*, inherited_cublas_config: str | None = None, seed: int | None = None) -> dict[str, Any]:
    """What this process runs with, read back from torch (also for a run without deterministic mode)."""
    import torch

    cuda = torch.backends.cuda
    return {
        "deterministic_algorithms": torch.are_deterministic_algorithms_enabled(),
        "warn_only": torch.is_deterministic_algorithms_warn_only_enabled(),
        "cudnn_deterministic": torch.backends.cudnn.deterministic,
        "cudnn_benchmark": torch.backends.cudnn.benchmark,
        "cublas_workspace_config": os.environ.get("CUBLAS_WORKSPACE_CONFIG"),
        "cublas_workspace_config_inherited": inherited_cublas_config,
        "sdpa_backends_enabled": {"flash": cuda.flash_sdp_enabled(), "mem_efficient": cuda.mem_efficient_sdp_enabled(),
                                  "math": cuda.math_sdp_enabled(), "cudnn": cuda.cudnn_sdp_enabled()},
        "seed": seed,
        "torch": torch.__version__,
    }


def nondeterministic_op(err: BaseException) -> str | None:
    """The op torch names when deterministic mode refuses it, or None for any other error."""
    text = str(err)
    match = _NO_DETERMINISTIC_IMPL.search(text)
    if match:
        return match.group("op").strip()
    if _CUBLAS_UNSET in text and "deterministic" in text.lower():
        return "cuBLAS (CUBLAS_WORKSPACE_CONFIG was not set before its first handle)"
    return None


@contextmanager
def recording_nondeterministic_op(result: dict[str, Any]):
    """Run the block; if deterministic mode refuses an op, record it in ``result`` and carry on.

    ``result`` gets ``status="nondeterministic_op"``, ``nondeterministic_op`` (torch's name for it) and
    ``error`` (the message's first line). Any other exception propagates.
    """
    try:
        yield
    except RuntimeError as err:
        op = nondeterministic_op(err)
        if op is None:
            raise
        result.update(status="nondeterministic_op", nondeterministic_op=op,
                      error=str(err).strip().splitlines()[0][:500])


# ---------------------------------------------------------------------------------------- the yardstick
def verdict(patched_vs_unpatched: float | None, unpatched_vs_itself: float | None) -> str:
    """How to read one check: 'bit-exact', 'within the baseline's own spread', 'exceeds ...', or 'not measured'."""
    if patched_vs_unpatched is None:
        return "not measured"
    if patched_vs_unpatched == 0.0:
        return "bit-exact"
    if unpatched_vs_itself is None:
        return "differs (no repeat of the baseline to compare with)"
    if patched_vs_unpatched <= unpatched_vs_itself:
        return "within the baseline's own spread"
    return "exceeds the baseline's own spread"


def check(name: str, patched_vs_unpatched: float | None, unpatched_vs_itself: float | None) -> dict[str, Any]:
    """One row of ``metrics["determinism"]["checks"]``: a max abs difference next to the baseline's own."""
    return {"check": name, "patched_vs_unpatched": patched_vs_unpatched, "unpatched_vs_itself": unpatched_vs_itself,
            "verdict": verdict(patched_vs_unpatched, unpatched_vs_itself)}


def max_or_none(values) -> float | None:
    values = [v for v in values if v is not None]
    return max(values) if values else None


def probe(t, k: int = 4096):
    """``k`` evenly spaced elements of ``t`` (all of it when smaller) as a float32 CPU copy.

    Differences between runs in separate processes are compared on probes: the max abs difference over a
    probe is a lower bound of the tensor's, exact equality of the whole tensor is checked with checksums.
    """
    import torch

    flat = t.detach().reshape(-1)
    n = flat.numel()
    if n > k:  # integer positions: a float32 linspace rounds past the last element once n > 2**24
        flat = flat[torch.arange(k, dtype=torch.int64, device=flat.device) * (n - 1) // (k - 1)]
    return flat.float().cpu()


def probe_max_abs_diff(a, b) -> float:
    """max |a - b| over two lists of probes (:func:`probe`) of the same tensors."""
    return max((float((x - y).abs().max()) for x, y in zip(a, b, strict=True)), default=0.0)


def summary(checks: list[dict[str, Any]], settings_: dict[str, Any] | None, ops: dict[str, str]) -> dict[str, Any]:
    """``metrics["determinism"]``: the settings the children ran with, refused ops, checks, one verdict."""
    measured = [c for c in checks if c["patched_vs_unpatched"] is not None]
    return {
        "settings": settings_,
        "nondeterministic_ops": ops,
        "checks": checks,
        "baseline_reproduces_itself": (all(c["unpatched_vs_itself"] == 0.0 for c in measured
                                           if c["unpatched_vs_itself"] is not None) if measured else None),
        "all_bit_exact": all(c["verdict"] == "bit-exact" for c in measured) if measured else None,
        "all_explained": (all(c["verdict"] in ("bit-exact", "within the baseline's own spread") for c in measured)
                          if measured else None),
    }


def checks_table(metrics: dict[str, Any]) -> list[dict[str, Any]]:
    """Rows for a notebook table; [] for results recorded before these checks existed."""
    return list((metrics.get("determinism") or {}).get("checks", []))


def findings(metrics: dict[str, Any]) -> str:
    """One paragraph for a notebook, every number read from ``metrics["determinism"]``."""
    d = metrics.get("determinism")
    if not d:
        return "These results were recorded before the determinism checks existed (no repeat of the baseline)."
    s = d.get("settings") or {}
    mode = ("deterministic mode (torch.use_deterministic_algorithms(True), cuDNN deterministic, "
            f"CUBLAS_WORKSPACE_CONFIG={s.get('cublas_workspace_config')})" if s.get("deterministic_algorithms")
            else "the default (non-deterministic) kernels")
    parts = [f"Ran with {mode}."]
    for where, op in d.get("nondeterministic_ops", {}).items():
        parts.append(f"{where}: torch refused `{op}`, which has no deterministic implementation; that part "
                     "was not measured.")
    checks = [c for c in d["checks"] if c["patched_vs_unpatched"] is not None]
    if checks:
        exact = sum(c["verdict"] == "bit-exact" for c in checks)
        parts.append(f"{exact} of {len(checks)} checks bit-exact against the unpatched run.")
        for c in checks:
            if c["verdict"] != "bit-exact":
                spread = c["unpatched_vs_itself"]
                parts.append(f"{c['check']}: {c['patched_vs_unpatched']:.3g} vs the baseline's own "
                             f"{'(not repeated)' if spread is None else f'{spread:.3g}'}: {c['verdict']}.")
        if d["baseline_reproduces_itself"] is False:
            parts.append("The unpatched run does not reproduce itself bit for bit here, so exactness cannot be "
                         "shown; read each difference against the baseline's own.")
    return " ".join(parts)
