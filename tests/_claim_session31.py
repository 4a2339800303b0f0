"""Readers of device session 31's committed files for tests/test_claims.py: the selective-checkpoint GPU test, the first
valid elementwise_kernels run (liger-kernel's) and one compiled update profile, all at 3aa2b34 on an H100. Each returns
values as the docs write them, or a bool for a status."""
from __future__ import annotations

import re

from _claim_session30 import KERNELS30, SELECTIVE_GPU_TEST, selective_test_expects_the_rng_state
from _claim_sources import _json, _log_passes, _passed, _profile, _source_text, _wall

from rlkit.core.results import pct

S31 = "outputs/_node/session31"
S31_TESTS = f"{S31}/gpu-tests.COMMAND.txt"
S31_SELECTIVE = f"{S31}/selective-gpu-test.log"
S31_COMPILED_TESTS = f"{S31}/profile-compiled-gpu-tests.log"
KERNELS31 = "outputs/elementwise_kernels/h100.session31"
PROFILE31 = "h100-compiled.session31"
COMMIT31 = "3aa2b345a74b03869f74f449228a03658144f26f"
OPS = (("rmsnorm", "RMSNorm"), ("rotary", "rotary"), ("swiglu", "SwiGLU"))
WIDTHS_TEST = "tests/test_compiled_patches.py::test_qwen3_4b_widths_on_the_gpu"
DISPATCH_TEST = "test_the_patched_swiglu_runs_eagers_backward_kernels_on_eagers_operands"


def _kernels() -> dict:
    return _json(f"{KERNELS31}/metrics.json")


def _ops() -> dict:
    return _kernels()["ops"]


def ran_on_an_h100_at_3aa2b34() -> bool:
    """The kernels run, the profile and the tests' record: one H100, commit 3aa2b34, every kernel arm ran."""
    command = _source_text(S31_TESTS)
    return ("H100" in _kernels()["device"] and _json(f"{KERNELS31}/env.json")["git_sha"] == COMMIT31
            and all(arm["ran"] for rows in _ops().values() for arm in rows.values())
            and _json(f"outputs/update_profile/{PROFILE31}/env.json")["git_sha"] == COMMIT31
            and "H100" in _profile(PROFILE31)["device"] and "NVIDIA H100" in command and COMMIT31 in command)


def selective_passed() -> bool:
    """Session 31's selective GPU test: the one test passed, none failed, at 3aa2b34 on an H100, and the test in the
    tree is the one that counts the RNG state's bytes."""
    return (_passed(S31_SELECTIVE) == 1 and " 1 passed" in _source_text(S31_SELECTIVE)
            and _log_passes(S31_SELECTIVE, f"tests/test_selective_checkpoint.py::{SELECTIVE_GPU_TEST}")
            and ran_on_an_h100_at_3aa2b34() and selective_test_expects_the_rng_state())


def kernel_ms_words() -> tuple[str, ...]:
    """Each op's forward-and-backward time, eager / compiled / liger, as the docs write them."""
    ops = _ops()
    return tuple(f"{name} " + " / ".join(f"{ops[op][arm]['fwd_bwd_ms']:.2f}" for arm in ("eager", "compiled", "liger"))
                 for op, name in OPS)


def valid_in_every_entry() -> bool:
    """The run has the experiment's fixes that made session 30's liger rotary and RMSNorm gradients invalid: its commit
    is later than theirs (session 30's run, e852499, lacks them) and its rotary inputs meet liger's premise (liger's
    rotary outputs off by less than a bf16 step's few, where session 30's were off by more than the largest)."""
    old = _json(f"{KERNELS30}/metrics.json")["ops"]["rotary"]["liger"]["outputs"]["max_rel_diff"]
    return ran_on_an_h100_at_3aa2b34() and old > 1 > 100 * _ops()["rotary"]["liger"]["outputs"]["max_rel_diff"]


def liger_grad_words() -> tuple[str, ...]:
    ops = _ops()
    return tuple(f"{ops[op]['liger']['input_grads']['max_rel_diff']:.1e} ({name})" for op, name in OPS)


