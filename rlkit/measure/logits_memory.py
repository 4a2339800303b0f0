"""Bytes per logit element of verl's forward-only log-prob stage, measured on the CPU with verl's own code.

The stage measured is what verl 0.9.1's engine (``FSDPEngineWithLMHead``, the V1 trainer's actor) runs on
the lm_head's logits of one micro-batch in ``compute_log_prob`` (old_log_prob): ``prepare_model_inputs``
then ``prepare_model_outputs``, called as verl calls them (the trainer asks for the entropy there,
``calculate_entropy=True``, and a scalar temperature). The logits arrive in bf16, as the lm_head returns them
under verl's bf16 autocast, shaped ``[sequences, longest sequence, vocab]`` without remove-padding.

Two things make the CPU answer the GPU's:

* verl runs the stage inside ``torch.autocast("cuda", bf16)``, whose policy upcasts softmax, log_softmax,
  sum (fp32 unless a dtype is given) and logsumexp (inputs cast to fp32); CPU autocast does not. On the CPU
  :class:`CudaAutocastPolicy` applies those casts, and :func:`autocast_dtype_trace` checks them against
  torch's own CUDA autocast dispatcher (fake CUDA tensors, no GPU needed): the same aten ops in the same dtypes.
* The temporaries inside an op (logsumexp's ``self - max``) are ATen's device-generic composite code, the
  same on both devices; :func:`peak_bytes` counts every allocation the CPU allocator makes (torch's profiler
  with ``profile_memory``), not only the ops' outputs.

What is not measured here: the caching allocator's rounding and fragmentation on the GPU, and the lm_head
matmul itself (its output is the bf16 logits this stage starts from).
"""
from __future__ import annotations

from types import SimpleNamespace
from typing import Any, Callable

import torch
from torch.overrides import TorchFunctionMode

from rlkit.models.qwen import PRESETS

QWEN3_VOCAB = PRESETS["qwen3-4b"]["vocab_size"]  # the logits' last dimension

_LOW = (torch.bfloat16, torch.float16)


def _is_low(x: Any) -> bool:
    return isinstance(x, torch.Tensor) and x.is_floating_point() and x.dtype in _LOW


class CudaAutocastPolicy(TorchFunctionMode):
    """torch's CUDA autocast policy (aten/src/ATen/autocast_mode.cpp) for the ops of verl's log-prob stage,
    applied to CPU tensors: ``softmax``, ``log_softmax`` and ``sum`` of a bf16/fp16 tensor without a dtype
    run with ``dtype=float32`` (autocast's ``fp32_set_opt_dtype``); ``logsumexp``, ``exp`` and ``log`` cast a
    bf16/fp16 input to fp32 first (autocast's fp32 list). Other ops are left to type promotion, as under
    autocast. :func:`autocast_dtype_trace` checks this against the real CUDA dispatcher."""

    SET_OPT_DTYPE = {torch.nn.functional.softmax, torch.softmax, torch.Tensor.softmax,
                     torch.nn.functional.log_softmax, torch.log_softmax, torch.Tensor.log_softmax,
                     torch.sum, torch.Tensor.sum}
    FP32 = {torch.logsumexp, torch.Tensor.logsumexp, torch.exp, torch.Tensor.exp, torch.log, torch.Tensor.log}

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        if func in self.SET_OPT_DTYPE and args and _is_low(args[0]) and kwargs.get("dtype") is None:
            kwargs["dtype"] = torch.float32
        elif func in self.FP32 and args and _is_low(args[0]):
            args = (args[0].float(), *args[1:])
        return func(*args, **kwargs)


