"""Kernel-level measurements for the update forward (issue 23): chunked log-probs and varlen attention.

    python -m rlkit.experiments.kernels --out DIR [--profile h200|tiny | --tiny] [-p key=value] [--tag TAG]

writes ``DIR/kernels/<tag>/`` (``params.yaml``, ``env.json``, ``metrics.json``; tag defaults to the profile).
Needs only torch and transformers: the GPU node has neither verl nor flash-attn, so nothing here imports verl
(``rlkit.patches.kernels.chunked_logprobs`` imports it only when its patch is applied; ``varlen_attention`` never).
Everything runs in this one process on one device, one measurement after the other; peaks are
``torch.cuda.max_memory_allocated`` reset before each timed arm.

(i) ``logprobs``: a random-init ``model`` (Qwen3-4B in bf16 on the GPU, rlkit's offline config, no download),
gradient checkpointing, ``sequences x seq_len`` tokens (12 x 2048 = 24,576, the seed's micro-batch), fwd+bwd of
a token log-prob loss ``-sum(w * log p(label))`` with random per-token weights ``w`` (advantages). Arm ``full``:
the model's logits, ``logits.float().log_softmax(-1)`` and a gather (verl's unfused formula, vectorised);
arms ``chunked_<rows>``: the decoder's hidden states into :func:`rlkit.patches.kernels.chunked_logprobs.chunked_linear_logprobs`
with its entropy on (detached, as the patch computes it in verl), and once without the entropy
(``_no_entropy``). One warm-up step, then ``repeats`` timed steps; ``peak_above_start_gib`` is the step's peak above
the model, its gradients and the inputs.
(iii) ``logprobs.parity``: each chunked arm against ``full`` on the same weights and tokens: max |log-prob
difference|, |loss difference|, and per parameter max |grad difference| / max |grad| (largest, median, which);
and ``full_repeated``, the full arm's last step against its warm-up (same inputs): the run-to-run noise of the
reference itself (non-deterministic GPU kernels), the yardstick for the chunked arms' differences.
(ii) ``attention``: one decoder layer of ``attention_model`` in bf16 (GPU), fwd+bwd, for each case of
``ATTENTION_CASES[attention_cases]``: ``rlkit_varlen`` on the packed row against transformers' SDPA on the
right-padded batch with its 4-D mask. Inputs are prepared outside the timed region (the padding copy is paid
once per forward in a model, not per layer). Times are medians of ``attention_repeats`` CUDA-event-timed runs
after two warm-ups; the layers' outputs are compared on the valid tokens.
"""
from __future__ import annotations

import statistics
import sys
import time
from dataclasses import dataclass
from typing import Any

from rlkit.core import params as P
from rlkit.models import qwen as models

NOTEBOOK = "kernels"  # the results folder's name (no notebook renders these yet)
GIB = 2**30

# Cases of (ii): (a) 16k tokens of sequences up to 764 tokens; (b) five sequences up to 5.5k tokens.
ATTENTION_CASES: dict[str, dict[str, dict[str, int]]] = {
    "h200": {
        "a_16k_tokens_up_to_764": {"total_tokens": 16384, "min_len": 64, "max_len": 764},
        "b_five_sequences_up_to_5.5k": {"num_sequences": 5, "min_len": 1024, "max_len": 5632},
    },
    "tiny": {
        "a_tokens_up_to_40": {"total_tokens": 256, "min_len": 8, "max_len": 40},
        "b_five_sequences_up_to_88": {"num_sequences": 5, "min_len": 16, "max_len": 88},
    },
}


