"""chunked_logprobs against verl 0.9.1's unfused log-probs: the same update through verl's FSDP engine code on a
tiny random Qwen3 (log-probs, entropy, loss and every parameter's gradient within fp32 rounding), the kernel
against a plain log_softmax (fp32) and against verl's own torch backend (bf16 gradient of the output
embedding), the configuration check, apply/revert and the version guard; on a GPU, Qwen3-4B's vocabulary in
bf16: parity and peak memory against the full-logits computation."""
from __future__ import annotations

import pytest
import torch
from _verl_engine import assert_update_matches, build_fused, engine_update, fp32_bound, restored_verl_model_patches

from rlkit import patches
from rlkit.models import qwen as models
from rlkit.patches import PatchError
from rlkit.patches.kernels import chunked_logprobs
from rlkit.patches.kernels.chunked_logprobs import chunked_linear_logprobs

BF16_EPS = torch.finfo(torch.bfloat16).eps
PROMPTS, RESPONSES = [5, 3, 6], [7, 4, 6]  # 31 tokens: with 8-row chunks, three full chunks and a ragged one
CHUNK = 8


@pytest.fixture
def patch():
    yield chunked_logprobs.PATCH
    chunked_logprobs.PATCH.revert()


def _reference(hidden, weight, labels, temperature=1.0):
    """verl's unfused formulas on the whole logits: log_softmax + gather, entropy_from_logits."""
    logits = (hidden @ weight.t()) / temperature
    log_probs = logits.float().log_softmax(-1).gather(-1, labels.unsqueeze(-1)).squeeze(-1)
    p = logits.float().softmax(-1)
    return log_probs, torch.logsumexp(logits.float(), -1) - (p * logits.float()).sum(-1)


