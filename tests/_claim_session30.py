"""Readers of device session 30's committed files for tests/test_claims.py: the five H100 update profiles at e852499,
the GPU test logs and the first elementwise_kernels run (liger-kernel's). Each returns values as the docs write them,
or a bool for a status."""
from __future__ import annotations

import re

from rlkit.core.results import pct

from _claim_sources import _json, _log_passes, _pass_seconds, _passed, _profile, _source_text, _tested, _wall

S30 = "outputs/_node/session30"
S30_TESTS = f"{S30}/gpu-tests.COMMAND.txt"
S30_SELECTIVE = f"{S30}/selective-gpu-test.log"
S30_PREFETCH = f"{S30}/prefetch-gpu-test.log"
S30_GQA = f"{S30}/gqa-gpu-test.log"
KERNELS30 = "outputs/elementwise_kernels/h100.session30"
TAGS30 = ("h100-base", "h100-sac18", "h100-prefetch", "h100-levers", "h100-best")
COMMIT30 = "e852499bd12c5628d9ef1d8a8c666e5110ccc26c"
SELECTIVE_GPU_TEST = "test_on_the_gpu_a_selective_layer_is_bit_identical_and_keeps_the_planners_bytes"


def p30(tag: str) -> str:
    return f"{tag}.session30"


def one_lease_at_e852499() -> bool:
    """The five session-30 profiles: one H100, commit e852499 (env.json), one timed update each, one lease (their
    COMMAND.txt)."""
    for tag in TAGS30:
        folder = f"outputs/update_profile/{p30(tag)}"
        if (_json(f"{folder}/env.json")["git_sha"] != COMMIT30 or "H100" not in _profile(p30(tag))["device"]
                or len(_profile(p30(tag))["timing"]["timed"]) != 1
                or "ran one after the other on one card in one lease" not in _source_text(f"{folder}/COMMAND.txt")):
            return False
    return True


def sac30() -> dict:
    """Session 30's selective profile against the base of its lease."""
    base, sac = _profile(p30("h100-base")), _profile(p30("h100-sac18"))
    attention = [m["summary"]["passes"]["recompute"]["ms_by_category"]["attention"] for m in (base, sac)]
    return {"removed_s": _pass_seconds("recompute")(p30("h100-base")) - _pass_seconds("recompute")(p30("h100-sac18")),
            "attention_ms": attention, "layers": sac["config"]["selective_layers"],
            "peak_rise": sac["timing"]["peak_allocated_gib"] - base["timing"]["peak_allocated_gib"],
            "walls": (_wall(p30("h100-sac18")), _wall(p30("h100-base")))}


def sac30_words() -> tuple[str, ...]:
    s = sac30()
    return (f"removed {s['removed_s']:.2f} s of recompute", "from {:.0f} to {:.0f} ms".format(*s["attention_ms"]),
            f"rose by {s['peak_rise']:.1f} GiB", "{:.2f} s against {:.2f} s".format(*s["walls"]))


def sac_changes() -> tuple[str, ...]:
    """The update's change with selective checkpointing against the profile without levers of its lease, over
    sessions 23, 26 (the mean of its two bases) and 30, as the lowest and the highest."""
    base26 = (_wall("h100-base.session26") + _wall("h100-base2.session26")) / 2
    changes = [_wall("h100-sac18") / _wall("h100-base") - 1, _wall("h100-sac18.session26") / base26 - 1,
               _wall(p30("h100-sac18")) / _wall(p30("h100-base")) - 1]
    return (f"by {max(changes):+.0%} to {min(changes):+.0%}",)


def prefetch30_words() -> tuple[str, ...]:
    w = {t: _wall(p30(t)) for t in TAGS30}
    return (f"{w['h100-prefetch']:.2f} s against {w['h100-base']:.2f} s alone",
            f"{w['h100-best']:.2f} s against {w['h100-levers']:.2f} s with the other levers")


def prefetch30_inside_spread() -> bool:
    """Each of session 30's prefetch differences is inside session 26's largest spread between two runs of one
    profile."""
    spread = max(abs(_wall(f"{t}.session26") - _wall(f"{t}2.session26"))
                 for t in ("h100-prefetch", "h100-base", "h100-best", "h100-levers"))
    return (abs(_wall(p30("h100-prefetch")) - _wall(p30("h100-base"))) < spread
            and abs(_wall(p30("h100-best")) - _wall(p30("h100-levers"))) < spread)