@dataclass(frozen=True)
class Config:
    model: str  # rlkit.models.qwen preset for (i) and (iii): qwen3-4b | tiny
    device: str  # auto (cuda if available) | cuda | cpu
    sequences: int  # sequences per micro-batch in (i)
    seq_len: int  # tokens per sequence in (i)
    gradient_checkpointing: bool  # like verl's enable_gradient_checkpointing
    chunk_rows: tuple[int, ...]  # one chunked arm per value (rows per chunk)
    repeats: int  # timed steps per log-prob arm, after one warm-up
    attention_repeats: int  # timed layer fwd+bwd per attention arm, after two warm-ups
    attention_model: str  # preset whose decoder layer (ii) times
    attention_cases: str  # key of ATTENTION_CASES: h200 | tiny
    seed: int  # weights, tokens, sequence lengths

    def __post_init__(self):
        for key in ("sequences", "seq_len", "repeats", "attention_repeats"):
            if getattr(self, key) < 1:
                raise P.ParamError(f"{key}={getattr(self, key)}: must be >= 1.")
        if not self.chunk_rows or min(self.chunk_rows) < 1:
            raise P.ParamError(f"chunk_rows={list(self.chunk_rows)}: list one or more positive row counts, e.g. [4096].")
        if self.device not in ("auto", "cuda", "cpu"):
            raise P.ParamError(f"device={self.device!r}: use 'auto', 'cuda' or 'cpu'.")
        if self.attention_cases not in ATTENTION_CASES:
            raise P.ParamError(f"attention_cases={self.attention_cases!r}: use one of {sorted(ATTENTION_CASES)}.")
        for key in ("model", "attention_model"):
            if getattr(self, key) not in models.PRESETS:
                raise P.ParamError(f"{key}={getattr(self, key)!r}: use an rlkit.models.qwen preset ({sorted(models.PRESETS)}).")


PROFILES: dict[str, dict[str, Any]] = {
    "h200": {"model": "qwen3-4b", "device": "cuda", "sequences": 12, "seq_len": 2048, "gradient_checkpointing": True,
             "chunk_rows": [2048, 4096, 8192], "repeats": 2, "attention_repeats": 10, "attention_model": "qwen3-4b",
             "attention_cases": "h200", "seed": 0},
    "tiny": {"model": "tiny", "device": "cpu", "sequences": 2, "seq_len": 48, "gradient_checkpointing": True,
             "chunk_rows": [16, 40], "repeats": 1, "attention_repeats": 1, "attention_model": "tiny",
             "attention_cases": "tiny", "seed": 0},
}


# ------------------------------------------------------------------------------------------- small helpers
def _device(name: str):
    import torch

    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cuda" and not torch.cuda.is_available():
        raise P.ParamError("device='cuda' but torch sees no CUDA device. Fix: -p device=cpu (or auto).")
    return torch.device(name)


def _sync(device) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _reset_peak(device) -> int:
    import torch

    if device.type != "cuda":
        return 0
    _sync(device)
    torch.cuda.reset_peak_memory_stats(device)
    return torch.cuda.memory_allocated(device)


def _peak(device, start: int) -> dict[str, float | None]:
    import torch

    if device.type != "cuda":
        return {"peak_allocated_gib": None, "peak_above_start_gib": None}
    _sync(device)
    peak = torch.cuda.max_memory_allocated(device)
    return {"peak_allocated_gib": peak / GIB, "peak_above_start_gib": (peak - start) / GIB}


def _timed(fn, device, repeats: int, warmup: int) -> list[float]:
    """Seconds per call of ``fn`` (CUDA events on a GPU, wall clock on the CPU) after ``warmup`` calls."""
    import torch

    for _ in range(warmup):
        fn()
    out = []
    for _ in range(repeats):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            out.append(start.elapsed_time(end) / 1000)
        else:
            t0 = time.perf_counter()
            fn()
            out.append(time.perf_counter() - t0)
    return out


