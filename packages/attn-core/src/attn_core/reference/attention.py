"""Independent float64 reference for paged attention.

Dense attention over tokens read one position at a time from the paged cache by plain index
arithmetic; no tiling, no partitions, no log-sum-exp tricks beyond ``torch.softmax`` in float64.
It shares no code with attn-core's execution path (only the fp8 bit reinterpretation, which is
a dtype fact, not an algorithm).
"""

from __future__ import annotations

import math
from typing import Optional

import torch


def _dequant(stored: torch.Tensor, kv_cache_dtype: str, scale: float) -> torch.Tensor:
    if kv_cache_dtype == "auto":
        return stored.double()
    name = "float8_e5m2" if kv_cache_dtype == "fp8_e5m2" else "float8_e4m3fn"
    f8 = getattr(torch, name)
    vals = stored.view(f8) if stored.dtype == torch.uint8 else stored
    return vals.double() * scale


def tokens_from_cache(
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_table_row: torch.Tensor,
    num_tokens: int,
    kv_cache_dtype: str = "auto",
    k_scale: float = 1.0,
    v_scale: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The first ``num_tokens`` keys and values of one sequence, float64 on the CPU.

    Returns:
        ``(keys, values)``, each ``[num_tokens, num_kv_heads, head_size]``.
    """
    block_size = value_cache.shape[-1]
    pos = torch.arange(num_tokens)
    blocks = block_table_row.cpu().long()[pos // block_size]
    offsets = pos % block_size
    kc = key_cache.cpu()
    vc = value_cache.cpu()
    # key_cache[b, h, d_hi, off, d_lo] -> [tokens, h, d_hi, d_lo] -> [tokens, h, head_size]
    keys = kc[blocks, :, :, offsets, :]
    keys = keys.reshape(num_tokens, kc.shape[1], kc.shape[2] * kc.shape[4])  # -1 fails at 0 tokens
    # value_cache[b, h, d, off] -> [tokens, h, head_size]
    values = vc[blocks, :, :, offsets]
    return _dequant(keys, kv_cache_dtype, k_scale), _dequant(values, kv_cache_dtype, v_scale)


def alibi_bias(
    slopes: torch.Tensor, query_pos: torch.Tensor, key_pos: torch.Tensor
) -> torch.Tensor:
    """ALiBi bias ``slope[h] * (key_pos - query_pos)``: ``[heads, queries, keys]`` float64.

    This is the bias of vLLM's paged-attention kernels (decode: query at position len-1) and of
    its xformers prefill path (relative position, not clipped).
    """
    rel = key_pos.double()[None, :] - query_pos.double()[:, None]
    return slopes.double().cpu()[:, None, None] * rel[None]


def _attend(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    scale: float,
    mask: Optional[torch.Tensor],
    bias: Optional[torch.Tensor],
) -> torch.Tensor:
    """q ``[nq, heads, d]``, k/v ``[nk, kv_heads, d]`` float64 -> ``[nq, heads, d]``.

    Rows whose mask admits no key come out as zeros.
    """
    heads, kv_heads = q.shape[1], k.shape[1]
    group = heads // kv_heads
    k = k.repeat_interleave(group, dim=1)  # fine in a reference: clarity over speed
    v = v.repeat_interleave(group, dim=1)
    scores = torch.einsum("qhd,khd->hqk", q, k) * scale
    if bias is not None:
        scores = scores + bias
    if mask is not None:
        scores = scores.masked_fill(~mask[None], -math.inf)
    probs = torch.softmax(scores, dim=-1)
    probs = torch.nan_to_num(probs, nan=0.0)
    return torch.einsum("hqk,khd->qhd", probs, v)


def reference_decode(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: Optional[float] = None,
    alibi_slopes: Optional[torch.Tensor] = None,
    kv_cache_dtype: str = "auto",
    k_scale: float = 1.0,
    v_scale: float = 1.0,
) -> torch.Tensor:
    """What ``paged_attention_v1`` computes, in float64 on the CPU: ``[num_seqs, heads, d]``."""
    num_seqs, _, head_size = query.shape
    scale = head_size**-0.5 if scale is None else scale
    out = torch.empty(query.shape, dtype=torch.float64)
    for s in range(num_seqs):
        n = int(seq_lens[s])
        k, v = tokens_from_cache(
            key_cache, value_cache, block_tables[s], n, kv_cache_dtype, k_scale, v_scale
        )
        bias = None
        if alibi_slopes is not None:
            bias = alibi_bias(alibi_slopes, torch.tensor([n - 1]), torch.arange(n))
        out[s] = _attend(query[s : s + 1].cpu().double(), k, v, scale, None, bias)[0]
    return out


def reference_prefix_prefill(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_tables: torch.Tensor,
    query_start_loc: torch.Tensor,
    context_lens: torch.Tensor,
    scale: Optional[float] = None,
    alibi_slopes: Optional[torch.Tensor] = None,
    sliding_window: Optional[int] = None,
    kv_cache_dtype: str = "auto",
    k_scale: float = 1.0,
    v_scale: float = 1.0,
    query_chunk: int = 1024,
) -> torch.Tensor:
    """What ``PagedAttention.forward_prefix`` computes, float64 on the CPU.

    Token ``i`` of sequence ``s`` (absolute position ``context_lens[s] + i``) attends to the
    sequence's cached context and to new tokens ``<= i`` (causal, bottom-right aligned); with a
    sliding window ``w > 0`` only to keys at positions ``> pos - w``. New tokens' keys/values are
    taken from ``key``/``value`` as given (not from the cache).

    Args:
        query: ``[num_tokens, heads, d]``; key/value: ``[num_tokens, kv_heads, d]``.
        query_start_loc: ``[batch + 1]``; context_lens: ``[batch]``.
        query_chunk: queries per float64 block, to bound the reference's own memory at 100K.
    Returns:
        ``[num_tokens, heads, d]`` float64.
    """
    head_size = query.shape[-1]
    scale = head_size**-0.5 if scale is None else scale
    out = torch.empty(query.shape, dtype=torch.float64)
    starts = query_start_loc.cpu().tolist()
    for s in range(len(starts) - 1):
        q0, q1 = starts[s], starts[s + 1]
        ctx = int(context_lens[s])
        ck, cv = tokens_from_cache(
            key_cache, value_cache, block_tables[s], ctx, kv_cache_dtype, k_scale, v_scale
        )
        k = torch.cat([ck, key[q0:q1].cpu().double()])
        v = torch.cat([cv, value[q0:q1].cpu().double()])
        key_pos = torch.arange(ctx + (q1 - q0))
        for c0 in range(q0, q1, query_chunk):
            c1 = min(c0 + query_chunk, q1)
            q_pos = ctx + torch.arange(c0 - q0, c1 - q0)
            mask = key_pos[None, :] <= q_pos[:, None]
            if sliding_window is not None and sliding_window > 0:
                mask &= key_pos[None, :] > q_pos[:, None] - sliding_window
            bias = alibi_bias(alibi_slopes, q_pos, key_pos) if alibi_slopes is not None else None
            out[c0:c1] = _attend(query[c0:c1].cpu().double(), k, v, scale, mask, bias)
    return out
