"""metric_entropy against verl 0.9.1's own ppo_loss and entropy_from_logits: with entropy_coeff 0 the gradient
and the metrics are bit-identical to the unpatched loss, backward no longer reaches the (checkpointed) entropy,
a no-grad entropy runs in row chunks (same values to fp32 rounding, temporaries of one chunk), and a
non-zero coefficient is refused."""
import math
import weakref
from contextlib import nullcontext

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

pytestmark = pytest.mark.verl

BSZ, PROMPT, RESPONSE, VOCAB = 3, 4, 5, 17


@pytest.fixture
def patch():
    from rlkit.patches import get

    p = get("metric_entropy")
    yield p
    p.revert()


def _config(entropy_coeff):
    from verl.workers.config import ActorConfig

    cfg = ActorConfig(strategy="fsdp", ppo_mini_batch_size=4, rollout_n=1, ppo_micro_batch_size_per_gpu=2,
                      clip_ratio_low=0.2, clip_ratio_high=0.28, entropy_coeff=entropy_coeff)
    cfg.global_batch_info.update(dp_size=1, batch_num_tokens=None, global_batch_size=None, loss_scale_factor=None)
    return cfg


def _data(gen):
    from tensordict import TensorDict
    from verl.utils import tensordict_utils as tu

    attention = torch.ones(BSZ, PROMPT + RESPONSE, dtype=torch.long)
    attention[1, PROMPT + 3:] = 0  # a shorter response
    response_mask = attention[:, PROMPT:].clone()
    data = TensorDict({
        "prompts": torch.randint(0, VOCAB, (BSZ, PROMPT), generator=gen),
        "responses": torch.randint(0, VOCAB, (BSZ, RESPONSE), generator=gen),
        "attention_mask": attention, "response_mask": response_mask,
        "old_log_probs": -torch.rand(BSZ, RESPONSE, generator=gen),
        "advantages": torch.randn(BSZ, 1, generator=gen).expand(BSZ, RESPONSE) * response_mask,
    }, batch_size=[BSZ])
    tu.assign_non_tensor(data, dp_size=1, batch_num_tokens=None, global_batch_size=None)
    return data, int(attention.sum())


def _loss_and_grad(entropy_coeff, *, patched):
    """verl's engine-worker ppo_loss on model outputs computed from one leaf of logits, as the engine does:
    log-probs row-wise, entropy through a (reentrant) checkpoint. Returns loss, grad, metrics, recomputes."""
    from verl.utils import torch_functional as verl_F
    from verl.workers import engine_workers

    from rlkit import patches

    gen = torch.Generator().manual_seed(0)
    data, nnz = _data(gen)
    leaf = torch.randn(nnz, VOCAB, generator=gen).requires_grad_(True)
    labels = torch.randint(0, VOCAB, (nnz,), generator=gen)
    recomputes = []

    def entropy_fn(logits):
        recomputes.append(torch.is_grad_enabled())  # True only in checkpoint's backward recompute
        return verl_F.entropy_from_logits(logits)

    model_output = {"log_probs": verl_F.logprobs_from_logits(leaf, labels),
                    "entropy": torch.utils.checkpoint.checkpoint(entropy_fn, leaf, use_reentrant=True)}
    loss, metrics = engine_workers.ppo_loss(config=_config(entropy_coeff), model_output=model_output, data=data)
    loss.backward()
    assert patched == ("metric_entropy" in patches.active())
    return loss.detach(), leaf.grad, metrics, recomputes


def _metric_values(metrics):
    return {k: (v.values if hasattr(v, "values") else v) for k, v in metrics.items()}  # verl Metric: .values