def sequence_lengths(*, max_len: int, min_len: int, seed: int, total_tokens: int | None = None,
                     num_sequences: int | None = None) -> list[int]:
    """Random lengths in [min_len, max_len], the first one max_len: ``num_sequences`` of them, or as many as make
    exactly ``total_tokens`` (the last one trimmed)."""
    import random

    if (total_tokens is None) == (num_sequences is None):
        raise ValueError("give exactly one of total_tokens and num_sequences")
    rng = random.Random(seed)
    lengths = [max_len]
    while (num_sequences is not None and len(lengths) < num_sequences) or (
            total_tokens is not None and sum(lengths) < total_tokens):
        lengths.append(rng.randint(min_len, max_len))
    if total_tokens is not None:
        lengths[-1] -= sum(lengths) - total_tokens
    return lengths


# ----------------------------------------------------------------------------------- (ii) one decoder layer
def padded_sdpa_attention(query, key, value, lengths: list[int], scale: float):
    """transformers' ``sdpa_attention_forward`` on the right-padded batch of packed ``query``/``key``/``value``
    ([1, heads, tokens, dim]) with the 4-D causal + padding mask; returns the valid tokens, [tokens, heads, dim]."""
    import torch
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    index, mask = _padding(lengths, query.device)
    batch, width = mask.shape

    def pad(t):
        flat = t[0].transpose(0, 1)  # [tokens, heads, dim]
        out = flat.new_zeros(batch * width, *flat.shape[1:]).index_copy(0, index, flat)
        return out.view(batch, width, *flat.shape[1:]).transpose(1, 2)

    class Attention:
        is_causal = True
        num_key_value_groups = query.shape[1] // key.shape[1]

    causal = torch.ones(width, width, dtype=torch.bool, device=query.device).tril()
    mask4d = causal[None, None] & mask[:, None, None, :].bool()
    out, _ = sdpa_attention_forward(Attention(), pad(query), pad(key), pad(value), mask4d, scaling=scale)
    return out.reshape(batch * width, *out.shape[2:]).index_select(0, index)


def _padding(lengths: list[int], device):
    import torch

    width = max(lengths)
    mask = torch.stack([torch.arange(width, device=device) < n for n in lengths])
    return mask.reshape(-1).nonzero().view(-1), mask


def attention_case(name: str, *, device, repeats: int, model: str = "qwen3-4b", seed: int = 0, max_len: int,
                   min_len: int, total_tokens: int | None = None, num_sequences: int | None = None) -> dict[str, Any]:
    """One decoder layer of ``model``, fwd+bwd: ``rlkit_varlen`` on the packed row vs SDPA on the padded batch.
    Needs the varlen_attention patch applied (``run`` applies it)."""
    import torch

    from rlkit.patches.kernels import varlen_attention

    device = torch.device(device)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    lengths = sequence_lengths(max_len=max_len, min_len=min_len, seed=seed, total_tokens=total_tokens,
                               num_sequences=num_sequences)
    one_layer = models.build_random_model(model, seed=seed, dtype=dtype, device=device, num_hidden_layers=1)
    layer, rotary, config = one_layer.model.layers[0], one_layer.model.rotary_emb, one_layer.config
    index, mask = _padding(lengths, device)
    batch, width = mask.shape
    tokens, hidden = sum(lengths), config.hidden_size
    gen = torch.Generator(device=device).manual_seed(seed)
    x = torch.randn(tokens, hidden, device=device, generator=gen, dtype=torch.float32).to(dtype)
    g = torch.randn(tokens, hidden, device=device, generator=gen, dtype=torch.float32).to(dtype)
    packed_pos = torch.cat([torch.arange(n, device=device) for n in lengths]).unsqueeze(0)
    padded_pos = torch.arange(width, device=device).expand(batch, width)
    padded_x = x.new_zeros(batch * width, hidden).index_copy(0, index, x).view(batch, width, hidden)
    padded_g = g.new_zeros(batch * width, hidden).index_copy(0, index, g).view(batch, width, hidden)
    mask4d = torch.ones(width, width, dtype=torch.bool, device=device).tril()[None, None] & mask[:, None, None, :]

    def arm(impl, inputs, positions, attention_mask, grad):
        def step():
            config._attn_implementation = impl
            layer.zero_grad(set_to_none=True)
            h = inputs.detach().requires_grad_()
            out = layer(h, attention_mask=attention_mask, position_ids=positions,
                        position_embeddings=rotary(h, positions))
            out = out[0] if isinstance(out, tuple) else out
            out.backward(grad)
            return out.detach()
        return step

    varlen = arm(varlen_attention.NAME, x.unsqueeze(0), packed_pos, None, g.unsqueeze(0))
    padded = arm("sdpa", padded_x, padded_pos, mask4d, padded_g)
    row: dict[str, Any] = {"case": name, "sequences": len(lengths), "tokens": tokens, "max_len": max(lengths),
                           "padded_tokens": batch * width, "dtype": str(dtype).replace("torch.", "")}
    for key, step in (("varlen", varlen), ("padded_sdpa", padded)):
        calls = dict(varlen_attention.CALLS)
        start = _reset_peak(device)
        seconds = _timed(step, device, repeats, warmup=2)
        row[f"{key}_ms"] = 1000 * statistics.median(seconds)
        row[f"{key}_peak_above_start_gib"] = _peak(device, start)["peak_above_start_gib"]
        if key == "varlen":  # which path rlkit_varlen took in these calls
            ran = {k: v - calls.get(k, 0) for k, v in varlen_attention.CALLS.items() if v - calls.get(k, 0)}
            row["varlen_uses_kernel"] = set(ran) == {"kernel"}
            row["varlen_calls"] = ran
    out_varlen = varlen()[0].float()
    out_padded = padded().reshape(batch * width, hidden).index_select(0, index).float()
    row["max_abs_diff"] = (out_varlen - out_padded).abs().max().item()
    row["max_abs_output"] = out_padded.abs().max().item()
    row["speedup_padded_over_varlen"] = row["padded_sdpa_ms"] / row["varlen_ms"]
    return row


