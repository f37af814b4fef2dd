"""checks and cache_layout: errors name the argument, the expected and the actual value."""

from __future__ import annotations

import pytest
import torch

from attn_core.core.cache_layout import (
    dequantize,
    fp8_dtype,
    quantize,
    validate_caches,
    vector_width,
)
from attn_core.core.checks import check_positive, check_tensor, resolve_scale, value_checks_enabled
from attn_core.reference import make_paged_case, tokens_from_cache


def test_check_tensor_messages() -> None:
    t = torch.zeros(2, 3, dtype=torch.int64)
    assert check_tensor("t", t, shape=(2, None), dtype=torch.int64) is t
    with pytest.raises(ValueError, match=r"t must have 3 dimensions, got 2 with shape \(2, 3\)"):
        check_tensor("t", t, ndim=3)
    with pytest.raises(ValueError, match=r"t must have shape \[2, 4\], got \(2, 3\) \(dimension 1"):
        check_tensor("t", t, shape=(2, 4))
    with pytest.raises(ValueError, match=r"t must be torch.int32 or torch.int16, got torch.int64"):
        check_tensor("t", t, dtype=(torch.int32, torch.int16))
    with pytest.raises(ValueError, match=r"t must be on meta, got cpu"):
        check_tensor("t", t, device=torch.device("meta"))
    with pytest.raises(ValueError, match=r"t must be a torch.Tensor, got int"):
        check_tensor("t", 3)


def test_scalars() -> None:
    assert check_positive("n", 3) == 3
    for bad in (0, -1, 2.5, True):
        with pytest.raises(ValueError, match="n must be a positive int"):
            check_positive("n", bad)
    assert resolve_scale(None, 64) == 0.125
    assert resolve_scale(2, 64) == 2.0


def test_value_checks_flag(settings_env) -> None:
    """The flag follows the settings snapshot: a changed variable counts after a reload."""
    settings_env.unset("ATTN_CORE_CHECKS")
    assert not value_checks_enabled()
    settings_env.set("ATTN_CORE_CHECKS", "1")
    assert value_checks_enabled()
    settings_env.set("ATTN_CORE_CHECKS", "0")
    assert not value_checks_enabled()


@pytest.mark.parametrize("dtype", (torch.float16, torch.bfloat16, torch.float32), ids=str)
def test_layout_and_gathers_match_the_reference_reader(dtype: torch.dtype) -> None:
    case = make_paged_case((21,), 4, 2, 96, 8, dtype)
    layout = validate_caches(
        case.key_cache, case.value_cache, "auto", compute_dtype=dtype, device=torch.device("cpu")
    )
    assert (layout.head_size, layout.block_size, layout.num_kv_heads) == (96, 8, 2)
    assert layout.x == vector_width(case.key_cache.element_size()) and not layout.is_fp8
    blocks = case.block_tables[0, :3].long()
    keys = case.key_cache[blocks].transpose(-3, -2).reshape(3, 2, 8, 96)  # [3, kvh, bs, d]
    values = case.value_cache[blocks]  # [3, kvh, d, bs]
    ref_k, ref_v = tokens_from_cache(case.key_cache, case.value_cache, case.block_tables[0], 21)
    got_k = keys.permute(0, 2, 1, 3).reshape(24, 2, 96)[:21]
    got_v = values.permute(0, 3, 1, 2).reshape(24, 2, 96)[:21]
    assert torch.equal(got_k.double(), ref_k) and torch.equal(got_v.double(), ref_v)


@pytest.mark.parametrize("name", ("fp8", "fp8_e4m3", "fp8_e5m2"))
def test_fp8_round_trip(name: str) -> None:
    values = torch.tensor([0.5, -1.0, 2.0, 0.0])
    stored = quantize(values, name, 0.5, torch.uint8)
    assert stored.dtype == torch.uint8
    assert torch.equal(dequantize(stored, name, 0.5, torch.float32), values)
    assert fp8_dtype(name) in (torch.float8_e4m3fn, torch.float8_e5m2)
