"""How the native prefill kernel tiles and splits one call: pure functions of explicit numbers
(device SM count and shared memory, the kernel's recorded resources, the lengths), so the
launcher, a plan and the simulator read the same answer.

Grid (``csrc/paged_prefill.cu``): ``(query_tiles, num_seqs * num_kv_heads, num_splits)``;
a query tile holds ``rows // group`` tokens of one sequence for every head of one KV head.
Splits divide a tile's key range; each split writes fp32 partials that a merge kernel weighs
by log-sum-exp, so splits cost workspace and a second launch and are used only where the
grid leaves SMs idle (a short chunk over a long context).
"""

from __future__ import annotations

from dataclasses import dataclass

from attn_core.native import prefill_abi as pabi

PARTIAL_BYTES = 4  # part_out / part_lse are fp32
WORKSPACE_CAP_BYTES = 64 << 20  # the transient-memory bound per call
MAX_SPLITS = 64
# Extra cost per additional split relative to the work it divides (prologue, partial writes,
# merge): an assumption until the H200 sweep measures it (bench/native_prefill_bench.py).
SPLIT_OVERHEAD = 0.02
MIN_TILES_PER_SPLIT = 4  # a split shorter than this is mostly prologue (assumption)

# rows x keys per tile of each configuration (csrc/paged_prefill.cu LargeCfg / SmallCfg)
CONFIG_TILES = {pabi.CONFIG_LARGE: (128, 64), pabi.CONFIG_32K: (16, 32)}


def head_bucket(head_size: int) -> int:
    """The kernel's head bucket (shared-memory width) holding ``head_size``."""
    for bucket in (64, 128, 256):
        if head_size <= bucket:
            return bucket
    raise ValueError(f"head_size must be <= 256, got {head_size}")


def choose_config(smem_per_block_optin: int, large_smem_bytes: int) -> int:
    """The large tile where the device lets a block opt in to its shared memory, else the
    32 KiB tile (BI-V100's vLLM budget)."""
    return pabi.CONFIG_LARGE if smem_per_block_optin >= large_smem_bytes else pabi.CONFIG_32K


def tokens_per_tile(config: int, group: int) -> int:
    """Query tokens one block serves: ``rows // group`` (the group's heads share the tile)."""
    rows = CONFIG_TILES[config][0]
    if not 1 <= group <= rows:
        raise ValueError(
            f"num_heads // num_kv_heads (the GQA group) must be in 1..{rows} for tile config "
            f"{config}, got {group}"
        )
    return rows // group


def query_tiles(config: int, group: int, max_query_len: int) -> int:
    """Grid x: query tiles of the longest sequence."""
    return -(-max_query_len // tokens_per_tile(config, group))


def key_tiles(config: int, context_len: int, query_len: int) -> int:
    """Key tiles the last query tile of a sequence reads (context, then its own chunk)."""
    keys = CONFIG_TILES[config][1]
    return -(-context_len // keys) + -(-query_len // keys)


def prefill_split(
    sm_count: int,
    blocks_per_sm: int,
    grid_blocks: int,
    tiles: int,
    *,
    workspace_per_split: int = 0,
) -> int:
    """Splits per query tile: the count that minimises the waves each split's share takes,
    ``ceil(grid_blocks * s / slots) / s``, with a ``SPLIT_OVERHEAD`` penalty per extra split,
    at most ``tiles // MIN_TILES_PER_SPLIT`` and ``WORKSPACE_CAP_BYTES / workspace_per_split``.

    Args:
        sm_count / blocks_per_sm: the device profile and the kernel's occupancy there.
        grid_blocks: query tiles x sequences x KV heads.
        tiles: key tiles of the longest (query tile, sequence).
        workspace_per_split: partial bytes one split adds (0: unbounded).
    """
    for name, value in (
        ("sm_count", sm_count),
        ("blocks_per_sm", blocks_per_sm),
        ("grid_blocks", grid_blocks),
        ("tiles", tiles),
    ):
        if value < 1:
            raise ValueError(f"{name} must be >= 1, got {value}")
    slots = sm_count * blocks_per_sm
    cap = min(MAX_SPLITS, max(1, tiles // MIN_TILES_PER_SPLIT))
    if workspace_per_split > 0:
        cap = min(cap, max(1, WORKSPACE_CAP_BYTES // workspace_per_split))
    best, best_cost = 1, float("inf")
    for s in range(1, cap + 1):
        cost = -(-grid_blocks * s // slots) / s * (1.0 + SPLIT_OVERHEAD * (s - 1))
        if cost < best_cost - 1e-12:
            best, best_cost = s, cost
    return best


def partials_shapes(
    num_splits: int, num_tokens: int, num_heads: int, head_size: int
) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """``(part_out, part_lse)``: ``[splits, T, H, D]`` and ``[splits, T, H]``, fp32."""
    return (num_splits, num_tokens, num_heads, head_size), (num_splits, num_tokens, num_heads)


def workspace_bytes(num_splits: int, num_tokens: int, num_heads: int, head_size: int) -> int:
    """Bytes of the fp32 partials (0 with one split)."""
    if num_splits <= 1:
        return 0
    return num_splits * num_tokens * num_heads * (head_size + 1) * PARTIAL_BYTES


@dataclass(frozen=True)
class PrefillLaunch:
    """One call's launch decisions (what a plan will carry in phase 2)."""

    config: int
    tokens_per_tile: int
    query_tiles: int
    num_splits: int
    workspace_bytes: int
