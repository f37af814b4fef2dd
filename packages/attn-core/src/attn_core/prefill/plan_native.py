"""The native prefill kernel's plan: MMA variant, tile configuration, split, workspace.

:func:`plan_native_prefill` is pure (a profile, a shape, lengths, a variant): the tile
configuration from the profile's shared memory, the split from
:func:`attn_core.native.split.prefill_split` (the rule the family's reference check uses too,
so a plan and that check agree), the fp32 partials it needs, and the price
(:mod:`attn_core.prefill.cost`). The resolver (:mod:`attn_core.runtime.resolve`) attaches the
loaded, verified library, so running the plan looks nothing up.

Which variant a device may run is the capabilities' answer (``Capabilities.native_prefill``:
the variants that loaded and matched the float64 reference here); which one runs is the
cheapest of those (:func:`attn_core.prefill.plan.plan_prefill`).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, Optional

import torch

from attn_core.core.plan_types import KernelStep
from attn_core.core.shapes import AttentionShape
from attn_core.device.spec import DeviceSpec, opted_in, shared_mem_allocation
from attn_core.native import abi
from attn_core.native import split as ps
from attn_core.prefill.cost import PrefillCost, prefill_work, price

# Matrix variants first: where several verify, the price decides, and equal prices keep this order.
VARIANTS = ("wmma", "corex_wmma", "fma")
QUERY_DTYPES = (torch.float16, torch.bfloat16)
BLOCK_SIZES = (8, 16, 32)
MERGE_THREADS = 256  # csrc/paged_prefill.cu kMergeThreads
# Threads per block of each configuration (csrc/paged_prefill.cu; a 64-wide warp halves the
# warp count, the threads stay): the large tile runs 8 warps on the matrix layers (RowsCfg, a
# warp owning 16 rows) and 16 on the FMA layer (LargeCfg); the 32 KiB tile one warp.
CONFIG_THREADS = {ps.CONFIG_LARGE: 16 * 32, ps.CONFIG_32K: 32}
MATRIX_LARGE_THREADS = 8 * 32


def config_threads(config: int, variant: str) -> int:
    """Threads per block of ``config`` on ``variant``'s matrix layer."""
    if config == ps.CONFIG_LARGE and variant != "fma":
        return MATRIX_LARGE_THREADS
    return CONFIG_THREADS[config]


@dataclass(frozen=True)
class NativePrefillPlan:
    """One native prefill call.

    Attributes:
        variant: the MMA implementation (``"wmma"``, ``"corex_wmma"``, ``"fma"``).
        config: tile configuration (``native.split.CONFIG_LARGE`` / ``CONFIG_32K``).
        tokens_per_tile / query_tiles: query tokens per block (``rows // group``), grid x.
        num_splits: key-range splits per query tile (1: no merge).
        workspace_bytes: the fp32 partials of a split call (0 with one split).
        num_seqs / num_tokens / max_query_len / max_context_len: the lengths it is sized for;
            a call with more tokens or a longer context needs a new plan.
        cost: its price (:mod:`attn_core.prefill.cost`).
        steps: the tile kernel, and the merge when split.
        backend_reason: why the native backend was chosen.
        library: the loaded, verified library (attached by the resolver; None in a plan made
            by the pure planner, e.g. the simulator's).
    """

    variant: str
    config: int
    tokens_per_tile: int
    query_tiles: int
    num_splits: int
    workspace_bytes: int
    num_heads: int
    num_kv_heads: int
    head_size: int
    block_size: int
    dtype: torch.dtype
    kv_cache_dtype: str
    num_seqs: int
    num_tokens: int
    max_query_len: int
    max_context_len: int
    device_name: str
    cost: PrefillCost
    steps: tuple[KernelStep, ...]
    backend_reason: str = ""
    library: Optional[Any] = field(default=None, compare=False, repr=False)

    backend = "native"

    @property
    def group_size(self) -> int:
        return self.num_heads // self.num_kv_heads

    @property
    def launch(self) -> ps.PrefillLaunch:
        """What the kernel's launch reads of this plan."""
        return ps.PrefillLaunch(
            self.config, self.tokens_per_tile, self.query_tiles, self.num_splits,
            self.workspace_bytes,
        )  # fmt: skip


def unsupported(shape: AttentionShape, spec: DeviceSpec) -> str:
    """Why the kernel cannot take ``shape`` on ``spec`` ("" when it can): fp16/bf16 queries,
    head sizes that are multiples of 8 up to 256, block sizes 8/16/32, a GQA group that fits
    the tile's rows."""
    if shape.dtype not in QUERY_DTYPES:
        return f"the native prefill takes fp16/bf16 queries, got {shape.dtype}"
    if shape.head_size % 8 or shape.head_size > 256:
        return f"the native prefill takes head sizes 8..256 in steps of 8, got {shape.head_size}"
    if shape.block_size not in BLOCK_SIZES:
        return f"the native prefill takes block sizes {BLOCK_SIZES}, got {shape.block_size}"
    # a group past the 32 KiB tile's rows needs the large tile on every variant (the most
    # shared memory of them decides), so whichever variant the price picks can take it
    every_large = all(choose_config(spec, shape, v) == ps.CONFIG_LARGE for v in VARIANTS)
    rows = ps.CONFIG_TILES[ps.CONFIG_LARGE if every_large else ps.CONFIG_32K][0]
    if shape.group > rows:
        return f"the native prefill's tile on {spec.name} takes groups <= {rows}, got {shape.group}"
    return ""


