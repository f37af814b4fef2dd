"""The native prefill in the pure planner: chosen by price among verified variants, forced
on or off by override, sized by the split rule (no kernel, no GPU)."""

from __future__ import annotations

import pytest
import torch

from attn_core import AttentionShape, NativePrefillPlan, PrefillLengths, get_device_spec
from attn_core.core.settings import PrefillOverrides
from attn_core.device.capabilities import Capabilities, profile_capabilities
from attn_core.native import split as ps
from attn_core.prefill import plan_native as pn
from attn_core.prefill.plan import plan_prefill

QWEN = AttentionShape(24, 4, 256, 16, torch.float16)
H200 = get_device_spec("h200")
# A device whose memory is slow beside its matrix units: the torch path's elementwise traffic
# then prices it well above the native kernel (on the H200's own rates the native wmma tile is
# priced just below torch, as measured; on BI-V100's it is not).
SLOW_HBM = H200.with_overrides(name="slow-hbm", hbm_bandwidth=0.3e12)


def caps(*variants: str, fused: tuple[str, ...] = (), why: str = "") -> Capabilities:
    return Capabilities(
        device_type="cuda", bmm_writes_fp32=True, fused_prefill=fused, native_prefill=variants,
        native_prefill_why=why,
    )  # fmt: skip


def plan(spec, c, q=8192, ctx=100_000, overrides=None, **kw):
    return plan_prefill(QWEN, PrefillLengths(q, ctx), spec, c, overrides, **kw)


def test_unverified_native_leaves_the_portable_plan_and_says_why() -> None:
    p = plan(SLOW_HBM, caps(why="wmma not verified here (max abs error 3e-01)"))
    assert p.backend == "torch"
    assert "native prefill: wmma not verified here" in p.backend_reason


def test_cheapest_verified_variant_wins_where_it_is_cheaper() -> None:
    p = plan(SLOW_HBM, caps("wmma", "fma"))
    assert isinstance(p, NativePrefillPlan) and p.variant == "wmma"
    assert (
        "native wmma (verified here) priced" in p.backend_reason
        and "below torch" in p.backend_reason
    )
    assert p.library is None  # the pure planner attaches none


@pytest.mark.parametrize("profile", ("h200", "bi-v100", "a100"))
def test_blas_stays_default_when_only_the_fma_tile_verifies(profile: str) -> None:
    """Item 10: where BLAS's matrix units beat the CUDA-core tile, the torch / fused path
    stays the default until a matrix variant verifies."""
    spec = get_device_spec(profile)
    base = profile_capabilities(spec, torch.float16)
    c = Capabilities(
        device_type="cuda", bmm_writes_fp32=base.bmm_writes_fp32,
        fused_prefill=base.fused_prefill, native_prefill=("fma",),
    )  # fmt: skip
    for q, ctx in ((2048, 32_768), (8192, 262_144), (17, 0)):
        p = plan(spec, c, q, ctx)
        assert p.backend != "native", (profile, q, ctx, p.backend_reason)
        assert "at or below the verified native fma" in p.backend_reason


def test_forced_native_without_a_verified_variant_names_why() -> None:
    o = PrefillOverrides(backend="native")
    with pytest.raises(
        ValueError, match=r"no MMA variant is built and verified here: needs a CUDA"
    ):
        plan(H200, caps(why="needs a CUDA device, got cpu"), overrides=o)


def test_forced_native_is_taken_even_when_priced_higher() -> None:
    p = plan(H200, caps("fma"), overrides=PrefillOverrides(backend="native"))
    assert isinstance(p, NativePrefillPlan) and p.variant == "fma"
    assert "forced" in p.backend_reason


def test_forced_native_mma_picks_only_that_variant() -> None:
    o = PrefillOverrides(backend="native", native_mma="fma")
    assert plan(H200, caps("wmma", "fma"), overrides=o).variant == "fma"
    with pytest.raises(ValueError, match=r"ATTN_CORE_PREFILL_MMA=corex_wmma"):
        plan(
            H200,
            caps("wmma"),
            overrides=PrefillOverrides(backend="native", native_mma="corex_wmma"),
        )


def test_forced_native_contradicting_a_torch_override_names_both() -> None:
    o = PrefillOverrides(backend="native", query_tile=64)
    with pytest.raises(ValueError, match=r"'native'.*contradicts .*query_tile"):
        plan(H200, caps("wmma"), overrides=o)


