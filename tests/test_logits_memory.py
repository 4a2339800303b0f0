"""The planner's forward-pass bytes per logit element against verl's own log-prob stage, re-measured on the CPU
(rlkit.measure.logits_memory): the old_log_prob pass of outputs/06_util_sweep/qwen3_4b_48g-u* (verl 0.9.1's
engine, no flash-attn, use_remove_padding=False, the entropy computed, temperature 1.0) holds 14 bytes per
element of its [sequences, longest, vocab] logits at its peak: the bf16 logits (2), entropy_from_logits's
fp32 softmax (4, autocast's), logsumexp's fp32 copy of the logits (4, autocast's) and its fp32 ``x - max`` (4)."""
import json
from pathlib import Path

import pytest

from rlkit.core.env import REPO_ROOT
from rlkit.planning import budget

pytestmark = pytest.mark.verl

# What verl's stage holds per logit element at its peak on the node's settings (the module docstring above).
MEASURED_FORWARD = 14
# The planner paths that model verl's unfused log-probs without flash-attn: torch_rowwise is that path by its
# description (budget.LOGITS_BYTES), torch_fp32 is what notebook 06 assumes for the same node.
NODE_PATHS = ("torch_fp32", "torch_rowwise")
SWEEP_RUN = REPO_ROOT / "outputs" / "06_util_sweep" / "qwen3_4b_48g-u0.5"

SMALL, LARGE = [16, 12, 8], [32, 24, 16]  # sequences' tokens; the real Qwen3 vocabulary


@pytest.fixture(scope="module")
def measured():
    from rlkit.measure.logits_memory import measure_log_prob_stage

    return {"small": measure_log_prob_stage(SMALL), "large": measure_log_prob_stage(LARGE)}


def test_cuda_autocast_policy_is_torchs_own():
    """The CPU stand-in for CUDA autocast gives the same aten ops in the same dtypes as torch's CUDA autocast
    dispatcher (fake CUDA tensors) on verl's entropy and a row's log-softmax: softmax, logsumexp and the
    product with the softmax all in fp32, with an fp32 copy of the bf16 logits before softmax and logsumexp."""
    import torch
    import verl.utils.torch_functional as verl_F

    from rlkit.measure.logits_memory import autocast_dtype_trace

    for fn in (verl_F.entropy_from_logits, lambda x: torch.nn.functional.log_softmax(x, dim=-1)):
        cuda = autocast_dtype_trace(fn, (6, 50), device="cuda")
        assert cuda == autocast_dtype_trace(fn, (6, 50), device="cpu")
    assert autocast_dtype_trace(verl_F.entropy_from_logits, (6, 50), device="cuda")[:4] == [
        ("_to_copy", "torch.float32"), ("_softmax", "torch.float32"),
        ("_to_copy", "torch.float32"), ("logsumexp", "torch.float32")]


def test_the_sweep_run_took_the_measured_path():
    """The committed run's settings are the ones measured: no remove-padding, no fused kernels, temperature 1;
    and verl's V1 trainer asks old_log_prob for the entropy (its _compute_old_log_prob)."""
    import inspect

    from verl.trainer.ppo.v1.trainer_base import PPOTrainer as Trainer

    overrides = json.loads((SWEEP_RUN / "overrides.json").read_text())
    assert "actor_rollout_ref.model.use_remove_padding=False" in overrides
    log = (SWEEP_RUN / "verl.log").read_text(errors="replace")
    assert "'use_fused_kernels': False" in log and "'temperature': 1.0" in log and "'use_v1': True" in log
    source = inspect.getsource(Trainer._compute_old_log_prob)
    assert '"calculate_entropy": True' in source


def test_bytes_per_element_are_the_same_at_two_sizes(measured):
    """Linear in the positions: twice the tokens, twice the peak; the same bytes per element."""
    small, large = measured["small"], measured["large"]
    assert large["positions"] == 2 * small["positions"]
    assert large["peak_above_logits_bytes"] == pytest.approx(2 * small["peak_above_logits_bytes"], rel=1e-3)
    for m in (small, large):
        assert m["logits_shape"] == [len(m["seq_lens"]), max(m["seq_lens"]), 151936]
        assert m["bytes_per_element"] == pytest.approx(MEASURED_FORWARD, abs=0.01)


def test_the_stage_without_entropy_or_with_a_temperature():
    """What the 14 bytes consist of: without the entropy the stage holds the logits (2), torch.cat's copy of
    their valid rows (2 per token element) and one row's fp32 log-softmax temporaries (logprobs_from_logits_v2
    loops over rows: 12 bytes per vocabulary entry on the CPU, one row, nothing at 8192 rows); a temperature
    other than 1 adds a divided bf16 copy of the logits (2)."""
    from rlkit.measure.logits_memory import measure_log_prob_stage

    m = measure_log_prob_stage(SMALL, calculate_entropy=False)
    rows = 2 + 2 * m["tokens"] / m["positions"]
    assert rows < m["bytes_per_element"] <= rows + 16 / m["positions"]
    assert measure_log_prob_stage(SMALL, temperature=0.7)["bytes_per_element"] == pytest.approx(16, abs=0.01)


@pytest.mark.parametrize("path", NODE_PATHS)
def test_planner_forward_bytes_are_verls(path, measured):
    """The planner's constant is what verl's code holds: it cannot drift from the code it models."""
    assert budget.LOGITS_BYTES[path]["forward"] == round(measured["small"]["bytes_per_element"])
