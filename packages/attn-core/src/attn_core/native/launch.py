"""One native decode step from torch tensors: the ctypes arguments and the launch.

The caller (attn-core's decode executor) has validated shapes, dtypes and devices and chosen
the partitioning; this module only translates tensors into :class:`~attn_core.native.abi.
DecodeArgs` and launches on the current CUDA stream (so a CUDA-graph capture records it).
"""

from __future__ import annotations

from typing import Optional

import torch

from attn_core.native import abi
from attn_core.native.library import NativeLibrary


def launch_decode(
    lib: NativeLibrary,
    *,
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    out: torch.Tensor,
    scale: float,
    v_scale: float,
    kv_cache_dtype: str,
    num_partitions: int,
    partition_size: int,
    alibi_slopes: Optional[torch.Tensor] = None,
    part_out: Optional[torch.Tensor] = None,
    part_lse: Optional[torch.Tensor] = None,
    stream: Optional[int] = None,
) -> None:
    """Write ``out`` with the native kernel.

    Args:
        query, out: ``[num_seqs, num_heads, head_size]``, last dim contiguous.
        key_cache: ``[num_blocks, num_kv_heads, head_size // x, block_size, x]``, contiguous
            below the head axis (vLLM's layout).
        value_cache: ``[num_blocks, num_kv_heads, head_size, block_size]``, likewise.
        block_tables: ``[num_seqs, width]`` int32, last dim contiguous; seq_lens ``[num_seqs]``
            int32 contiguous.
        scale: the softmax scale times ``k_scale`` for fp8 keys.
        v_scale: ``v_scale`` for fp8 values, else 1.
        num_partitions / partition_size: the plan's split (partition_size a multiple of the
            block size, ``num_partitions * partition_size`` covering every sequence).
        part_out / part_lse: fp32 buffers of :func:`attn_core.native.split.partials_shapes`,
            needed when ``num_partitions > 1``.
        stream: the ``cudaStream_t`` to launch on; None: the query device's current stream.
            (0 on host tensors for a host-emulated library: ci/host_emulation.py.)
    """
    prepared = PreparedDecode(
        lib, query, key_cache, value_cache, block_tables, out, scale=scale, v_scale=v_scale,
        kv_cache_dtype=kv_cache_dtype, num_partitions=num_partitions,
        partition_size=partition_size,
    )  # fmt: skip
    prepared.launch(
        query, key_cache, value_cache, block_tables, seq_lens, out, alibi_slopes,
        part_out.data_ptr() if part_out is not None else None,
        part_lse.data_ptr() if part_lse is not None else None, stream,
    )  # fmt: skip


class PreparedDecode:
    """The launch arguments that depend only on tensor sizes and strides, made once.

    A steady-state call (the same shapes, strides and dtypes as an earlier one; only the data
    moved) launches from this template: a copy of it with the call's pointers filled in, so two
    threads sharing a template never see each other's pointers. Building the 30-field argument
    block from the tensors each call cost ~16 us of the ~70 us of host work per call (CPU
    stand-in, 2026-12-02); copying the template and setting 9 pointers costs ~5 there.
    """

    def __init__(
        self,
        lib: NativeLibrary,
        query: torch.Tensor,
        key_cache: torch.Tensor,
        value_cache: torch.Tensor,
        block_tables: torch.Tensor,
        out: torch.Tensor,
        *,
        scale: float,
        v_scale: float,
        kv_cache_dtype: str,
        num_partitions: int,
        partition_size: int,
    ) -> None:
        num_seqs, num_heads, head_size = query.shape
        _, num_kv_heads, _, block_size, _ = key_cache.shape
        self.lib = lib
        self.device_index = query.device.index
        self.template = abi.DecodeArgs(
            out_seq_stride=out.stride(0),
            out_head_stride=out.stride(1),
            q_seq_stride=query.stride(0),
            q_head_stride=query.stride(1),
            k_block_stride=key_cache.stride(0),
            k_head_stride=key_cache.stride(1),
            v_block_stride=value_cache.stride(0),
            v_head_stride=value_cache.stride(1),
            table_stride=block_tables.stride(0),
            num_seqs=num_seqs,
            num_heads=num_heads,
            num_kv_heads=num_kv_heads,
            head_size=head_size,
            block_size=block_size,
            table_width=block_tables.shape[1],
            num_partitions=num_partitions,
            partition_size=partition_size,
            query_kind=abi.QUERY_KINDS[query.dtype],
            cache_kind=abi.cache_kind(query.dtype, kv_cache_dtype),
            scale=scale,
            v_scale=v_scale,
        )

    def launch(
        self,
        query: torch.Tensor,
        key_cache: torch.Tensor,
        value_cache: torch.Tensor,
        block_tables: torch.Tensor,
        seq_lens: torch.Tensor,
        out: torch.Tensor,
        alibi_slopes: Optional[torch.Tensor],
        part_out: Optional[int],
        part_lse: Optional[int],
        stream: Optional[int] = None,
    ) -> None:
        """Launch on ``stream`` (None: the current stream of the query's device); ``part_out``
        / ``part_lse`` are the partial buffers' addresses (None with one partition). The
        tensors must have the sizes and strides the template was made from (the caller's
        steady-state key says so)."""
        k_ptr, v_ptr = key_cache.data_ptr(), value_cache.data_ptr()
        if (k_ptr | v_ptr) % VECTOR_BYTES:
            raise ValueError(
                f"key_cache and value_cache must start at {VECTOR_BYTES}-byte aligned addresses "
                f"(the kernel reads {VECTOR_BYTES}-byte vectors), got {k_ptr:#x} and {v_ptr:#x}"
            )
        args = abi.DecodeArgs.from_buffer_copy(self.template)
        args.out = out.data_ptr()
        args.query = query.data_ptr()
        args.key_cache = k_ptr
        args.value_cache = v_ptr
        args.block_tables = block_tables.data_ptr()
        args.seq_lens = seq_lens.data_ptr()
        args.alibi_slopes = alibi_slopes.data_ptr() if alibi_slopes is not None else None
        args.part_out = part_out
        args.part_lse = part_lse
        self.lib.decode(args, current_stream(query.device) if stream is None else stream)


VECTOR_BYTES = 16  # the kernel's cache loads (csrc/paged_decode.cu: 16-byte key/value vectors)


def current_stream(device: torch.device) -> int:
    """The current CUDA stream of ``device`` as a ``cudaStream_t`` int (what a graph capture
    records). torch's raw-stream accessor: 0.13 us per call on the H200 host against 3.5 us
    for ``torch.cuda.current_stream(device).cuda_stream`` (2026-12-02); where a torch lacks
    it, the public API."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    if _RAW_STREAM is not None:
        return int(_RAW_STREAM(index))
    return torch.cuda.current_stream(device).cuda_stream


_RAW_STREAM = getattr(torch._C, "_cuda_getCurrentRawStream", None)


def layout_supported(
    query: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor, out: torch.Tensor
) -> Optional[str]:
    """None if the kernel can read these tensors' strides as they are, else why not."""
    if query.stride(-1) != 1 or out.stride(-1) != 1:
        return "query and out need a contiguous last dimension"
    if not key_cache[0, 0].is_contiguous() or not value_cache[0, 0].is_contiguous():
        return "each cache block must be contiguous below the head axis (vLLM's layout)"
    return None
