"""Decode's host-side bounds: the sizes the caller passes, checked against each other for free.

:func:`paged_decode` sizes its step from ``max_seq_len`` (a host int) and reads block ids from
``block_tables`` on the device. Everything here uses shapes and host ints only, so it runs on
every call, inside CUDA-graph capture too:

- ``1 <= max_seq_len <= block_tables.shape[1] * block_size`` (the table's capacity). vLLM 0.6.3
  sizes its tables so this holds: eager tables are padded to the batch's longest sequence, and
  the CUDA-graph tables are ``ceil(max_seq_len_to_capture / block_size)`` wide
  (``ModelRunner.get_max_block_per_batch``) while capture passes ``max_seq_len_to_capture``.
  With it, the documented ``seq_lens <= max_seq_len`` implies every sequence fits its row; a
  table of width 0 fails it too;
- a non-empty batch needs a cache of at least one block.

What only ``ATTN_CORE_CHECKS=1`` catches (it reads ``seq_lens`` and ``block_tables``, a sync,
and is skipped during graph capture), and what happens without it:

- ``seq_lens[i] > block_tables.shape[1] * block_size``: never a silent wrong answer. Columns of
  the step beyond the table's width get block id -1 unless masked
  (:func:`attn_core.decode_gather.block_ids`), so the gather fails: ``IndexError`` on the CPU,
  a device-side assert on CUDA;
- ``max_seq_len < seq_lens[i] <= capacity``: the blocks read are the sequence's own. The result
  is exact while the step still covers the sequence; beyond it, ``IndexError`` on the CPU / a
  device-side assert on CUDA (non-streaming), or attention over the first
  ``num_chunks * chunk_tokens`` tokens only (streaming);
- ``seq_lens[i] < 1``: a finite output computed from the sequence's first block (vLLM's kernel
  is undefined there too);
- block ids outside ``[0, num_blocks)`` in the columns a sequence uses: ``IndexError`` on the
  CPU, a device-side assert on CUDA. Ids of blocks another sequence owns are not errors (prefix
  caching shares blocks).
"""

from __future__ import annotations

import torch

from attn_core.cache_layout import CacheLayout


def check_decode_bounds(
    layout: CacheLayout, block_tables: torch.Tensor, num_seqs: int, max_seq_len: int
) -> None:
    """Raise ``ValueError`` when the host-side sizes cannot describe a valid decode step.

    ``block_tables`` and ``max_seq_len`` must already have passed their own type checks.
    """
    width = block_tables.shape[1]
    capacity = width * layout.block_size
    if num_seqs and width == 0:
        raise ValueError(
            f"block_tables must have at least one column for {num_seqs} sequences, "
            f"got shape {tuple(block_tables.shape)}"
        )
    if max_seq_len > capacity:
        raise ValueError(
            f"max_seq_len must be <= the capacity of block_tables "
            f"(shape[1] * block_size = {width} * {layout.block_size} = {capacity}), "
            f"got {max_seq_len}"
        )
    if num_seqs and layout.num_blocks == 0:
        raise ValueError(
            f"key_cache must hold at least one block for {num_seqs} sequences, "
            "got num_blocks = key_cache.shape[0] = 0"
        )