def optimizer_pass_words() -> tuple[str, ...]:
    ms = lambda t: _profile(p30(t))["summary"]["passes"]["optimizer"]["ms"]  # noqa: E731
    return (f"{ms('h100-prefetch'):.0f} ms against {ms('h100-base'):.0f} ms",)


def selective_gpu_test_failed_at_its_bytes() -> bool:
    """Session 30's selective GPU test: one failure, after the loss and every gradient compared equal (the assert
    that failed is the bytes' one, on torch.uint64's 16 extra bytes), at e852499 on an H100 (its COMMAND file)."""
    log, command = _source_text(S30_SELECTIVE), _source_text(S30_TESTS)
    return ("1 failed" in log and "Left contains 1 more item:" in log and "{torch.uint64: 16}" in log
            and ">           assert _kept_bytes(layer) ==" in log and "NVIDIA H100" in command and COMMIT30 in command)


def selective_test_expects_the_rng_state() -> bool:
    text = _source_text("tests/test_selective_checkpoint.py")
    return "VARLEN_RNG_STATE_BYTES = 16" in text and "torch.uint64: VARLEN_RNG_STATE_BYTES}" in text


def prefetch30_passed() -> bool:
    return _passed(S30_PREFETCH) == 2 and _log_passes(S30_PREFETCH, "tests/test_grad_prefetch_gpu.py::"
                                                                    "test_prefetch_on_the_gpu_is_bit_identical")


def gqa30_words() -> tuple[str, ...]:
    text = _source_text(S30_GQA)
    assert _passed(S30_GQA) == 1 and "native vs repeat: {'out': 0.0, 'dq': 0.0, 'dk': 0.0, 'dv': 0.0}" in text
    tokens, repeat, native = re.search(r"one fwd\+bwd of (\d+) tokens: repeat ([\d.]+) ms, native ([\d.]+) ms",
                                       text).groups()
    return (f"{int(tokens):,} tokens", f"{repeat} ms with the repeat and {native} ms without")


def _kernels() -> dict:
    return _json(f"{KERNELS30}/metrics.json")


def kernel_ms_words() -> tuple[str, ...]:
    ops = _kernels()["ops"]
    return tuple(f"{name} " + " / ".join(f"{ops[op][arm]['fwd_bwd_ms']:.2f}" for arm in ("eager", "compiled", "liger"))
                 for op, name in (("rmsnorm", "RMSNorm"), ("rotary", "rotary"), ("swiglu", "SwiGLU")))


def kernels_ran_on_an_h100_at_e852499() -> bool:
    return ("H100" in _kernels()["device"] and _json(f"{KERNELS30}/env.json")["git_sha"] == COMMIT30
            and all(arm["ran"] for rows in _kernels()["ops"].values() for arm in rows.values()))


def liger_invalid_words() -> tuple[str, ...] | bool:
    """liger's rotary and RMSNorm gradients: far off eager in the committed run, and the experiment's two bugs that
    made them so tested now (the CPU tests that fail on the old code)."""
    ops = _kernels()["ops"]
    off = ops["rotary"]["liger"]["outputs"]["max_rel_diff"] > 1 and ops["rmsnorm"]["liger"]["input_grads"]["max_rel_diff"] > 1
    tests = "tests/test_elementwise_kernels.py"
    fixed = (_tested(tests, "test_the_rotary_inputs_are_qwen3s_and_meet_ligers_premise")
             and _tested(tests, "test_an_in_place_backward_is_compared_on_its_own_gradient"))
    return off and fixed




def compiled_swiglu_words() -> tuple[str, ...]:
    s = _kernels()["ops"]["swiglu"]["compiled"]
    assert s["outputs"]["bit_identical"] and not s["input_grads"]["bit_identical"]
    return (f"up to {s['input_grads']['max_rel_diff']:.1e} of the largest",
            f"at {_kernels()['config']['tokens']:,} tokens")


def compiled_on_h100_at_cff2abc() -> bool:
    log = "outputs/_node/session26/compiled-tests-cff2abc.log"
    return _passed(log) == 15 and _log_passes(log, "tests/test_compiled_patches.py::test_qwen3_4b_widths_on_the_gpu")


def levers30_words() -> tuple[str, ...]:
    return tuple(f"{_wall(p30(t)):.2f} s ({pct(_profile(p30(t))['flops']['mfu_timed'])})"
                 for t in ("h100-base", "h100-levers"))
