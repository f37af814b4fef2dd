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
and is skipped during graph capture), and what each bad value does without it. "The torch
error" is ``IndexError`` or ``RuntimeError`` from an index op on the CPU and a device-side
assert on CUDA; ``tests/test_bad_input_decode.py`` holds the code to this list:

- ``seq_lens[i] > block_tables.shape[1] * block_size``: the torch error, never numbers. Step
  columns beyond the table's width get block id -1 unless masked
  (:func:`attn_core.decode.gather.block_ids`), so the gather fails instead of reading a block
  the sequence does not own (reading them gave relative errors of 0.14-0.36);
- ``max_seq_len < seq_lens[i] <= capacity``: only the sequence's own blocks are read. The result
  is exact while the step's columns (``>= max_seq_len + block_size - 1``) cover the sequence,
  else the torch error; streaming too (the last chunk's tail zeroing is not clamped,
  ``decode._zero_value_tails``), so no tokens are dropped silently;
- ``seq_lens[i] < 1``: a finite output of no meaning (vLLM's kernel is undefined there too);
  lengths below minus the step's width: the torch error;
- block ids outside ``[0, num_blocks)`` in the columns a sequence uses: the torch error. Ids of
  blocks another sequence owns are not errors (prefix caching shares blocks).
"""

from __future__ import annotations

import torch

from attn_core.core.cache_layout import CacheLayout


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


def max_seq_len_bucket(max_seq_len: int, capacity: int) -> int:
    """``max_seq_len`` rounded up so one plan serves a run of growing lengths.

    vLLM passes the batch's longest length, which grows by one every step; plans are made for
    the bucket (at most 1/16 or 256 tokens more, capped by the table's capacity). The extra
    slots are masked, so results are exact either way.
    """
    step = max(256, 1 << max(0, max_seq_len.bit_length() - 5))
    return min(capacity, -(-max_seq_len // step) * step)
