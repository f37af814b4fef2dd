"""Trace bytes / FLOPs / launches / memory against hand counts on small functions."""

from __future__ import annotations

import pytest
import torch

from attn_sim.tracer import HostReadError, trace


def meta(*size, dtype=torch.float16):
    return torch.empty(size, dtype=dtype, device="meta")


def test_bmm_flops_and_bytes_by_hand():
    a, b = meta(3, 6, 64), meta(3, 64, 100)
    t, out = trace(torch.bmm, a, b)
    (op,) = t.ops
    assert op.name == "bmm.default"
    assert op.cost.flops == 2 * 3 * 6 * 64 * 100
    assert op.cost.bytes_read == (3 * 6 * 64 + 3 * 64 * 100) * 2
    assert op.cost.bytes_written == 3 * 6 * 100 * 2
    assert t.launches == 1 and out.device.type == "meta"


def test_baddbmm_counts_the_accumulation():
    c, a, b = meta(2, 4, 8, dtype=torch.float32), meta(2, 4, 16), meta(2, 16, 8)
    t, _ = trace(lambda: torch.baddbmm(c, a.float(), b.float()))
    op = [o for o in t.ops if o.name.startswith("baddbmm")][0]
    assert op.cost.flops == 2 * 2 * 4 * 16 * 8 + 2 * 2 * 4 * 8


def test_view_of_the_cache_is_charged_the_slice_not_the_cache():
    cache = meta(1000, 4, 16, 256)  # 32 MB if it were real

    def f(c):
        return c[10:12].float()  # a 2-block slice, then one copy kernel

    t, _ = trace(f, cache)
    kernels = t.kernels()
    assert len(kernels) == 1
    assert kernels[0].cost.bytes_read == 2 * 4 * 16 * 256 * 2
    assert kernels[0].cost.bytes_written == 2 * 4 * 16 * 256 * 4


def test_gather_charges_rows_read_not_the_source():
    cache = meta(100_000, 4, 256)
    idx = torch.empty(37, dtype=torch.int64, device="meta")
    t, out = trace(torch.index_select, cache, 0, idx)
    (op,) = t.ops
    assert op.cost.kind == "gather"
    assert op.cost.bytes_read == 37 * 4 * 256 * 2 + 37 * 8
    assert op.cost.bytes_written == 37 * 4 * 256 * 2
    assert tuple(out.shape) == (37, 4, 256)


def test_broadcast_operand_is_read_once():
    q, k = meta(4, 1, 6, 256), meta(4, 512, 1, 256)
    t, _ = trace(torch.mul, q.expand(4, 512, 6, 256), k)
    (op,) = t.kernels()
    assert op.cost.bytes_read == (4 * 6 * 256 + 4 * 512 * 256) * 2
    assert op.cost.flops == 4 * 512 * 6 * 256


def test_views_and_allocations_launch_nothing():
    x = meta(8, 16)
    t, _ = trace(lambda: torch.empty_like(x).view(16, 8).transpose(0, 1).unsqueeze(0))
    assert t.launches == 0 and t.bytes == 0


def test_peak_memory_counts_transients_and_frees():
    x = meta(1024, dtype=torch.float32)  # 4 KiB

    def f(v):
        a = v * 2  # +4 KiB
        b = a + 1  # +4 KiB (8 live)
        del a  # -4
        c = b.sum()  # +4 bytes
        return c

    t, _ = trace(f, x)
    assert t.peak_bytes == 8192  # a and b together; c comes after a is freed
    assert t.retained_bytes == 4  # only the result stays
    assert t.launches == 3


def test_one_million_tokens_trace_on_meta_without_memory():
    k = meta(65536, 4, 16, 16, 16)  # 1M tokens of 4 x 256 fp16 keys: 2 GiB if real
    idx = torch.empty(65536, dtype=torch.int64, device="meta")
    t, out = trace(lambda: torch.index_select(k, 0, idx).sum())
    assert t.ops[0].cost.bytes_written == 2 * 1024 * 1024 * 4 * 256
    assert out.device.type == "meta"


def test_host_read_needs_a_shadow():
    lens = torch.empty(3, dtype=torch.int32, device="meta")
    with pytest.raises(HostReadError, match="shadow"):
        trace(lambda: int(lens.max()))


def test_shadowed_values_flow_through_ops_and_to_host():
    lens = torch.empty(3, dtype=torch.int32, device="meta")

    def f(v):
        offsets = torch.cumsum(v, 0)
        return int(v.max()), offsets.tolist(), torch.nonzero(v > 5).shape[0]

    t, got = trace(f, lens, shadows={lens: torch.tensor([4, 9, 7], dtype=torch.int32)})
    assert got == (9, [4, 13, 20], 2)
    assert t.syncs >= 2


def test_shadow_must_match():
    lens = torch.empty(3, dtype=torch.int32, device="meta")
    with pytest.raises(ValueError, match="shadows"):
        trace(lambda: None, shadows={lens: torch.zeros(4, dtype=torch.int32)})


def test_matmul_rate_follows_the_matrix_operands_not_the_output():
    a, b = meta(2, 6, 64), meta(2, 64, 100)
    out = torch.empty(2, 6, 100, dtype=torch.float32, device="meta")
    t, _ = trace(lambda: torch.baddbmm(out, a.float(), b.float()))
    assert not [o for o in t.ops if o.name.startswith("baddbmm")][0].cost.half_inputs
    t, _ = trace(torch.bmm, a, b)
    assert t.ops[0].cost.half_inputs


def test_out_variant_charges_the_out_tensor_as_written_only():
    a, b = meta(2, 6, 64), meta(2, 64, 100)
    out = meta(2, 6, 100)
    t, _ = trace(lambda: torch.bmm(a, b, out=out))
    (op,) = t.ops
    assert op.cost.kind == "matmul"
    assert op.cost.bytes_read == (2 * 6 * 64 + 2 * 64 * 100) * 2
    assert op.cost.bytes_written == 2 * 6 * 100 * 2
    assert op.allocated == 0


def test_copy_to_host_counts_as_a_sync():
    lens = torch.empty(3, dtype=torch.int32, device="meta")
    t, got = trace(
        lambda v: v.cpu(), lens, shadows={lens: torch.tensor([1, 2, 3], dtype=torch.int32)}
    )
    assert got.tolist() == [1, 2, 3]
    assert t.syncs == 1