def autocast_dtype_trace(fn: Callable[..., Any], *shapes: tuple[int, ...], device: str) -> list[tuple[str, str]]:
    """The aten ops ``fn`` dispatches, each with its output's dtype, on bf16 inputs of ``shapes``:
    ``device="cuda"``: fake CUDA tensors under torch's own bf16 CUDA autocast (works without a GPU);
    ``device="cpu"``: real CPU tensors under :class:`CudaAutocastPolicy`. Equal traces mean the policy
    reproduces CUDA autocast for ``fn``."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.utils._python_dispatch import TorchDispatchMode

    trace: list[tuple[str, str]] = []

    class _Trace(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            if isinstance(out, torch.Tensor) and func.namespace == "aten":
                trace.append((str(func.overloadpacket.__name__), str(out.dtype)))
            return out

    if device == "cuda":
        with FakeTensorMode():
            inputs = [torch.empty(s, dtype=torch.bfloat16, device="cuda") for s in shapes]
            was = torch.is_autocast_enabled("cuda"), torch.get_autocast_dtype("cuda")
            torch.set_autocast_enabled("cuda", True)  # torch.autocast("cuda") refuses without a GPU
            torch.set_autocast_dtype("cuda", torch.bfloat16)
            try:
                with _Trace():
                    fn(*inputs)
            finally:
                torch.set_autocast_enabled("cuda", was[0])
                torch.set_autocast_dtype("cuda", was[1])
    elif device == "cpu":
        inputs = [torch.zeros(s, dtype=torch.bfloat16) for s in shapes]
        with CudaAutocastPolicy(), _Trace():
            fn(*inputs)
    else:
        raise ValueError(f"device {device!r}: 'cuda' (fake, torch's autocast) or 'cpu' (CudaAutocastPolicy)")
    return trace


def peak_bytes(fn: Callable[[], Any]) -> dict[str, int]:
    """Peak of the bytes the CPU allocator holds while ``fn()`` runs, above what was held before it (every
    allocation and free, temporaries inside ops included: torch's profiler with ``profile_memory``), and
    the bytes still held when it returns."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        result = fn()
    events = sorted((e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"),
                    key=lambda e: e.start_ns())
    live = peak = 0
    for e in events:
        live += e.nbytes()
        peak = max(peak, live)
    del result
    return {"peak": peak, "end": live}


def _engine_self(remove_padding: bool) -> SimpleNamespace:
    """The attributes of ``FSDPEngineWithLMHead`` its ``prepare_model_inputs`` / ``prepare_model_outputs``
    read for a one-GPU actor (no Ulysses, no static pad), with verl's default entropy settings."""
    import verl.utils.torch_functional as verl_F

    engine_config = SimpleNamespace(entropy_checkpointing=False, entropy_from_logits_with_chunking=False,
                                    entropy_from_logits_chunk_size=2048)
    return SimpleNamespace(engine_config=engine_config, use_remove_padding=remove_padding, use_ulysses_sp=False,
                           ulysses_sequence_parallel_size=1, pad_to_length=None, pass_packed_cu_seqlens=False,
                           compute_entropy_from_logits=verl_F.entropy_from_logits,
                           _get_packed_pad_size=lambda n: 0,
                           _gather_and_unpad_packed=lambda x, pad_size: x)


def micro_batch(seq_lens: list[int], vocab: int, *, remove_padding: bool = False, calculate_entropy: bool = True,
                temperature: float = 1.0, seed: int = 0):
    """A forward-only micro-batch as verl's engine receives it: nested (jagged) ``input_ids`` and
    ``position_ids`` of ``seq_lens`` tokens each, and the non-tensor keys old_log_prob sets."""
    from tensordict import TensorDict
    from verl.utils import tensordict_utils as tu

    g = torch.Generator().manual_seed(seed)
    ids = [torch.randint(0, vocab, (n,), generator=g) for n in seq_lens]
    td = TensorDict({"input_ids": torch.nested.as_nested_tensor(ids, layout=torch.jagged),
                     "position_ids": torch.nested.as_nested_tensor([torch.arange(n) for n in seq_lens],
                                                                   layout=torch.jagged)},
                    batch_size=[len(seq_lens)])
    tu.assign_non_tensor(td, use_remove_padding=remove_padding, calculate_entropy=calculate_entropy,
                         temperature=temperature, use_fused_kernels=False)
    return td


def measure_log_prob_stage(seq_lens: list[int], vocab: int = QWEN3_VOCAB, *, remove_padding: bool = False,
                           calculate_entropy: bool = True, temperature: float = 1.0) -> dict[str, Any]:
    """Peak memory of verl's log-prob stage on one micro-batch of ``seq_lens`` sequences, per logit element.

    Runs verl's ``FSDPEngineWithLMHead.prepare_model_inputs`` and ``prepare_model_outputs`` (the latter under
    :class:`CudaAutocastPolicy`, as verl runs it under CUDA autocast) on bf16 logits of the shape the model
    returns: ``[1, tokens, vocab]`` with ``remove_padding``, else ``[sequences, longest, vocab]``. Returns the
    element counts (``positions`` x vocab: the logits the model returns; ``tokens`` x vocab: the actual
    tokens), the peak bytes above the logits, and ``bytes_per_element``: (logits + peak above them) /
    (positions x vocab), the number a planner multiplies positions x vocab by.
    """
    from verl.workers.engine.fsdp.transformer_impl import FSDPEngineWithLMHead

    engine = _engine_self(remove_padding)
    mb = micro_batch(seq_lens, vocab, remove_padding=remove_padding, calculate_entropy=calculate_entropy,
                     temperature=temperature)
    model_inputs, output_args = FSDPEngineWithLMHead.prepare_model_inputs(engine, mb)
    shape = tuple(model_inputs["input_ids"].shape)  # (1, tokens) or (sequences, longest)
    logits = torch.randn(*shape, vocab, dtype=torch.bfloat16)
    output = SimpleNamespace(logits=logits)

    def stage():
        with torch.no_grad(), CudaAutocastPolicy():  # old_log_prob is forward-only: verl runs it under no_grad
            return FSDPEngineWithLMHead.prepare_model_outputs(engine, output, output_args, mb, None)

    held = peak_bytes(stage)
    positions, tokens = shape[0] * shape[1], sum(seq_lens)
    logits_bytes = logits.numel() * logits.element_size()
    return {"seq_lens": list(seq_lens), "vocab": vocab, "remove_padding": remove_padding,
            "calculate_entropy": calculate_entropy, "temperature": temperature, "logits_shape": [*shape, vocab],
            "positions": positions, "tokens": tokens, "logits_bytes": logits_bytes,
            "peak_above_logits_bytes": held["peak"], "held_after_bytes": held["end"],
            "bytes_per_element": (logits_bytes + held["peak"]) / (positions * vocab),
            "bytes_per_token_element": (logits_bytes + held["peak"]) / (tokens * vocab)}