# ------------------------------------------------------------------------------------------ the kernel alone
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_kernel_matches_log_softmax_and_its_gradients_in_fp32(temperature):
    gen = torch.Generator().manual_seed(0)
    rows, width, vocab = 45, 24, 97
    hidden = torch.randn(3, rows // 3, width, generator=gen, requires_grad=True)
    weight = torch.randn(vocab, width, generator=gen, requires_grad=True)
    labels = torch.randint(0, vocab, (3, rows // 3), generator=gen)
    g_lp, g_ent = torch.randn(3, rows // 3, generator=gen), torch.randn(3, rows // 3, generator=gen)

    def grads(fn):
        hidden.grad = weight.grad = None
        log_probs, entropy = fn()
        ((log_probs * g_lp).sum() + (entropy * g_ent).sum()).backward()
        return log_probs.detach(), entropy.detach(), hidden.grad.clone(), weight.grad.clone()

    ref = grads(lambda: _reference(hidden, weight, labels, temperature))
    out = grads(lambda: chunked_linear_logprobs(hidden, weight, labels, temperature, chunk_rows=7))
    logits = hidden.detach() @ weight.detach().t() / temperature
    assert out[0].dtype == out[1].dtype == torch.float32 and out[0].shape == labels.shape
    # Gradients are sums whose terms cancel (onehot - p, log p + H): their rounding scales with the sum of the
    # terms' magnitudes, not with the result. A: |d logits| term by term, without cancellation.
    logp = logits.log_softmax(-1)
    p, ent = logp.exp(), -(logp.exp() * logp).sum(-1, keepdim=True)
    onehot = torch.zeros_like(p).scatter_(-1, labels.unsqueeze(-1), 1.0)
    a = (g_lp.abs().unsqueeze(-1) * (onehot + p) + g_ent.abs().unsqueeze(-1) * p * (logp.abs() + ent.abs())) / temperature
    hidden_scale = a @ weight.detach().abs()  # [.., width]: sum over the vocabulary
    weight_scale = a.reshape(-1, vocab).t() @ hidden.detach().abs().reshape(-1, width)  # sum over the rows
    bounds = [fp32_bound(logits, vocab), fp32_bound(logits, vocab),  # log-probs, entropy: sums over the vocabulary
              fp32_bound(hidden_scale, vocab), fp32_bound(weight_scale, rows * vocab)]
    for got, want, bound in zip(out, ref, bounds):
        assert (got - want).abs().max().item() <= bound


def test_kernel_without_entropy_and_without_grad():
    gen = torch.Generator().manual_seed(1)
    hidden, weight = torch.randn(20, 8, generator=gen), torch.randn(33, 8, generator=gen)
    labels = torch.randint(0, 33, (20,), generator=gen)
    with torch.no_grad():
        log_probs, entropy = chunked_linear_logprobs(hidden, weight, labels, chunk_rows=6, with_entropy=False)
    assert entropy is None and not log_probs.requires_grad
    assert (log_probs - _reference(hidden, weight, labels)[0]).abs().max().item() <= fp32_bound(hidden @ weight.t(), 33)
    with pytest.raises(ValueError, match="labels shape"):
        chunked_linear_logprobs(hidden, weight, labels[:-1])


@pytest.mark.verl
def test_output_embedding_gradient_is_summed_in_fp32_unlike_verls_torch_backend():
    """The docstring's reason for replacing verl's torch backend. bf16 inputs; every gradient against the same
    computation in fp64. The unfused path rounds the [V, H] gradient once (one GEMM); rlkit rounds each chunk's
    partial once and sums in fp32, so its error stays within 1.25x the unfused one; verl's backend sums the
    partials in bf16 (one rounding of the running sum per 512 rows: 16 here) and exceeds that."""
    from verl.utils.experimental.torch_functional import FusedLinearForPPO

    gen = torch.Generator().manual_seed(0)
    rows, width, vocab = 8192, 64, 3000
    hidden0, weight0 = torch.randn(rows, width, generator=gen), 0.3 * torch.randn(vocab, width, generator=gen)
    labels, g = torch.randint(0, vocab, (rows,), generator=gen), torch.randn(rows, generator=gen)

    def weight_grad(fn, dtype):
        hidden, weight = hidden0.to(dtype).requires_grad_(), weight0.to(dtype).requires_grad_()
        (fn(hidden, weight) * g.to(torch.float32 if dtype != torch.float64 else dtype)).sum().backward()
        return weight.grad.double()

    exact = weight_grad(lambda h, w: _reference(h, w, labels)[0], torch.float64)

    def rel_error(fn):
        return ((weight_grad(fn, torch.bfloat16) - exact).norm() / exact.norm()).item()

    unfused = rel_error(lambda h, w: _reference(h, w, labels)[0])
    rlkit = rel_error(lambda h, w: chunked_linear_logprobs(h, w, labels, chunk_rows=512, with_entropy=False)[0])
    verl = rel_error(lambda h, w: FusedLinearForPPO()(h, w, labels)[0])
    print(f"relative error of d(lm_head) in bf16: unfused {unfused:.2e}, rlkit {rlkit:.2e}, verl torch backend {verl:.2e}")
    assert rlkit <= 1.25 * unfused
    assert verl > 1.25 * unfused


# -------------------------------------------------------------------------------- through verl's FSDP engine
def _count_chunks(monkeypatch):
    calls = []
    original = chunked_logprobs._chunk_log_softmax

    def counting(hidden, weight, temperature):
        calls.append(hidden.shape[0])
        return original(hidden, weight, temperature)

    monkeypatch.setattr(chunked_logprobs, "_chunk_log_softmax", counting)
    monkeypatch.setattr(chunked_logprobs, "CHUNK_ROWS", CHUNK)
    return calls


@pytest.mark.verl
@pytest.mark.parametrize("entropy_coeff", [0.0, 0.01])
def test_engine_update_matches_verls_unfused_log_probs(patch, monkeypatch, entropy_coeff):
    model = models.build_random_model("tiny")
    with restored_verl_model_patches(type(model)):
        ref = engine_update(model, PROMPTS, RESPONSES, fused=False, entropy_coeff=entropy_coeff)
        patch.apply()
        build_fused(model)
        chunks = _count_chunks(monkeypatch)
        out = engine_update(model, PROMPTS, RESPONSES, fused=True, entropy_coeff=entropy_coeff)
    tokens = len(PROMPTS) * max(p + r for p, r in zip(PROMPTS, RESPONSES))  # the padded batch's rows
    per_pass = [CHUNK] * (tokens // CHUNK) + [tokens % CHUNK]
    assert chunks == per_pass + per_pass  # forward, then backward's recompute: every chunk, nothing whole
    assert_update_matches(ref, out, model, PROMPTS, RESPONSES)


@pytest.mark.verl
def test_a_detached_metric_entropy_skips_the_entropy_backward(patch, monkeypatch):
    """With metric_entropy (entropy_coeff 0) the entropy reaches backward detached: the gradient is the
    chunked path's own, bit for bit, and the entropy branch of the logits' gradient never runs."""
    from rlkit.patches.verl import metric_entropy

    model = models.build_random_model("tiny")
    seen = []
    original = chunked_logprobs._logits_grad
    monkeypatch.setattr(chunked_logprobs, "_logits_grad",
                        lambda logp, labels, g_lp, g_ent: seen.append(g_ent is None) or original(logp, labels, g_lp, g_ent))
    try:
        with restored_verl_model_patches(type(model)):
            patch.apply()
            build_fused(model)
            alone = engine_update(model, PROMPTS, RESPONSES, fused=True, entropy_coeff=0.0)
            metric_entropy.PATCH.apply()
            both = engine_update(model, PROMPTS, RESPONSES, fused=True, entropy_coeff=0.0)
    finally:
        metric_entropy.PATCH.revert()
    assert set(seen[:len(seen) // 2]) == {False} and set(seen[len(seen) // 2:]) == {True}
    assert torch.equal(alone[0], both[0]) and torch.equal(alone[2], both[2])
    assert all(torch.equal(alone[3][k], both[3][k]) for k in alone[3])


@pytest.mark.verl
def test_engine_without_the_fused_torch_path_is_refused(patch):
    from verl.workers.engine.fsdp import transformer_impl

    model = models.build_random_model("tiny")
    patch.apply()
    with restored_verl_model_patches(type(model)):
        for fused, backend in [(False, "torch"), (True, "triton"), (True, None)]:
            with pytest.raises(PatchError, match=r"use_fused_kernels=True and .*impl_backend=torch"):
                transformer_impl.apply_monkey_patch(model=model, use_remove_padding=False,
                                                    use_fused_kernels=fused, fused_kernels_backend=backend)
        value_model = torch.nn.Module()  # no lm_head: a critic / reward model builds as before
        value_model.config = model.config
        chunked_logprobs.check_engine_model(value_model, False, None)


@pytest.mark.verl
def test_apply_is_idempotent_and_revert_restores_verl(patch):
    from verl.utils.experimental import torch_functional as kernels
    from verl.workers.engine.fsdp import transformer_impl

    originals = kernels.FusedLinearForPPO, transformer_impl.apply_monkey_patch
    patch.apply()
    patched = kernels.FusedLinearForPPO, transformer_impl.apply_monkey_patch
    patch.apply()
    assert (kernels.FusedLinearForPPO, transformer_impl.apply_monkey_patch) == patched
    assert issubclass(patched[0], originals[0]) and patched[0] is not originals[0] and patched[1] is not originals[1]
    assert "chunked_logprobs" in patches.active()
    patch.revert()
    assert (kernels.FusedLinearForPPO, transformer_impl.apply_monkey_patch) == originals
    assert "chunked_logprobs" not in patches.active()


def test_refuses_other_verl_versions(patch, monkeypatch):
    real = patches.installed_version
    monkeypatch.setattr(patches, "installed_version",
                        lambda dist: patches.Version("0.9.0") if dist == "verl" else real(dist))
    with pytest.raises(PatchError, match=r"written for verl ==0.9.1 but verl 0.9.0 is installed"):
        patch.apply()
    assert not patch.active()
    monkeypatch.setattr(patches, "installed_version", lambda dist: None if dist == "verl" else real(dist))
    with pytest.raises(PatchError, match="needs verl ==0.9.1, which is not installed"):
        patch.apply()


def test_registered_for_the_plugin():
    assert patches.get("chunked_logprobs") is chunked_logprobs.PATCH


# ------------------------------------------------------------------------------------------------------- GPU
@pytest.mark.gpu
def test_cuda_qwen3_4b_vocabulary_parity_and_peak_memory():
    """24,576 tokens (the seed's micro-batch), hidden 2560, vocabulary 151,936, bf16, through fwd + bwd of a
    token log-prob loss. Full: bf16 logits + fp32 log_softmax (verl's unfused formula). Bounds: log-probs differ
    only by the bf16 rounding of logits computed by GEMMs of another shape, <= 2 bf16 ulps of the largest |logit|;
    gradients are GEMMs over those bf16 logit gradients, each rounded to bf16: <= 4 bf16 ulps of each gradient's
    largest entry. Memory: the chunked path's peak above its inputs is at most one chunk's fp32 logits and one
    temporary plus the fp32 weight-gradient sum, and under a third of the full path's."""
    rows, width, vocab = 24576, 2560, 151936
    gen = torch.Generator(device="cuda").manual_seed(0)
    hidden0 = torch.randn(rows, width, device="cuda", generator=gen).bfloat16()
    weight0 = (0.02 * torch.randn(vocab, width, device="cuda", generator=gen)).bfloat16()
    labels = torch.randint(0, vocab, (rows,), device="cuda", generator=gen)
    g = torch.randn(rows, device="cuda", generator=gen)

    def run(fn):
        hidden, weight = hidden0.clone().requires_grad_(), weight0.clone().requires_grad_()
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        log_probs = fn(hidden, weight)
        (log_probs * g).sum().backward()
        torch.cuda.synchronize()
        return log_probs.detach(), hidden.grad, weight.grad, torch.cuda.max_memory_allocated() - base

    full = run(lambda h, w: (h @ w.t()).float().log_softmax(-1).gather(-1, labels.unsqueeze(-1)).squeeze(-1))
    chunked = run(lambda h, w: chunked_linear_logprobs(h, w, labels, with_entropy=False)[0])
    max_logit = (hidden0[:4096] @ weight0.t()).abs().max().item()
    diffs = [(a.float() - b.float()).abs().max().item() for a, b in zip(chunked[:3], full[:3])]
    print(f"peak above inputs: full {full[3] / 2**30:.2f} GiB, chunked {chunked[3] / 2**30:.2f} GiB; "
          f"max abs diff log-probs {diffs[0]:.2e}, d hidden {diffs[1]:.2e}, d weight {diffs[2]:.2e}")
    assert diffs[0] <= 2 * BF16_EPS * max_logit
    assert diffs[1] <= 4 * BF16_EPS * full[1].abs().max().item()
    assert diffs[2] <= 4 * BF16_EPS * full[2].abs().max().item()
    chunk_bytes = chunked_logprobs.CHUNK_ROWS * vocab * (2 + 4 + 4)
    grad_bytes = 2 * rows * width + vocab * width * (4 + 2 + 2)
    assert chunked[3] <= 1.25 * (chunk_bytes + grad_bytes)
    assert chunked[3] * 3 <= full[3]