# csrc/paged_prefill.cu SmemPlan for the NVIDIA wmma tile, whose scores stay in registers: no S
# or P, a 16 x 16 fp32 fragment-index scratch per warp, per-row alpha, 1 / l and lse, one float
# per thread; regions start on 128 bytes. At head 256: 148992 bytes, the library's own figure
# on the H200 (docs/benchmarks.md#native-chunked-prefill).
_REGS_TILE_WARPS = MATRIX_LARGE_THREADS // 32


def _up128(n: int) -> int:
    return -(-n // 128) * 128


def large_tile_smem(head_size: int, variant: str) -> int:
    """Shared memory of the large tile at ``head_size``'s bucket on ``variant``: Q (128 rows)
    and K (64 keys) with 8 columns of padding, V transposed with 8 of padding; then on
    ``wmma`` (NVIDIA, scores in registers) csrc's small per-warp and per-row regions, exactly
    (146 KiB at head 256), and on the others fp32 scores and 16-bit probabilities (an estimate
    of csrc's SmemPlan, ~190 KiB at head 256). The launcher reads the real figure from the
    library; this is the pure planner's and the simulator's."""
    rows, keys = ps.CONFIG_TILES[ps.CONFIG_LARGE]
    d = abi.head_bucket(head_size)
    q_k_v = _up128(2 * rows * (d + 8)) + _up128(2 * keys * (d + 8)) + _up128(2 * d * (keys + 8))
    if variant == "wmma":
        per_warp = _up128(_REGS_TILE_WARPS * 16 * 16 * 4)
        per_row = _up128(rows * 4) + _up128(2 * rows * 4) + _up128(MATRIX_LARGE_THREADS * 4)
        return q_k_v + per_warp + per_row
    return q_k_v + rows * (keys + 4) * 4 + rows * (keys + 8) * 2


def choose_config(spec: DeviceSpec, shape: AttentionShape, variant: str) -> int:
    """The large tile where a block may opt in to ``variant``'s shared memory for it and the
    group fits its rows, else the 32 KiB tile (what
    :func:`attn_core.native.split.choose_config` decides from the driver's figure)."""
    optin = opted_in(spec).shared_mem_per_block
    rows = ps.CONFIG_TILES[ps.CONFIG_LARGE][0]
    if optin >= large_tile_smem(shape.head_size, variant) and shape.group <= rows:
        return ps.CONFIG_LARGE
    return ps.CONFIG_32K


def blocks_per_sm(spec: DeviceSpec, config: int, head_size: int, variant: str) -> int:
    """Resident blocks per SM by threads and shared memory (registers are the launcher's
    driver-reported occupancy; the large tile is one block per SM on the H200 either way)."""
    threads = config_threads(config, variant)
    smem = large_tile_smem(head_size, variant) if config == ps.CONFIG_LARGE else 32 * 1024
    by_smem = spec.shared_mem_per_sm // max(shared_mem_allocation(spec, smem), 1)
    by_threads = spec.max_threads_per_sm // threads
    return max(1, min(by_smem, by_threads, spec.max_blocks_per_sm))


def plan_native_prefill(
    shape: AttentionShape,
    spec: DeviceSpec,
    variant: str,
    *,
    num_seqs: int,
    num_tokens: int,
    max_query_len: int,
    max_context_len: int,
    why: str = "",
) -> NativePrefillPlan:
    """The native kernel's launch for these lengths on ``spec`` with ``variant``."""
    if variant not in VARIANTS:
        raise ValueError(f"variant must be one of {VARIANTS}, got {variant!r}")
    config = choose_config(spec, shape, variant)
    tiles_q = ps.query_tiles(config, shape.group, max_query_len)
    grid_blocks = tiles_q * num_seqs * shape.num_kv_heads
    per_split = ps.workspace_bytes(2, num_tokens, shape.num_heads, shape.head_size) // 2
    splits = ps.prefill_split(
        spec.sm_count,
        blocks_per_sm(spec, config, shape.head_size, variant),
        grid_blocks,
        ps.key_tiles(config, max_context_len, max_query_len),
        workspace_per_split=per_split,
    )
    threads = config_threads(config, variant)
    smem = large_tile_smem(shape.head_size, variant) if config == ps.CONFIG_LARGE else 32 * 1024
    steps: tuple[KernelStep, ...] = (
        KernelStep(
            "native_prefill", (tiles_q, num_seqs * shape.num_kv_heads, splits), threads, smem
        ),
    )
    if splits > 1:
        steps += (
            KernelStep("native_prefill_merge", (num_tokens, shape.num_heads, 1), MERGE_THREADS, 0),
        )
    work = prefill_work(shape, num_seqs, max_query_len, max_context_len)
    # each query tile of a sequence reads its KV head's context once (GQA-packed rows)
    cost = price(f"native:{variant}", work, spec, launches=len(steps), kv_reads=tiles_q)
    return NativePrefillPlan(
        variant=variant,
        config=config,
        tokens_per_tile=ps.tokens_per_tile(config, shape.group),
        query_tiles=tiles_q,
        num_splits=splits,
        workspace_bytes=ps.workspace_bytes(splits, num_tokens, shape.num_heads, shape.head_size),
        # every field of the layer's shape is a plan field of the same name
        **{f.name: getattr(shape, f.name) for f in fields(shape)},
        num_seqs=num_seqs,
        num_tokens=num_tokens,
        max_query_len=max_query_len,
        max_context_len=max_context_len,
        device_name=spec.name,
        cost=cost,
        steps=steps,
        backend_reason=why,
    )