# ------------------------------------------------------------------------------- (i) + (iii) log-prob loss
def logprob_arms(cfg: Config, device) -> dict[str, Any]:
    import torch

    from rlkit.patches.kernels.chunked_logprobs import chunked_linear_logprobs

    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    model = models.build_random_model(cfg.model, seed=cfg.seed, dtype=dtype, device=device)
    model.set_attn_implementation("sdpa")
    model.train()
    if cfg.gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    vocab = model.config.vocab_size
    gen = torch.Generator(device=device).manual_seed(cfg.seed)
    ids = torch.randint(3, vocab, (cfg.sequences, cfg.seq_len), device=device, generator=gen)
    labels = ids.roll(-1, dims=1)
    weights = torch.randn(cfg.sequences, cfg.seq_len, device=device, generator=gen) / ids.numel()
    logits_dtype = []

    def full():
        logits = model(input_ids=ids, use_cache=False).logits
        logits_dtype.append(str(logits.dtype).replace("torch.", ""))
        return logits.float().log_softmax(-1).gather(-1, labels.unsqueeze(-1)).squeeze(-1)

    def chunked(rows, with_entropy=True):
        def fn():
            hidden = model.model(input_ids=ids, use_cache=False).last_hidden_state
            return chunked_linear_logprobs(hidden, model.lm_head.weight, labels, chunk_rows=rows,
                                           with_entropy=with_entropy)[0]
        return fn

    arms = [("full", full)] + [(f"chunked_{rows}", chunked(rows)) for rows in cfg.chunk_rows]
    arms.append((f"chunked_{cfg.chunk_rows[0]}_no_entropy", chunked(cfg.chunk_rows[0], with_entropy=False)))
    results, parities, reference = [], [], None
    for name, forward in arms:
        last = {}

        def step(forward=forward, last=last):
            model.zero_grad(set_to_none=False)  # keep the gradient buffers: every arm starts from the same bytes
            log_probs = forward()
            loss = -(weights * log_probs).sum()
            loss.backward()
            last.update(log_probs=log_probs.detach(), loss=loss.item())

        step()  # warm-up (also allocates the gradients)
        warm = _snapshot(model, last) if reference is None else None
        start = _reset_peak(device)
        seconds = _timed(step, device, cfg.repeats, warmup=0)
        results.append({"arm": name, "seconds": seconds, "median_s": statistics.median(seconds),
                        **_peak(device, start), "loss": last["loss"]})
        if reference is None:  # the full arm: the reference, and its own repeat as the noise yardstick
            parities.append({"arm": "full_repeated", **parity(warm, _live(model, last))})
            reference = _snapshot(model, last)
        else:
            parities.append({"arm": name, **parity(reference, _live(model, last))})
        print(f"[kernels] logprobs {name}: {results[-1]['median_s']:.3f} s, "
              f"peak above start {results[-1]['peak_above_start_gib']} GiB", file=sys.stderr)
    return {"tokens": ids.numel(), "vocab": vocab, "model": cfg.model, "dtype": str(dtype).replace("torch.", ""),
            "logits_dtype": logits_dtype[0], "arms": results, "parity": parities}