def test_forced_native_on_a_shape_it_cannot_take() -> None:
    fp32 = AttentionShape(8, 2, 64, 16, torch.float32)
    with pytest.raises(ValueError, match=r"fp16/bf16 queries, got torch.float32"):
        plan_prefill(
            fp32, PrefillLengths(16), H200, caps("wmma"), PrefillOverrides(backend="native")
        )


def test_forcing_another_backend_ignores_native() -> None:
    p = plan(SLOW_HBM, caps("wmma"), overrides=PrefillOverrides(backend="torch"))
    assert p.backend == "torch"


def test_native_takes_alibi_and_windows() -> None:
    p = plan(SLOW_HBM, caps("wmma"), alibi=True)
    assert p.backend == "native"
    assert plan(SLOW_HBM, caps("wmma"), sliding_window=4096).backend == "native"


def test_native_plan_sizes_from_the_split_rule() -> None:
    """A short chunk over a long context splits the key range to fill the H200; the plan's
    partials are the split rule's workspace, within the issue's 64 MiB bound."""
    o = PrefillOverrides(backend="native")
    p = plan(H200, caps("wmma"), q=64, ctx=250_000, overrides=o)
    assert p.config == ps.CONFIG_LARGE and p.tokens_per_tile == 128 // 6
    assert p.num_splits > 1 and len(p.steps) == 2
    assert p.workspace_bytes == ps.workspace_bytes(p.num_splits, 64, 24, 256)
    assert 0 < p.workspace_bytes <= ps.WORKSPACE_CAP_BYTES
    long_chunk = plan(H200, caps("wmma"), q=8192, ctx=250_000, overrides=o)
    assert long_chunk.num_splits == 1 and long_chunk.workspace_bytes == 0


def test_bi_v100_takes_the_32k_tile() -> None:
    p = plan(
        get_device_spec("bi-v100"), caps("corex_wmma"), overrides=PrefillOverrides(backend="native")
    )
    assert p.config == ps.CONFIG_32K and p.variant == "corex_wmma"
    assert all(s.shared_mem_bytes <= 32 * 1024 for s in p.steps)


def test_batch_lengths_size_the_partials() -> None:
    o = PrefillOverrides(backend="native")
    lengths = PrefillLengths(16, 200_000, num_seqs=3, num_tokens=40)
    p = plan_prefill(QWEN, lengths, H200, caps("wmma"), o)
    assert (p.num_seqs, p.num_tokens) == (3, 40)
    assert p.workspace_bytes == ps.workspace_bytes(p.num_splits, 40, 24, 256)
    with pytest.raises(
        ValueError, match=r"num_tokens must be an int in 0..num_seqs \* max_query_len = 48, got 49"
    ):
        PrefillLengths(16, 0, num_seqs=3, num_tokens=49)


def test_the_launch_step_has_each_variants_thread_count() -> None:
    """The matrix layers' large tile is 8 warps (warp-owned rows), the FMA layer's 16: the
    plan's step, and so the simulator's occupancy, must say which (csrc/paged_prefill.cu)."""
    from attn_core.prefill.plan_native import plan_native_prefill

    lengths = dict(num_seqs=1, num_tokens=8192, max_query_len=8192, max_context_len=100_000)
    threads = {
        v: plan_native_prefill(QWEN, H200, v, **lengths).steps[0].threads_per_block
        for v in ("wmma", "corex_wmma", "fma")
    }
    assert threads == {"wmma": 256, "corex_wmma": 256, "fma": 512}


def test_the_large_tiles_shared_memory_follows_the_variant() -> None:
    """The NVIDIA wmma tile keeps its scores in registers and needs no S or P: the planner's
    figure is the library's own (148992 bytes at head 256 on the H200, 2026-12-02), and a
    device with 163 KiB per block takes the large tile on wmma but not on the others."""
    assert pn.large_tile_smem(256, "wmma") == 148992
    assert pn.large_tile_smem(256, "fma") > 180 << 10
    assert pn.large_tile_smem(256, "corex_wmma") == pn.large_tile_smem(256, "fma")
    mid = H200.with_overrides(name="163k", shared_mem_per_block_optin=163 << 10)
    assert pn.choose_config(mid, QWEN, "wmma") == ps.CONFIG_LARGE
    assert pn.choose_config(mid, QWEN, "fma") == ps.CONFIG_32K
    # a group past the 32 KiB tile's 16 rows needs the large tile on every variant there
    wide = AttentionShape(32, 1, 256, 16, torch.float16)
    assert "groups <= 16" in pn.unsupported(wide, mid)
    assert pn.unsupported(wide, H200) == ""
