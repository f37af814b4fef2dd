"""The native chunked prefill from torch tensors: argument checks, tile and split choice, launch.

Semantics are :func:`attn_core.paged_prefix_prefill`'s (bottom-right causal within the chunk,
sliding window, ALiBi ``slope * (key_pos - query_pos)``, fp8 caches whose scales act on the
cached context only). Phase 2 of issue 16 routes ``plan_prefill`` here; until then this is
the direct launcher the tests and the benchmark call.

Host syncs: none when ``max_context_len`` is given (the split needs it); one (a read of
``context_lens.max()``) otherwise. Launches go to the current CUDA stream.
"""

from __future__ import annotations

import math
from typing import Optional

import torch

from attn_core.native import prefill_abi as pabi
from attn_core.native import prefill_split as ps
from attn_core.native.prefill_library import PrefillLibrary

QUERY_KINDS = {torch.float16: 1, torch.bfloat16: 2}
CACHE_KINDS = {"fp8": 3, "fp8_e4m3": 3, "fp8_e5m2": 4}
BLOCK_SIZES = (8, 16, 32)


def _check(cond: bool, message: str) -> None:
    if not cond:
        raise ValueError(message)


def check_inputs(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_tables: torch.Tensor,
    query_start_loc: torch.Tensor,
    context_lens: torch.Tensor,
    kv_cache_dtype: str,
) -> None:
    """Shapes, dtypes and layouts the kernel reads; ``ValueError`` / ``TypeError`` naming the
    argument, the expectation and what came."""
    if query.dtype not in QUERY_KINDS:
        raise TypeError(
            f"query must be float16 or bfloat16 for the native prefill (float32 queries take "
            f"the torch path), got {query.dtype}"
        )
    _check(
        query.dim() == 3,
        f"query must be [num_tokens, num_heads, head_size], got {tuple(query.shape)}",
    )
    num_tokens, heads, head_size = query.shape
    _check(key_cache.dim() == 5, f"key_cache must be 5-D (vLLM's layout), got {key_cache.dim()}-D")
    _, kv_heads, _, block_size, x = key_cache.shape
    for name, t in (("key", key), ("value", value)):
        _check(
            tuple(t.shape) == (num_tokens, kv_heads, head_size),
            f"{name} must be {(num_tokens, kv_heads, head_size)}, got {tuple(t.shape)}",
        )
        if t.dtype != query.dtype:
            raise TypeError(f"{name} must be {query.dtype}, got {t.dtype}")
        _check(t.stride(-1) == 1, f"{name} needs a contiguous last dimension, got {t.stride()}")
    _check(query.stride(-1) == 1, f"query needs a contiguous last dimension, got {query.stride()}")
    _check(
        heads % kv_heads == 0,
        f"num_heads must be a multiple of num_kv_heads {kv_heads}, got {heads}",
    )
    _check(
        head_size % 8 == 0 and 8 <= head_size <= 256,
        f"head_size must be a multiple of 8 in 8..256, got {head_size}",
    )
    _check(block_size in BLOCK_SIZES, f"block_size must be one of {BLOCK_SIZES}, got {block_size}")
    want = query.dtype if kv_cache_dtype == "auto" else torch.uint8
    if kv_cache_dtype != "auto" and kv_cache_dtype not in CACHE_KINDS:
        raise ValueError(
            f"kv_cache_dtype must be 'auto' or one of {sorted(CACHE_KINDS)}, got {kv_cache_dtype!r}"
        )
    for name, cache in (("key_cache", key_cache), ("value_cache", value_cache)):
        if cache.dtype != want:
            raise TypeError(
                f"{name} must be {want} for kv_cache_dtype={kv_cache_dtype!r}, got {cache.dtype}"
            )
        _check(cache[0, 0].is_contiguous(), f"{name} must be contiguous below the head axis")
    elem = torch.empty((), dtype=want).element_size()
    _check(
        tuple(key_cache.shape[2:]) == (head_size // (16 // elem), block_size, 16 // elem),
        f"key_cache must be [blocks, {kv_heads}, {head_size // (16 // elem)}, {block_size}, "
        f"{16 // elem}], got {tuple(key_cache.shape)}",
    )
    _check(
        tuple(value_cache.shape[1:]) == (kv_heads, head_size, block_size),
        f"value_cache must be [blocks, {kv_heads}, {head_size}, {block_size}], "
        f"got {tuple(value_cache.shape)}",
    )
    _check(
        x * (head_size // x) == head_size, f"head_size must be a multiple of x={x}, got {head_size}"
    )
    num_seqs = context_lens.shape[0] if context_lens.dim() == 1 else -1
    _check(num_seqs >= 1, f"context_lens must be [num_seqs], got {tuple(context_lens.shape)}")
    _check(
        tuple(query_start_loc.shape) == (num_seqs + 1,),
        f"query_start_loc must be [{num_seqs + 1}], got {tuple(query_start_loc.shape)}",
    )
    _check(
        block_tables.dim() == 2 and block_tables.shape[0] == num_seqs,
        f"block_tables must be [{num_seqs}, max_blocks], got {tuple(block_tables.shape)}",
    )
    if block_tables.dtype != torch.int32:
        raise TypeError(f"block_tables must be int32, got {block_tables.dtype}")
    _check(block_tables.stride(-1) == 1, "block_tables needs a contiguous last dimension")


def choose_launch(
    lib: PrefillLibrary,
    device: torch.device,
    *,
    query_dtype: torch.dtype,
    kv_cache_dtype: str,
    num_seqs: int,
    num_tokens: int,
    num_heads: int,
    num_kv_heads: int,
    head_size: int,
    max_query_len: int,
    max_context_len: int,
    config: Optional[int] = None,
    num_splits: Optional[int] = None,
) -> ps.PrefillLaunch:
    """Tile configuration and splits for this device: the large tile where the device lets a
    block opt in to its shared memory, and :func:`prefill_split` from the SM count and the
    kernel's occupancy as the driver reports it. The device is asked only for what the caller
    did not force (both forced: no CUDA call, as a host-emulated library needs)."""
    qk = QUERY_KINDS[query_dtype]
    ck = qk if kv_cache_dtype == "auto" else CACHE_KINDS[kv_cache_dtype]
    bucket = ps.head_bucket(head_size)
    if config is None or num_splits is None:
        props = torch.cuda.get_device_properties(device)
    if config is None:
        large = lib.config_facts(pabi.CONFIG_LARGE, qk, ck, bucket)
        optin = getattr(props, "shared_memory_per_block_optin", 48 << 10)
        config = ps.choose_config(optin, large.smem_bytes) if large is not None else pabi.CONFIG_32K
    facts = lib.config_facts(config, qk, ck, bucket)
    if facts is None:
        raise ValueError(
            f"the {lib.mma} prefill library has no kernel for config {config}, {query_dtype}, "
            f"kv_cache_dtype={kv_cache_dtype!r}, head bucket {bucket}"
        )
    group = num_heads // num_kv_heads
    tiles_q = ps.query_tiles(config, group, max_query_len)
    if num_splits is None:
        per_split = ps.workspace_bytes(2, num_tokens, num_heads, head_size) // 2
        num_splits = ps.prefill_split(
            props.multi_processor_count,
            max(1, facts.blocks_per_sm),
            tiles_q * num_seqs * num_kv_heads,
            ps.key_tiles(config, max_context_len, max_query_len),
            workspace_per_split=per_split,
        )
    _check(num_splits >= 1, f"num_splits must be >= 1, got {num_splits}")
    return ps.PrefillLaunch(
        config=config,
        tokens_per_tile=ps.tokens_per_tile(config, group),
        query_tiles=tiles_q,
        num_splits=num_splits,
        workspace_bytes=ps.workspace_bytes(num_splits, num_tokens, num_heads, head_size),
    )


def native_prefix_prefill(
    lib: PrefillLibrary,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_tables: torch.Tensor,
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    context_lens: torch.Tensor,
    max_query_len: int,
    scale: Optional[float] = None,
    *,
    max_context_len: Optional[int] = None,
    alibi_slopes: Optional[torch.Tensor] = None,
    sliding_window: Optional[int] = None,
    kv_cache_dtype: str = "auto",
    k_scale: float = 1.0,
    v_scale: float = 1.0,
    out: Optional[torch.Tensor] = None,
    config: Optional[int] = None,
    num_splits: Optional[int] = None,
    part_out: Optional[torch.Tensor] = None,
    part_lse: Optional[torch.Tensor] = None,
    stream: Optional[int] = None,
) -> torch.Tensor:
    """Attention of a packed chunk over each sequence's paged context and itself.

    Args:
        query: ``[num_tokens, num_heads, head_size]`` fp16/bf16; key/value
            ``[num_tokens, num_kv_heads, head_size]`` (the chunk's own K/V).
        key_cache / value_cache: vLLM 0.6.3's layouts (fp8 caches as uint8).
        block_tables: ``[num_seqs, max_blocks]`` int32; query_start_loc ``[num_seqs + 1]`` and
            context_lens ``[num_seqs]`` (int32, or int64 converted here).
        seq_lens: ``[num_seqs]``, ``context_lens + query lengths``: the positional order of
            :func:`attn_core.paged_prefix_prefill`; only its shape is checked here (that
            function validates the values; the kernel derives lengths from the other two).
        max_query_len: the longest query length (sizes the grid).
        max_context_len: the longest context (sizes the split); None reads it (one sync).
        config / num_splits: force a tile configuration / a split count (tests, sweeps).
        part_out / part_lse: fp32 ``partials_shapes`` buffers for a split call (else
            allocated here, at most ``WORKSPACE_CAP_BYTES`` unless splits are forced).
        stream: the ``cudaStream_t`` to launch on; None: the query device's current stream.
            (0 on host tensors for a host-emulated library: ci/host_emulation.py.)

    Returns:
        ``out``: ``[num_tokens, num_heads, head_size]`` in query's dtype.
    """
    check_inputs(
        query, key, value, key_cache, value_cache, block_tables, query_start_loc, context_lens,
        kv_cache_dtype,
    )  # fmt: skip
    num_tokens, num_heads, head_size = query.shape
    num_kv_heads, block_size = key_cache.shape[1], key_cache.shape[3]
    num_seqs = context_lens.shape[0]
    _check(
        tuple(seq_lens.shape) == (num_seqs,),
        f"seq_lens must be [{num_seqs}], got {tuple(seq_lens.shape)}",
    )
    _check(max_query_len >= 1, f"max_query_len must be >= 1, got {max_query_len}")
    group = num_heads // num_kv_heads
    window = 0 if sliding_window is None or sliding_window <= 0 else int(sliding_window)
    if alibi_slopes is not None:
        _check(
            alibi_slopes.dtype == torch.float32 and tuple(alibi_slopes.shape) == (num_heads,),
            f"alibi_slopes must be float32 [{num_heads}], "
            f"got {alibi_slopes.dtype} {tuple(alibi_slopes.shape)}",
        )
        alibi_slopes = alibi_slopes.contiguous()
    for name, v in (("k_scale", k_scale), ("v_scale", v_scale)):
        _check(math.isfinite(v) and v > 0, f"{name} must be positive and finite, got {v}")
    query_start_loc = query_start_loc.to(torch.int32).contiguous()
    context_lens = context_lens.to(torch.int32).contiguous()
    if max_context_len is None:
        max_context_len = int(context_lens.max())
    if out is None:
        out = torch.empty_like(query)
    _check(
        out.shape == query.shape and out.dtype == query.dtype and out.stride(-1) == 1,
        f"out must be {query.dtype} {tuple(query.shape)} with a contiguous last dimension",
    )
    launch = choose_launch(
        lib, query.device, query_dtype=query.dtype, kv_cache_dtype=kv_cache_dtype,
        num_seqs=num_seqs, num_tokens=num_tokens, num_heads=num_heads, num_kv_heads=num_kv_heads,
        head_size=head_size, max_query_len=max_query_len, max_context_len=max_context_len,
        config=config, num_splits=num_splits,
    )  # fmt: skip
    _check(
        group <= ps.CONFIG_TILES[launch.config][0],
        f"num_heads // num_kv_heads must be <= {ps.CONFIG_TILES[launch.config][0]}, got {group}",
    )
    if launch.num_splits > 1:
        o_shape, l_shape = ps.partials_shapes(launch.num_splits, num_tokens, num_heads, head_size)
        if part_out is None:
            part_out = torch.empty(o_shape, dtype=torch.float32, device=query.device)
        if part_lse is None:
            part_lse = torch.empty(l_shape, dtype=torch.float32, device=query.device)
        _check(
            tuple(part_out.shape) == o_shape,
            f"part_out must be {o_shape}, got {tuple(part_out.shape)}",
        )
        _check(
            tuple(part_lse.shape) == l_shape,
            f"part_lse must be {l_shape}, got {tuple(part_lse.shape)}",
        )
    fp8 = kv_cache_dtype != "auto"
    args = pabi.PrefillArgs(
        out=out.data_ptr(),
        query=query.data_ptr(),
        key=key.data_ptr(),
        value=value.data_ptr(),
        key_cache=key_cache.data_ptr(),
        value_cache=value_cache.data_ptr(),
        block_tables=block_tables.data_ptr(),
        query_start_loc=query_start_loc.data_ptr(),
        context_lens=context_lens.data_ptr(),
        alibi_slopes=alibi_slopes.data_ptr() if alibi_slopes is not None else None,
        part_out=part_out.data_ptr() if launch.num_splits > 1 and part_out is not None else None,
        part_lse=part_lse.data_ptr() if launch.num_splits > 1 and part_lse is not None else None,
        out_tok_stride=out.stride(0),
        out_head_stride=out.stride(1),
        q_tok_stride=query.stride(0),
        q_head_stride=query.stride(1),
        k_tok_stride=key.stride(0),
        k_head_stride=key.stride(1),
        v_tok_stride=value.stride(0),
        v_head_stride=value.stride(1),
        kc_block_stride=key_cache.stride(0),
        kc_head_stride=key_cache.stride(1),
        vc_block_stride=value_cache.stride(0),
        vc_head_stride=value_cache.stride(1),
        table_stride=block_tables.stride(0),
        num_seqs=num_seqs,
        num_tokens=num_tokens,
        num_heads=num_heads,
        num_kv_heads=num_kv_heads,
        head_size=head_size,
        block_size=block_size,
        table_width=block_tables.shape[1],
        max_query_len=max_query_len,
        num_splits=launch.num_splits,
        sliding_window=window,
        query_kind=QUERY_KINDS[query.dtype],
        cache_kind=QUERY_KINDS[query.dtype] if not fp8 else CACHE_KINDS[kv_cache_dtype],
        config=launch.config,
        scale=head_size**-0.5 if scale is None else float(scale),
        k_scale=float(k_scale) if fp8 else 1.0,
        v_scale=float(v_scale) if fp8 else 1.0,
    )
    if stream is None:
        stream = torch.cuda.current_stream(query.device).cuda_stream
    lib.launch(args, stream)
    return out
