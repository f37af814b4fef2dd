"""Rows of a state pool named by slot indices, with vLLM's padding slots (negative, or past the
pool) read as nothing and written nowhere, without a host sync (CUDA-graph capturable).

vLLM pads a CUDA-graph batch with ``PAD_SLOT_ID = -1``: a padded sequence must neither read nor
write any row. ``index_select`` / ``index_copy_`` have no skip, so a padded entry reads row 0
and *rewrites* a row some other entry writes, with that entry's value: repeated writes of one
row then agree, whichever lands last. With no real entry, row 0 is rewritten with its own value.
"""

from __future__ import annotations

from typing import Optional

import torch


def gather_slots(pool: torch.Tensor, indices: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """``(rows, valid, safe)``: ``rows [N, ...]`` of ``pool [slots, ...]`` (row 0 for a padded
    entry), ``valid [N]`` bool (the index names a row), ``safe [N]`` int64 (0 where padded)."""
    valid = (indices >= 0) & (indices < pool.shape[0])
    safe = torch.where(valid, indices, 0).long()
    return pool.index_select(0, safe), valid, safe


def scatter_slots(
    pool: torch.Tensor, safe: torch.Tensor, valid: torch.Tensor, new: torch.Tensor
) -> None:
    """Write ``new [N, ...]`` at the valid entries' rows of ``pool``; a padded entry writes the
    first valid entry's row with that entry's value, or (no entry valid) row 0 with its own
    value: no copy of the gathered rows is kept for that (``pool[:1]`` is read in place)."""
    n = valid.shape[0]
    first = torch.argmax(valid.to(torch.int32))  # 0 when none is valid
    donor = torch.where(valid, torch.arange(n, device=valid.device), first)
    keep = valid.index_select(0, donor).view(n, *([1] * (new.dim() - 1)))
    value = torch.where(keep, new.index_select(0, donor).to(pool.dtype), pool[:1])
    pool.index_copy_(0, safe.index_select(0, donor), value)


def zero_padded(out: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """``out [N, ...]`` with a padded entry's rows zeroed in place (what the native kernels
    write); ``out`` is returned."""
    return out.mul_(valid.view(-1, *([1] * (out.dim() - 1))).to(out.dtype))


def check_pad_slot_id(pad_slot_id: object) -> Optional[int]:
    """``pad_slot_id`` itself: an int or None.

    Raises:
        ValueError: it is anything else (a bool included).
    """
    if pad_slot_id is None or (isinstance(pad_slot_id, int) and not isinstance(pad_slot_id, bool)):
        return pad_slot_id
    raise ValueError(f"pad_slot_id must be an int or None, got {pad_slot_id!r}")


def pad_as_negative(indices: torch.Tensor, pad_slot_id: Optional[int]) -> torch.Tensor:
    """``indices`` with the entries equal to ``pad_slot_id`` (checked) made -1, the padding
    every path here skips (vLLM's ``PAD_SLOT_ID`` is -1 already: then ``indices`` is returned
    as is). No host sync."""
    if pad_slot_id is None or pad_slot_id < 0:
        return indices
    return indices.masked_fill(indices == pad_slot_id, -1)


def zero_padded_tokens(out: torch.Tensor, slots: torch.Tensor, offsets: torch.Tensor) -> None:
    """Zero, in place, the tokens of ``out [dim, total]`` whose sequence (``offsets [N + 1]``)
    has a padding slot (``slots [N]`` negative). Masked, not multiplied: a padded sequence's
    inputs may be anything, NaN included. No host sync."""
    lengths = (offsets[1:] - offsets[:-1]).long()
    padded = torch.repeat_interleave(slots < 0, lengths, output_size=out.shape[1])
    out.masked_fill_(padded[None, :], 0)