def test_apply_is_idempotent_and_revert_restores_verl(patch):
    from verl.utils import torch_functional as verl_F
    from verl.workers import engine_workers

    originals = engine_workers.ppo_loss, verl_F.entropy_from_logits
    patch.apply()
    wrapped = engine_workers.ppo_loss, verl_F.entropy_from_logits
    patch.apply()
    assert (engine_workers.ppo_loss, verl_F.entropy_from_logits) == wrapped
    assert all(w is not o for w, o in zip(wrapped, originals))
    patch.revert()
    assert engine_workers.ppo_loss is originals[0] and verl_F.entropy_from_logits is originals[1]


def test_zero_coefficient_same_gradient_and_metrics_without_the_entropy_backward(patch):
    loss0, grad0, metrics0, recomputes0 = _loss_and_grad(0.0, patched=False)
    patch.apply()
    loss1, grad1, metrics1, recomputes1 = _loss_and_grad(0.0, patched=True)
    assert torch.equal(loss0, loss1) and (grad0 - grad1).abs().max().item() == 0.0
    values0, values1 = _metric_values(metrics0), _metric_values(metrics1)
    assert values0.keys() == values1.keys() and "actor/entropy_loss" in values1
    for key in values0:
        assert torch.equal(torch.as_tensor(values0[key]).float(), torch.as_tensor(values1[key]).float()), key
    assert recomputes0 == [False, True]  # verl: the checkpointed entropy is recomputed in backward
    assert recomputes1 == [False]  # patched: it is not


def test_nonzero_coefficient_is_refused_before_the_loss(patch):
    from rlkit.patches import PatchError

    patch.apply()
    with pytest.raises(PatchError, match=r"entropy_coeff=0.01.*Fix: set actor_rollout_ref.actor.entropy_coeff=0"):
        _loss_and_grad(0.01, patched=True)


class LiveTensorBytes(TorchDispatchMode):
    """Peak bytes of the tensors created inside the mode and still referenced (CPU accounting of temporaries)."""

    def __init__(self) -> None:
        super().__init__()
        self.current = self.peak = 0
        self._live: set[int] = set()

    def _free(self, key: int, nbytes: int) -> None:
        self._live.discard(key)
        self.current -= nbytes

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        inputs = {t.untyped_storage().data_ptr() for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)}
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor) and t.untyped_storage().data_ptr() not in self._live | inputs:  # not a view
                key, nbytes = t.untyped_storage().data_ptr(), t.untyped_storage().nbytes()
                self._live.add(key)
                self.current += nbytes
                self.peak = max(self.peak, self.current)
                weakref.finalize(t, self._free, key, nbytes)
        return out


def _rounding_bound(logits, reference) -> float:
    """How far two evaluations of the same row entropy may differ when only the reductions' work split does.

    Each row is two fp32 reductions over the vocabulary V (log-sum-exp, and sum(p * x) whose terms' absolute
    sum is at most max|x|); summing in another order changes each by at most ~log2(V) * eps times that sum.
    An output stored in a narrower dtype (bf16 on CPU) adds one of its own ulps."""
    vocab = logits.shape[-1]
    fp32 = 2 * math.ceil(math.log2(vocab)) * torch.finfo(torch.float32).eps * (logits.abs().max().item() + 1)
    return fp32 + torch.finfo(reference.dtype).eps * reference.abs().max().item()


def _entropy_and_peak(fn, logits):
    with torch.no_grad(), LiveTensorBytes() as live:  # verl's entropy checkpoint runs its forward without grad
        out = fn(logits)
    return out, live.peak


