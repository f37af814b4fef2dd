"""The test-case builder itself: tables must give every sequence blocks of its own."""

from __future__ import annotations

import pytest
import torch

from attn_core.reference import make_paged_case


@pytest.mark.parametrize("non_contiguous", [False, True])
@pytest.mark.parametrize("seed", range(5))
def test_blocks_in_use_are_distinct_across_sequences(non_contiguous, seed):
    lens = [1, 15, 17, 1000, 4099]
    case = make_paged_case(lens, 2, 2, 64, 16, non_contiguous_tables=non_contiguous, seed=seed)
    if non_contiguous:
        assert case.block_tables.stride(0) > case.block_tables.shape[1]
    used = torch.cat([case.block_tables[s, : -(-n // 16)] for s, n in enumerate(lens)])
    assert used.unique().numel() == used.numel()
    assert int(used.min()) >= 0 and int(used.max()) < case.key_cache.shape[0]
