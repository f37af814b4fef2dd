"""The native prefill's tile and split rule: pure functions, checked on the CPU."""

from __future__ import annotations

import pytest

from attn_core.native import abi
from attn_core.native import split as ps


def test_a_full_grid_is_not_split() -> None:
    # Qwen3.6 at 100K / 8192 on the H200: 391 query tiles x 4 KV heads over 132 SMs
    grid = ps.query_tiles(ps.CONFIG_LARGE, 6, 8192) * 4
    assert grid == 1564
    assert ps.prefill_split(132, 1, grid, ps.key_tiles(ps.CONFIG_LARGE, 100_000, 8192)) == 1


def test_a_short_chunk_over_a_long_context_fills_the_device() -> None:
    tiles = ps.key_tiles(ps.CONFIG_LARGE, 256_000, 16)
    grid = ps.query_tiles(ps.CONFIG_LARGE, 6, 16) * 4  # one query tile per KV head
    s = ps.prefill_split(132, 1, grid, tiles)
    assert grid * s >= 132 * 0.9  # at least ~one full wave
    assert -(-grid * s // 132) == 1  # and not more than one


def test_splits_respect_tiles_and_workspace() -> None:
    assert ps.prefill_split(132, 1, 4, 8) == 2  # 8 tiles: at most 8 // MIN_TILES_PER_SPLIT
    per = ps.WORKSPACE_CAP_BYTES // 3
    assert ps.prefill_split(132, 1, 4, 10_000, workspace_per_split=per) == 3
    with pytest.raises(ValueError, match="grid_blocks must be >= 1, got 0"):
        ps.prefill_split(132, 1, 0, 10)


def test_configs_and_tokens_per_tile() -> None:
    assert ps.choose_config(227 << 10, 190 << 10) == ps.CONFIG_LARGE
    assert ps.choose_config(32 << 10, 190 << 10) == ps.CONFIG_32K  # BI-V100's budget
    assert ps.tokens_per_tile(ps.CONFIG_LARGE, 6) == 21
    assert ps.tokens_per_tile(ps.CONFIG_32K, 16) == 1
    with pytest.raises(ValueError, match="the GQA group"):
        ps.tokens_per_tile(ps.CONFIG_32K, 17)
    assert ps.workspace_bytes(1, 10, 4, 64) == 0
    assert ps.workspace_bytes(3, 10, 4, 64) == 3 * 10 * 4 * 65 * 4
    assert abi.head_bucket(120) == 128


def test_a_launch_of_a_forced_config_and_split() -> None:
    """What a plan carries and the kernel reads: Qwen3.6's group on the large tile (21 tokens a
    tile, 2 tiles for 40), three splits' partials; a split below one is refused."""
    launch = ps.prefill_launch(ps.CONFIG_LARGE, 6, 100, 24, 256, 40, 3)
    assert launch == ps.PrefillLaunch(
        config=ps.CONFIG_LARGE, tokens_per_tile=21, query_tiles=2, num_splits=3,
        workspace_bytes=100 * 24 * 3 * (256 + 1) * 4,
    )  # fmt: skip
    assert ps.prefill_launch(ps.CONFIG_32K, 16, 5, 16, 64, 5, 1).workspace_bytes == 0
    with pytest.raises(ValueError, match="num_splits must be >= 1, got 0"):
        ps.prefill_launch(ps.CONFIG_32K, 2, 5, 4, 64, 5, 0)
    with pytest.raises(ValueError, match="the GQA group"):
        ps.prefill_launch(ps.CONFIG_32K, 17, 5, 34, 64, 5, 1)


def test_partials_are_the_decode_layout_with_tokens_for_sequences() -> None:
    """csrc/attn_prefill_abi.h: part_out [num_tokens, num_heads, num_splits, head_size], part_lse
    [num_tokens, num_heads, num_splits], the layout decode's merge reads (the host-emulated
    kernel runs on it: test_native_prefill_host_emulation.py)."""
    assert abi.partials_shapes(10, 4, 3, 64) == ((10, 4, 3, 64), (10, 4, 3))
    assert abi.partials_bytes(10, 4, 3, 64) == ps.workspace_bytes(3, 10, 4, 64)