@pytest.mark.parametrize("autocast", [False, True])
def test_no_grad_entropy_runs_in_row_chunks_same_values_bounded_temporaries(patch, autocast):
    from verl.utils import torch_functional as verl_F

    from rlkit.patches.verl.metric_entropy import ENTROPY_CHUNK_ROWS

    rows, vocab = 3 * ENTROPY_CHUNK_ROWS + 77, 1031  # a ragged last chunk
    logits = torch.randn(3, rows // 3 + 1, vocab, generator=torch.Generator().manual_seed(0)).bfloat16()[:, :-1]
    logits = logits.contiguous()
    context = torch.autocast("cpu", dtype=torch.bfloat16) if autocast else nullcontext()
    with context:
        reference, reference_peak = _entropy_and_peak(verl_F.entropy_from_logits, logits)
        patch.apply()
        chunked, chunked_peak = _entropy_and_peak(verl_F.entropy_from_logits, logits)
    assert chunked.shape == reference.shape == logits.shape[:-1] and chunked.dtype == reference.dtype
    assert (chunked - reference).abs().max().item() <= _rounding_bound(logits, reference)
    # The temporaries scale with one chunk instead of the whole micro-batch.
    whole, chunk = logits.numel() // vocab, ENTROPY_CHUNK_ROWS
    assert reference_peak >= 4 * whole * vocab  # at least one 4-byte or two 2-byte tensors of the logits' size
    assert chunked_peak <= reference_peak * chunk / whole * 1.5 + 16 * whole


def test_entropy_that_records_grad_is_one_call_over_every_row():
    from verl.utils import torch_functional as verl_F

    from rlkit.patches.verl.metric_entropy import ENTROPY_CHUNK_ROWS, chunked_entropy

    logits = torch.randn(ENTROPY_CHUNK_ROWS * 2 + 1, 9, requires_grad=True)
    calls = []

    def counting(x):
        calls.append(x.shape[0])
        return verl_F.entropy_from_logits(x)

    chunked_entropy(counting, logits).sum().backward()  # a gradient flows through it: verl's single call
    with torch.no_grad():
        chunked_entropy(counting, logits)
    assert calls == [logits.shape[0], ENTROPY_CHUNK_ROWS, ENTROPY_CHUNK_ROWS, 1]


def test_compiled_entropy_is_one_call_as_verl_compiles_it():
    """verl's remove-padding path binds torch.compile(entropy_from_logits) at engine start: traced, the
    patched function is verl's single call (a chunk loop over a dynamic row count would recompile per count)."""
    from verl.utils import torch_functional as verl_F

    from rlkit.patches.verl.metric_entropy import ENTROPY_CHUNK_ROWS, chunked_entropy

    calls = []

    def counting(x):
        calls.append(x.shape[0])
        return verl_F.entropy_from_logits(x)

    logits = torch.randn(2 * ENTROPY_CHUNK_ROWS + 5, 11)
    compiled = torch.compile(lambda x: chunked_entropy(counting, x), backend="eager", dynamic=True)
    with torch.no_grad():
        out = compiled(logits)
    assert calls == [logits.shape[0]]
    assert torch.equal(out, verl_F.entropy_from_logits(logits))


@pytest.mark.gpu
def test_cuda_entropy_temporaries_of_a_qwen3_micro_batch(patch):
    """The skip arms' case on a GPU: 8192 tokens x Qwen3's 151936-entry vocabulary, bf16 logits under verl's
    bf16 autocast. The patched forward allocates at most a chunk's temporaries; values within fp32 rounding."""
    from verl.utils import torch_functional as verl_F

    from rlkit.patches.verl.metric_entropy import ENTROPY_CHUNK_ROWS

    logits = torch.randn(24, 8192 // 24, 151936, device="cuda", dtype=torch.bfloat16)

    def extra_peak(fn):
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
            out = fn(logits)
        torch.cuda.synchronize()
        return out, torch.cuda.max_memory_allocated() - base

    reference, reference_extra = extra_peak(verl_F.entropy_from_logits)
    patch.apply()
    chunked, chunked_extra = extra_peak(verl_F.entropy_from_logits)
    rows = logits.numel() // logits.shape[-1]
    print(f"extra peak: verl {reference_extra / 2**30:.2f} GiB, chunked {chunked_extra / 2**30:.2f} GiB; "
          f"max abs diff {(chunked - reference).abs().max().item():.3e}")
    assert chunked_extra <= reference_extra * ENTROPY_CHUNK_ROWS / rows * 1.5 + 64 * 2**20
    assert (chunked - reference).abs().max().item() <= _rounding_bound(logits, reference)