def _live(model, last) -> dict[str, Any]:
    return {**last, "grads": {n: p.grad for n, p in model.named_parameters()}}


def _snapshot(model, last) -> dict[str, Any]:
    """The step's outputs and gradients copied to host memory (they stay out of the next arms' device peaks)."""
    return {"log_probs": last["log_probs"].cpu(), "loss": last["loss"],
            "grads": {n: p.grad.detach().cpu() for n, p in model.named_parameters()}}


def parity(ref: dict[str, Any], row: dict[str, Any]) -> dict[str, Any]:
    """A chunked arm against ``full``: log-probs, loss, and every parameter's gradient."""
    relative = {}
    for name, g1 in row["grads"].items():
        g0 = ref["grads"][name].to(g1.device)
        scale = g0.abs().max().item()
        relative[name] = (g1.float() - g0.float()).abs().max().item() / scale if scale else 0.0
    worst = max(relative, key=relative.get)
    log_probs = row["log_probs"].float()
    return {"max_abs_logprob_diff": (log_probs - ref["log_probs"].to(log_probs.device).float()).abs().max().item(),
            "loss_abs_diff": abs(row["loss"] - ref["loss"]),
            "grad_rel_diff_max": relative[worst], "grad_rel_diff_median": statistics.median(relative.values()),
            "grad_rel_diff_worst_param": worst, "params": len(relative)}


# ----------------------------------------------------------------------------------------------- the run
def run(cfg: Config) -> dict[str, Any]:
    import torch

    from rlkit.patches.kernels import varlen_attention

    device = _device(cfg.device)
    was_active = varlen_attention.PATCH.active()
    varlen_attention.PATCH.apply()
    try:
        logprobs = logprob_arms(cfg, device)
        if device.type == "cuda":
            torch.cuda.empty_cache()
        cases = []
        for name, case in ATTENTION_CASES[cfg.attention_cases].items():
            cases.append(attention_case(name, device=device, repeats=cfg.attention_repeats, model=cfg.attention_model,
                                        seed=cfg.seed, **case))
            print(f"[kernels] attention {name}: varlen {cases[-1]['varlen_ms']:.2f} ms, "
                  f"padded SDPA {cases[-1]['padded_sdpa_ms']:.2f} ms", file=sys.stderr)
    finally:
        if not was_active:
            varlen_attention.PATCH.revert()
    return {"config": P.as_dict(cfg), "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
            "logprobs": logprobs, "attention": {"cases": cases}}


def main(argv=None) -> int:
    from rlkit.experiments import built_in_parser, run_built_in

    ns = built_in_parser("kernels", __doc__.split("\n\n")[0], PROFILES, NOTEBOOK).parse_args(argv)
    return 0 if run_built_in(ns, Config, PROFILES, NOTEBOOK, lambda cfg, _work_dir: run(cfg)) is not None else 2


if __name__ == "__main__":
    sys.exit(main())