def compiled_norm_grad_words() -> str:
    """The compiled RMSNorm's input gradients against eager's: their largest relative difference (not bit for bit)."""
    norm = _ops()["rmsnorm"]["compiled"]["input_grads"]
    return "<bit for bit>" if norm["bit_identical"] else f"{norm['max_rel_diff']:.1e}"


def compiled_rotary_and_swiglu_bit_for_bit() -> bool:
    """The compiled rotary and SwiGLU against eager: outputs and input gradients bit for bit."""
    ops = _ops()
    return all(ops[op]["compiled"][k]["bit_identical"] for op in ("rotary", "swiglu") for k in ("outputs", "input_grads"))


def liger_fastest_and_least_exact() -> bool:
    """On every op liger's forward and backward is the fastest of the three arms, and its input gradients are off eager's
    by more than the compiled arm's (so it is less exact than the compiled kernel it would replace)."""
    ops = _ops()
    return all(ops[op]["liger"]["fwd_bwd_ms"] < min(ops[op][a]["fwd_bwd_ms"] for a in ("eager", "compiled"))
               and not ops[op]["liger"]["input_grads"]["bit_identical"]
               and ops[op]["liger"]["input_grads"]["max_rel_diff"] > ops[op]["compiled"]["input_grads"]["max_rel_diff"]
               for op, _ in OPS)


def swiglu_words() -> tuple[str, ...]:
    """The patched SwiGLU (eager's backward) against eager: bit for bit, its time and eager's, at the run's tokens."""
    s = _ops()["swiglu"]
    if not (s["compiled"]["outputs"]["bit_identical"] and s["compiled"]["input_grads"]["bit_identical"]):
        return ("<the compiled SwiGLU is not eager's bit for bit here>",)
    words = (f"took {s['compiled']['fwd_bwd_ms']:.2f} ms against eager's {s['eager']['fwd_bwd_ms']:.2f} ms",
             f"{_kernels()['config']['tokens']:,} tokens", "input gradients were eager's bit for bit")
    return (*words, "no faster") if s["compiled"]["fwd_bwd_ms"] >= s["eager"]["fwd_bwd_ms"] else words


def swiglu30_words() -> tuple[str, ...]:
    s = _json(f"{KERNELS30}/metrics.json")["ops"]["swiglu"]
    return (f"took {s['compiled']['fwd_bwd_ms']:.2f} ms against eager's {s['eager']['fwd_bwd_ms']:.2f} ms",)


def compiled_tests_words() -> tuple[str, ...]:
    """The profile-compiled job's GPU tests: how many passed and were skipped, none failed; the Qwen3-4B-wide test passed
    with compiled_pointwise's logits and gradients 0 apart; the skipped one is the SwiGLU's CPU dispatch test."""
    text = _source_text(S31_COMPILED_TESTS)
    passed, skipped = re.search(r"=+ (\d+) passed, (\d+) skipped", text).groups()
    pointwise = re.search(r"compiled_pointwise on NVIDIA H100[^:]*: logits max \|diff\| 0 .*gradients max \|diff\| / "
                          r"max \|grad\|: (.*)", text)
    grads_zero = pointwise is not None and all(v.rsplit(": ", 1)[1] == "0" for v in pointwise[1].split(", "))
    if not (_log_passes(S31_COMPILED_TESTS, WIDTHS_TEST) and grads_zero and "failed" not in text.splitlines()[-1]
            and f"{DISPATCH_TEST} SKIPPED" in text and int(skipped) == 1):
        return ("<the compiled patches' GPU tests do not bear it out>",)
    return (f"{passed} passed, {skipped} skipped", "logits and gradients bit for bit")


def profile31_words() -> tuple[str, ...]:
    m = _profile(PROFILE31)
    return (f"{_wall(PROFILE31):.2f} s", f"{pct(m['flops']['mfu_timed'])}",
            f"{m['summary']['categories']['elementwise']['ms']:.0f} ms")


def profile31_not_comparable() -> bool:
    """No other committed profile shares its commit, so none without levers is its base: the report compares it with
    nothing (rlkit.report.profile's rule of one commit and one setup)."""
    from rlkit.report import profile as report_profile

    profiles = report_profile.committed_profiles()
    return (report_profile.base_of(PROFILE31, profiles) is None
            and [n for n, m in profiles.items() if m["commit"] == COMMIT31[:7]] == [PROFILE31])
