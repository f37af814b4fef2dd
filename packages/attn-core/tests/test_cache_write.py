"""write_to_paged_cache: slots land where vLLM's reshape_and_cache puts them, padding is skipped,
and the attention paths read back exactly what was written."""

from __future__ import annotations

import pytest
import torch
from conftest import assert_close
from prefill_helpers import reference, run_prefill

from attn_core import paged_decode, write_to_paged_cache
from attn_core.core.cache_layout import quantize
from attn_core.reference import (
    make_paged_case,
    make_prefill_case,
    reference_decode,
    tokens_from_cache,
)

DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def _slots(block_row: torch.Tensor, positions: range, block_size: int) -> torch.Tensor:
    pos = torch.tensor(list(positions))
    return block_row.long()[pos // block_size] * block_size + pos % block_size


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("kv_cache_dtype", ("auto", "fp8", "fp8_e5m2"))
@pytest.mark.parametrize("block_size", (8, 16, 32))
def test_written_tokens_read_back_exactly(kv_cache_dtype, dtype, block_size) -> None:
    case = make_paged_case(
        (45, 3),
        8,
        2,
        80,
        block_size,
        dtype,
        kv_cache_dtype=kv_cache_dtype,
        k_scale=0.5,
        v_scale=2.0,
        seed=block_size,
    )
    g = torch.Generator().manual_seed(1)
    key = torch.randn(20, 2, 80, generator=g).to(dtype)
    value = torch.randn(20, 2, 80, generator=g).to(dtype)
    slots = _slots(case.block_tables[0], range(25, 45), block_size)
    write_to_paged_cache(
        key, value, case.key_cache, case.value_cache, slots, kv_cache_dtype, 0.5, 2.0
    )
    k, v = tokens_from_cache(
        case.key_cache, case.value_cache, case.block_tables[0], 45, kv_cache_dtype, 0.5, 2.0
    )
    # What the cache should hold: the values, through the same quantisation vLLM applies.
    want_k = _roundtrip(key, kv_cache_dtype, 0.5)
    want_v = _roundtrip(value, kv_cache_dtype, 2.0)
    assert torch.equal(k[25:45], want_k)
    assert torch.equal(v[25:45], want_v)


def _roundtrip(x: torch.Tensor, kv_cache_dtype: str, scale: float) -> torch.Tensor:
    if kv_cache_dtype == "auto":
        return x.double()
    stored = quantize(x, kv_cache_dtype, scale, torch.uint8)
    f8 = torch.float8_e5m2 if kv_cache_dtype == "fp8_e5m2" else torch.float8_e4m3fn
    return stored.view(f8).double() * scale


def test_negative_slots_are_skipped_and_nothing_else_changes() -> None:
    case = make_paged_case((40,), 4, 2, 64, 16, torch.float16, seed=3)
    before_k, before_v = case.key_cache.clone(), case.value_cache.clone()
    key = torch.randn(6, 2, 64).half()
    value = torch.randn(6, 2, 64).half()
    slots = _slots(case.block_tables[0], range(10, 16), 16)
    slots[[0, 3, 5]] = -1
    write_to_paged_cache(key, value, case.key_cache, case.value_cache, slots)
    k, v = tokens_from_cache(case.key_cache, case.value_cache, case.block_tables[0], 40)
    for i, pos in enumerate(range(10, 16)):
        if slots[i] >= 0:
            assert torch.equal(k[pos], key[i].double()) and torch.equal(v[pos], value[i].double())
    # Every other byte of both caches is untouched (skipped slots included).
    written = slots[slots >= 0]
    mask = torch.ones(case.key_cache.shape[0] * 16, dtype=torch.bool)
    mask[written] = False
    flat_k = case.key_cache.permute(0, 3, 1, 2, 4).reshape(-1, 2 * 64)
    flat_before = before_k.permute(0, 3, 1, 2, 4).reshape(-1, 2 * 64)
    assert torch.equal(flat_k[mask], flat_before[mask])
    flat_v = case.value_cache.permute(0, 3, 1, 2).reshape(-1, 2 * 64)
    assert torch.equal(flat_v[mask], before_v.permute(0, 3, 1, 2).reshape(-1, 2 * 64)[mask])


def test_all_slots_negative_writes_nothing() -> None:
    case = make_paged_case((20,), 4, 2, 64, 16, torch.float32, seed=4)
    before_k, before_v = case.key_cache.clone(), case.value_cache.clone()
    write_to_paged_cache(
        torch.randn(3, 2, 64),
        torch.randn(3, 2, 64),
        case.key_cache,
        case.value_cache,
        torch.full((3,), -1),
    )
    assert torch.equal(case.key_cache, before_k) and torch.equal(case.value_cache, before_v)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("kv_cache_dtype", ("auto", "fp8"))
def test_prefill_then_decode_read_what_was_written(kv_cache_dtype, dtype) -> None:
    """vLLM's order: write the chunk's K/V, attend the chunk; the next step reads them cached."""
    ctx, new = 33, 19
    case = make_prefill_case(
        ((ctx, new),),
        8,
        2,
        64,
        16,
        dtype,
        kv_cache_dtype=kv_cache_dtype,
        k_scale=0.5,
        v_scale=0.5,
        seed=5,
    )
    slots = _slots(case.block_tables[0], range(ctx, ctx + new), 16)
    write_to_paged_cache(
        case.key, case.value, case.key_cache, case.value_cache, slots, kv_cache_dtype, 0.5, 0.5
    )
    # Next chunk: one token whose context is everything written so far.
    g = torch.Generator().manual_seed(9)
    nxt = type(case)(**{**case.__dict__})
    nxt.query = torch.randn(1, 8, 64, generator=g).to(dtype)
    nxt.key = torch.randn(1, 2, 64, generator=g).to(dtype)
    nxt.value = torch.randn(1, 2, 64, generator=g).to(dtype)
    nxt.query_start_loc = torch.tensor([0, 1], dtype=torch.int32)
    nxt.context_lens = torch.tensor([ctx + new], dtype=torch.int32)
    nxt.seq_lens = torch.tensor([ctx + new + 1], dtype=torch.int32)
    nxt.max_query_len = 1
    assert_close(run_prefill(nxt), reference(nxt), dtype)
    # Decode over the written sequence reads the same cache.
    q = torch.randn(1, 8, 64, generator=g).to(dtype)
    seq_lens = torch.tensor([ctx + new], dtype=torch.int32)
    got = paged_decode(
        q,
        case.key_cache,
        case.value_cache,
        case.block_tables,
        seq_lens,
        ctx + new,
        kv_cache_dtype=kv_cache_dtype,
        k_scale=0.5,
        v_scale=0.5,
    )
    want = reference_decode(
        q,
        case.key_cache,
        case.value_cache,
        case.block_tables,
        seq_lens,
        kv_cache_dtype=kv_cache_dtype,
        k_scale=0.5,
        v_scale=0.5,
    )
    assert_close(got, want, dtype)
    # And the written rows are the chunk's K/V through the cache's quantisation.
    k, _ = tokens_from_cache(
        case.key_cache, case.value_cache, case.block_tables[0], ctx + new, kv_cache_dtype, 0.5, 0.5
    )
    assert torch.equal(k[ctx:], _roundtrip(case.key, kv_cache_dtype, 0.5))


def test_bad_arguments_name_themselves() -> None:
    case = make_paged_case((20,), 4, 2, 64, 16, torch.float16, seed=6)
    key = torch.randn(3, 2, 64).half()
    slots = torch.arange(3)
    args = (case.key_cache, case.value_cache)
    with pytest.raises(ValueError, match="value must have shape"):
        write_to_paged_cache(key, key[:2], *args, slots)
    with pytest.raises(ValueError, match="slot_mapping must be"):
        write_to_paged_cache(key, key, *args, slots.float())
    with pytest.raises(ValueError, match="slot_mapping must have shape"):
        write_to_paged_cache(key, key, *args, slots[:2])
    with pytest.raises(ValueError, match="key_cache must be"):
        write_to_paged_cache(key.float(), key.float(), *args, slots)
    with pytest.raises(ValueError, match="k_scale must be a positive float"):
        write_to_paged_cache(key, key, *args, slots, "auto", 0.0)


def test_out_of_range_slot_raises_with_value_checks(settings_env) -> None:
    settings_env.set("ATTN_CORE_CHECKS", "1")
    case = make_paged_case((20,), 4, 2, 64, 16, torch.float16, seed=6)
    key = torch.randn(1, 2, 64).half()
    big = torch.tensor([case.key_cache.shape[0] * 16])
    with pytest.raises(ValueError, match="slot_mapping must be < num_blocks"):
        write_to_paged_cache(key, key, case.key_cache, case.value_cache, big)
