"""varlen_attention: a transformers attention implementation, ``rlkit_varlen``, for packed sequences without flash-attn.

verl's remove-padding path (``actor_rollout_ref.model.use_remove_padding=True``) packs a micro-batch into one
row: ``FSDPEngineWithLMHead.prepare_model_inputs`` calls the model with ``input_ids`` [1, tokens],
``attention_mask=None`` and ``position_ids`` that restart at 0 at every sequence. verl defaults the attention to
``flash_attention_2`` (``HFModelConfig``: ``override_config.get("attn_implementation", "flash_attention_2")``),
whose transformers integration derives ``cu_seqlens`` from those resets (``prepare_fa_kwargs_from_position_ids``)
and needs the flash_attn package, which the GPU node does not have. ``sdpa`` is correct there but builds a
dense [tokens, tokens] block-diagonal mask from the position ids and runs a masked kernel.

``rlkit_varlen`` (select it with ``+actor_rollout_ref.model.override_config.attn_implementation=rlkit_varlen``)
finds the sequences the way transformers' flash-attention path does, then runs
``torch.nn.attention.varlen.varlen_attn`` (PyTorch's own flash kernel; CUDA, fp16/bf16) on them, and otherwise,
on the CPU, in fp32 or for head dims the kernel does not take, causal ``scaled_dot_product_attention`` per
sequence, so CI runs the same plumbing. Where the sequences come from, first match wins:

1. ``cu_seq_lens_q`` / ``max_length_q`` keyword arguments (transformers' ``FlashAttentionKwargs``), if given;
2. a 2-D padding mask (registered mask function: transformers' ``flash_attention_mask``, which hands the 2-D
   mask through when there is padding and ``None`` otherwise): the valid tokens of each row, unpadded, outputs
   scattered back with zeros at the padding (verl's padded path, generation without a cache);
3. ``position_ids`` of a single row: a new sequence at every 0 (and at the first token);
4. otherwise every row is one sequence.

The boundaries are found once per forward (one host sync) and reused by every layer (cached on the identity
and version of the tensor they came from).

Signature differences (read at run time): torch 2.11's ``varlen_attn(q, k, v, cu_seq_q, cu_seq_k, max_q, max_k,
*, return_aux, scale, window_size)`` is causal with ``window_size=(-1, 0)`` and has no ``enable_gqa``: it hands
grouped-query K/V (Qwen3-4B: 32 query / 8 KV heads) to the flash kernel unchecked, which takes them natively; from
2.12 it asks for ``enable_gqa``.
An older signature with ``is_causal`` is also handled.

verl 0.9.1 places that name "flash_attention_2" (searched in verl/): ``workers/config/model.py`` (the default, overridden
as above), ``utils/model.py`` ``load_valuehead_model`` (critic / reward value heads: hard-coded, not used by GRPO),
``models/transformers/monkey_patch.py`` (``_PREFIX_GROUPER_SUPPORTED_ATTENTIONS``, only with ``use_prefix_grouper``;
and with remove-padding it swaps transformers' ``_flash_attention_forward`` for its Ulysses wrapper, which this
implementation never calls). Nothing in the FSDP engine checks the name before using the remove-padding path.
Ulysses sequence parallelism (``ulysses_sequence_parallel_size > 1``) needs that wrapper's all-to-all: this
implementation refuses it. Sliding-window layers and attention dropout are refused too (Qwen3 uses neither).

The patch needs only torch and transformers (it runs on a node without verl); the plugin applies it in every
verl process, before the model is loaded, because transformers refuses unregistered names at load time.
"""
from __future__ import annotations

import collections
import inspect
import itertools
import sys
import weakref
from functools import lru_cache
from typing import NamedTuple

import torch
import torch.nn.functional as F

from rlkit.patches import Patch, PatchError, supported

NAME = "rlkit_varlen"
KERNEL_DTYPES = (torch.float16, torch.bfloat16)
# Attention calls per path, "kernel" or "per_sequence_sdpa": what actually ran, for measurements and tests.
CALLS: collections.Counter = collections.Counter()


class Segments(NamedTuple):
    """Sequence boundaries of the packed tokens: ``cu_seqlens`` (int32, [n + 1]), the longest length, and for a
    padded batch the flat indices of the valid tokens (None when every token is valid)."""

    cu_seqlens: torch.Tensor
    max_len: int
    index: torch.Tensor | None


