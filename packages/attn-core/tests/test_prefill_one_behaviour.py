"""One behaviour per kind of mistake, prefill as decode: an empty batch is a no-op, a forced
backend that cannot serve is a ValueError whichever backend it is, conflicting overrides are
refused naming both, and ATTN_CORE_CHECKS=1 checks the block ids a context reads."""

from __future__ import annotations

import pytest
import torch

import attn_core
from attn_core import AttentionShape, PrefillLengths, PrefillOverrides, plan_prefill
from attn_core.core import settings
from attn_core.device.capabilities import Capabilities
from attn_core.device.spec import get_device_spec
from attn_core.reference import make_prefill_case


def _call(case, **kw):
    return attn_core.paged_prefix_prefill(*case.args(), **case.kwargs(), **kw)


def test_an_empty_batch_is_a_no_op_as_in_decode() -> None:
    q = torch.zeros(0, 4, 64)
    kv = torch.zeros(0, 2, 64)
    key_cache, value_cache = torch.zeros(4, 2, 16, 16, 4), torch.zeros(4, 2, 64, 16)
    lens = torch.zeros(0, dtype=torch.int32)
    out = attn_core.paged_prefix_prefill(
        q, kv, kv, key_cache, value_cache, torch.zeros(0, 4, dtype=torch.int32),
        torch.zeros(1, dtype=torch.int32), lens, lens, 1,
    )  # fmt: skip
    assert out.shape == (0, 4, 64)
    assert attn_core.paged_decode(
        torch.zeros(0, 4, 64), key_cache, value_cache, torch.zeros(0, 4, dtype=torch.int32),
        lens, 16,
    ).shape == (0, 4, 64)  # fmt: skip


@pytest.mark.parametrize("backend", ["sdpa", "vendor_flash", "native"])
def test_a_forced_backend_that_cannot_serve_is_a_value_error(backend: str) -> None:
    case = make_prefill_case([(5, 3)], 4, 2, 64, 16, torch.float16, "cpu")
    with pytest.raises(ValueError, match=backend):
        _call(case, backend=backend)


def test_a_native_variant_with_another_backend_forced_is_refused_naming_both() -> None:
    shape = AttentionShape(4, 2, 64, 16, torch.float16)
    overrides = PrefillOverrides(backend="torch", native_mma="wmma")
    with pytest.raises(ValueError, match="native_mma.*backend"):
        plan_prefill(
            shape, PrefillLengths(8, 100), get_device_spec("h200"), Capabilities(), overrides
        )


def test_checks_name_a_block_id_outside_the_cache(monkeypatch) -> None:
    case = make_prefill_case([(40, 3)], 4, 2, 64, 16, torch.float32, "cpu")
    case.block_tables[0, 1] = case.key_cache.shape[0] + 7
    monkeypatch.setenv("ATTN_CORE_CHECKS", "1")
    settings.reload()
    try:
        with pytest.raises(ValueError, match="block_tables entries in use"):
            _call(case)
    finally:
        monkeypatch.delenv("ATTN_CORE_CHECKS")
        settings.reload()
