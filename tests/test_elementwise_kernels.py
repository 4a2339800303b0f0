"""rlkit.experiments.elementwise_kernels on the CPU: every op's eager arm against itself, the compiled SwiGLU (bit-exact
by its patch's claim) against eager, liger's arms saying why they do not run here, and bad parameters refused."""
from __future__ import annotations

import json

import pytest

from rlkit.core import params as P
from rlkit.experiments import elementwise_kernels as E


def _run(tmp_path, *params):
    argv = ["--tiny", "--out", str(tmp_path), "--tag", "cpu"] + [a for p in params for a in ("-p", p)]
    assert E.main(argv) == 0
    return json.loads((tmp_path / E.NOTEBOOK / "cpu" / "metrics.json").read_text())


def test_tiny_profile_times_each_op_and_says_why_liger_did_not_run(tmp_path):
    metrics = _run(tmp_path)
    assert list(metrics["ops"]) == list(E.OPS)
    for op, rows in metrics["ops"].items():
        eager = rows["eager"]
        assert eager["ran"] and eager["fwd_bwd_ms"] > 0, op
        assert eager["outputs"] == eager["input_grads"] == {"bit_identical": True, "max_rel_diff": 0.0}
        assert rows["liger"] == {"ran": False, "why": "liger-kernel's Triton kernels need a CUDA device"}


def test_the_compiled_swiglu_is_held_against_eager(tmp_path):
    import torch

    from rlkit.patches.kernels import compiled_pointwise

    assert E.arm_function("swiglu", "compiled", torch.device("cpu")) is compiled_pointwise.compiled_swiglu
    rows = _run(tmp_path, "ops=[swiglu]", "arms=[compiled]")["ops"]["swiglu"]
    compiled = rows["compiled"]
    assert compiled["ran"] and compiled["outputs"]["bit_identical"] and compiled["input_grads"]["bit_identical"]


def test_the_comparison_finds_a_difference():
    """The column issue 42's exactness rule is read from: a one-ulp change shows, a copy does not."""
    import torch

    a = torch.tensor([1.0, -2.0, 4.0], dtype=torch.bfloat16)
    assert E.against([a], [a.clone()]) == {"bit_identical": True, "max_rel_diff": 0.0}
    b = a.clone()
    b[2] = 4.0 + 2.0 ** -5  # the next bf16 above 4 (8 significand bits)
    assert E.against([a], [b]) == {"bit_identical": False, "max_rel_diff": 2.0 ** -7}


@pytest.mark.parametrize("override, words", [({"ops": ["gelu"]}, "ops=['gelu']"), ({"arms": []}, "arms=[]"),
                                             ({"tokens": 0}, "tokens=0")])
def test_bad_parameters_are_refused(override, words):
    with pytest.raises(P.ParamError, match=words.replace("[", r"\[").replace("]", r"\]")):
        E.Config(**{**E.PROFILES["tiny"], **override})


def test_the_comparison_runs_without_verl_vllm_or_ray(tmp_path):
    """docs/offline-node.md lets a lease without the bundle run kernels-liger: a fresh process where verl, vLLM and Ray
    cannot be imported runs the tiny profile to the end and imports none of them."""
    import subprocess
    import sys

    code = ("import sys\nfor m in ('verl', 'vllm', 'ray'): sys.modules[m] = None\n"
            "from rlkit.experiments import elementwise_kernels as E\n"
            f"assert E.main(['--tiny', '--out', {str(tmp_path)!r}, '--tag', 'cpu']) == 0\n"
            "print(sorted({m.split('.')[0] for m, v in sys.modules.items() if v is not None} & {'verl', 'vllm', 'ray'}))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == "[]"
    assert (tmp_path / E.NOTEBOOK / "cpu" / "metrics.json").exists()