def _from_lengths(lengths: torch.Tensor, index=None) -> Segments:
    cu = F.pad(lengths.to(torch.int32).cumsum(0, dtype=torch.int32), (1, 0))
    return Segments(cu, int(lengths.max().item()) if lengths.numel() else 0, index)


def segments_from_position_ids(position_ids: torch.Tensor) -> Segments:
    """A new sequence at every position 0 and at the first token (transformers' flash-attention rule)."""
    positions = position_ids.reshape(-1)
    starts = positions == 0
    starts[0] = True
    cu = F.pad(starts.nonzero().view(-1), (0, 1), value=positions.numel())
    return _from_lengths(cu.diff())


def segments_from_padding_mask(mask: torch.Tensor) -> Segments:
    """Valid tokens of each row of a [batch, seq] mask (1 = token), in order; rows stay separate sequences."""
    valid = mask.bool()
    return _from_lengths(valid.sum(-1), valid.reshape(-1).nonzero().view(-1))


class _OneEntryCache:
    """The last segments, keyed on the identity and version of the tensor they were derived from: every layer of
    one forward (and its checkpoint recompute) gets the same position_ids / mask object."""

    def __init__(self) -> None:
        self._key = None
        self._value = None

    def get(self, source: torch.Tensor, build):
        ref, version, shape = self._key or (None, None, None)
        if ref is not None and ref() is source and version == source._version and shape == source.shape:
            return self._value
        value = build(source)
        self._key, self._value = (weakref.ref(source), source._version, source.shape), value
        return value


_CACHE = _OneEntryCache()


def find_segments(batch: int, seq: int, device, attention_mask=None, position_ids=None, cu_seq_lens_q=None,
                  max_length_q=None) -> Segments:
    """The rules 1-4 of the module docstring."""
    if cu_seq_lens_q is not None:
        if batch != 1:
            raise ValueError(f"{NAME}: cu_seq_lens_q describes packed tokens, but the batch has {batch} rows")
        cu = cu_seq_lens_q.to(device=device, dtype=torch.int32)
        max_len = int(max_length_q) if max_length_q is not None else int(cu.diff().max().item())
        return Segments(cu, max_len, None)
    if attention_mask is not None:
        if attention_mask.dim() != 2:
            raise ValueError(f"{NAME} takes a 2-D padding mask (batch, seq) or None, got shape "
                             f"{tuple(attention_mask.shape)}; a 4-D mask means another mask function is registered "
                             f"for {NAME!r}")
        if attention_mask.shape[-1] != seq:
            raise NotImplementedError(f"{NAME}: keys and queries of different lengths (a KV cache) are not supported")
        return _CACHE.get(attention_mask, segments_from_padding_mask)
    if position_ids is not None and batch == 1:
        if position_ids.dim() == 3:  # multimodal rope (sections, 1, seq): the first section holds text positions
            position_ids = position_ids[0]
        return _CACHE.get(position_ids, segments_from_position_ids)
    lengths = torch.full((batch,), seq, dtype=torch.int32, device=device)
    return Segments(F.pad(lengths.cumsum(0, dtype=torch.int32), (1, 0)), seq, None)


@lru_cache(maxsize=1)
def _kernel_parameters() -> frozenset[str] | None:
    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError:
        return None
    return frozenset(inspect.signature(varlen_attn).parameters)


def uses_kernel(query: torch.Tensor) -> bool:
    """Whether ``rlkit_varlen`` runs PyTorch's varlen flash kernel for this query (else per-sequence SDPA)."""
    head_dim = query.shape[-1]
    return (query.is_cuda and query.dtype in KERNEL_DTYPES and head_dim % 8 == 0 and head_dim <= 256
            and _kernel_parameters() is not None)


def _kernel(q, k, v, seg: Segments, scale, causal: bool):
    """[tokens, heads, dim] in and out, through torch.nn.attention.varlen.varlen_attn. Fewer K/V heads than query
    heads go to the flash kernel as they are: it maps each query head to its group itself, bit for bit what it
    computes from K/V heads repeated to the query heads, without the copies (tests/test_varlen_attention.py, GPU).
    torch 2.11's varlen_attn passes them through unchecked; from 2.12 it asks for ``enable_gqa``."""
    from torch.nn.attention.varlen import varlen_attn

    params = _kernel_parameters()
    kwargs = {"scale": scale}
    if "is_causal" in params:
        kwargs["is_causal"] = causal
    elif causal:
        kwargs["window_size"] = (-1, 0)  # a tuple: varlen_attn compares it with == (-1, 0)
    if q.shape[1] != k.shape[1] and "enable_gqa" in params:
        kwargs["enable_gqa"] = True
    return varlen_attn(q, k, v, seg.cu_seqlens, seg.cu_seqlens, seg.max_len, seg.max_len, **kwargs)


def _per_sequence_sdpa(q, k, v, seg: Segments, scale, causal: bool):
    """The same contract with one ``scaled_dot_product_attention`` call per sequence."""
    bounds = seg.cu_seqlens.tolist()
    gqa = q.shape[1] != k.shape[1]
    outs = []
    for start, end in itertools.pairwise(bounds):
        if end == start:
            continue
        qs, ks, vs = (t[start:end].transpose(0, 1).unsqueeze(0) for t in (q, k, v))  # [1, heads, len, dim]
        out = F.scaled_dot_product_attention(qs, ks, vs, is_causal=causal, scale=scale, enable_gqa=gqa)
        outs.append(out.squeeze(0).transpose(0, 1))
    return torch.cat(outs) if outs else q.new_empty(q.shape)


def _refuse_unsupported(module, dropout: float, sliding_window, kwargs) -> None:
    if dropout:
        raise NotImplementedError(f"{NAME}: attention dropout {dropout} is not supported (set attention_dropout=0)")
    if sliding_window is not None:
        raise NotImplementedError(f"{NAME}: sliding-window layers are not supported ({type(module).__name__} has "
                                  f"sliding_window={sliding_window}); use attn_implementation=sdpa for this model")
    for key in ("s_aux", "softcap"):
        if kwargs.get(key) is not None:
            raise NotImplementedError(f"{NAME}: {key} is not supported; use attn_implementation=sdpa for this model")
    ulysses = sys.modules.get("verl.utils.ulysses")
    if ulysses is not None and ulysses.get_ulysses_sequence_parallel_world_size() > 1:
        raise PatchError(f"{NAME} has no Ulysses all-to-all. Fix: set ulysses_sequence_parallel_size=1 or "
                         f"attn_implementation=flash_attention_2 (needs flash-attn).")


def varlen_attention_forward(module, query, key, value, attention_mask, dropout: float = 0.0, scaling=None,
                             sliding_window=None, is_causal=None, position_ids=None, cu_seq_lens_q=None,
                             max_length_q=None, **kwargs):
    """transformers' attention-function contract: ``query`` [batch, heads, seq, dim], ``key``/``value``
    [batch, kv_heads, seq, dim]; returns ``([batch, seq, heads, dim], None)``."""
    _refuse_unsupported(module, dropout, sliding_window, kwargs)
    causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    batch, heads, seq, dim = query.shape
    if key.shape[2] != seq:
        raise NotImplementedError(f"{NAME}: keys and queries of different lengths (a KV cache) are not supported")
    seg = find_segments(batch, seq, query.device, attention_mask, position_ids, cu_seq_lens_q, max_length_q)
    q, k, v = (t.transpose(1, 2).reshape(batch * seq, t.shape[1], dim) for t in (query, key, value))
    if seg.index is not None:
        q, k, v = (t.index_select(0, seg.index) for t in (q, k, v))
    kernel = uses_kernel(query)
    CALLS["kernel" if kernel else "per_sequence_sdpa"] += 1
    out = (_kernel if kernel else _per_sequence_sdpa)(q, k, v, seg, scaling, causal)
    if seg.index is not None:
        out = out.new_zeros(batch * seq, heads, dim).index_copy(0, seg.index, out)
    return out.view(batch, seq, heads, dim), None


def _apply():
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, flash_attention_mask

    previous = {registry: registry._global_mapping.get(NAME) for registry in (AttentionInterface, AttentionMaskInterface)}
    AttentionInterface.register(NAME, varlen_attention_forward)
    AttentionMaskInterface.register(NAME, flash_attention_mask)

    def undo():
        for registry, value in previous.items():
            if value is None:
                registry._global_mapping.pop(NAME, None)
            else:
                registry._global_mapping[NAME] = value

    return undo


PATCH = Patch(
    name="varlen_attention",
    summary=f"transformers: attention implementation {NAME!r} (torch varlen flash kernel, per-sequence SDPA on CPU) "
            f"for verl's remove-padding path without flash-attn",
    requires=supported("torch", "transformers"),
    apply_fn=_apply,
    # Where AttentionInterface and AttentionMaskInterface live: imported before any model is built.
    targets=("transformers.modeling_utils", "transformers.masking_utils"),
)
