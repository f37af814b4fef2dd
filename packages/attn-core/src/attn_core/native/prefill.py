"""The prefill kernel family at run time: its C structs, library, launch and reference check.

``csrc/paged_prefill.cu`` (ABI ``csrc/attn_prefill_abi.h``) is built once per matrix-tile layer
(:data:`attn_core.native.family.PREFILL`: ``fma``, ``wmma``, ``corex_wmma``). Semantics are
:func:`attn_core.paged_prefix_prefill`'s (bottom-right causal within the chunk, sliding window,
ALiBi ``slope * (key_pos - query_pos)``, fp8 caches whose scales act on the cached context
only). :class:`PreparedPrefill` launches what a plan decided (tile configuration and split,
:class:`~attn_core.native.split.PrefillLaunch`) on tensors the entry point validated: it checks
nothing and chooses nothing. The family's check against the float64 reference is registered
with the verify-once registry as ``native_prefill``.
"""

from __future__ import annotations

import ctypes
import math
from dataclasses import dataclass
from typing import Any, Optional

import torch

from attn_core.core import verify_once
from attn_core.core.verify_once import Verdict
from attn_core.native import abi
from attn_core.native import split as ps
from attn_core.native.family import PREFILL, PREFILL_MMA_KINDS
from attn_core.native.loader import NativeLibrary
from attn_core.reference import PrefillCase, make_prefill_case, reference_prefix_prefill

PrefillArgs = abi.c_struct(
    "PrefillArgs",
    (
        "pointer",
        "out query key value key_cache value_cache block_tables query_start_loc context_lens "
        "alibi_slopes part_out part_lse",
    ),
    (
        "int64",
        "out_tok_stride out_head_stride q_tok_stride q_head_stride k_tok_stride k_head_stride "
        "v_tok_stride v_head_stride kc_block_stride kc_head_stride vc_block_stride "
        "vc_head_stride table_stride",
    ),
    (
        "int32",
        "num_seqs num_tokens num_heads num_kv_heads head_size block_size table_width "
        "max_query_len num_splits sliding_window query_kind cache_kind config",
    ),
    ("float32", "scale k_scale v_scale"),
)


PrefillConfigInfo = abi.c_struct(
    "PrefillConfigInfo",
    ("int32", "rows keys threads smem_bytes num_regs local_bytes blocks_per_sm available"),
)


@dataclass(frozen=True)
class ConfigFacts:
    """One compiled tile configuration, as the driver reports it."""

    config: int
    rows: int
    keys: int
    threads: int
    smem_bytes: int
    num_regs: int
    local_bytes: int
    blocks_per_sm: int


class PrefillLibrary(NativeLibrary):
    """A loaded prefill library with typed entry points; ``mma`` is its matrix-tile layer."""

    FAMILY = PREFILL
    VERIFY_KIND = "native_prefill"
    FUNCTIONS = {
        "attn_prefill_mma": (ctypes.c_int, []),
        "attn_prefill": (ctypes.c_int, [ctypes.POINTER(PrefillArgs), ctypes.c_void_p]),
        "attn_prefill_config_info": (
            ctypes.c_int, [ctypes.c_int] * 4 + [ctypes.POINTER(PrefillConfigInfo)],
        ),
    }  # fmt: skip

    def __init__(self, path) -> None:
        super().__init__(path)
        kinds = {v: k for k, v in PREFILL_MMA_KINDS.items()}
        self.mma = kinds[self._lib.attn_prefill_mma()]

    def launch(self, args: ctypes.Structure, stream: int) -> None:
        """Launch one call on ``stream`` (a ``cudaStream_t`` as an int)."""
        rc = self._lib.attn_prefill(ctypes.byref(args), ctypes.c_void_p(stream))
        self.check(rc, "native prefill launch")

    def config_facts(
        self, config: int, query_kind: int, cache_kind: int, head_bucket: int
    ) -> Optional[ConfigFacts]:
        """Resources of one kernel, or None where this library has none for the combination."""
        info = PrefillConfigInfo()
        rc = self._lib.attn_prefill_config_info(
            config, query_kind, cache_kind, head_bucket, ctypes.byref(info)
        )
        self.check(rc, "config_info")
        if not info.available:
            return None
        return ConfigFacts(
            config,
            info.rows,
            info.keys,
            info.threads,
            info.smem_bytes,
            info.num_regs,
            info.local_bytes,
            info.blocks_per_sm,
        )

    def probe(self) -> None:
        # asking a kernel's attributes fails where the library has no code for the device
        self.config_facts(ps.CONFIG_32K, abi.FLOAT16, abi.FLOAT16, 64)


def device_launch(
    lib: PrefillLibrary,
    device: torch.device,
    *,
    query_dtype: torch.dtype,
    kv_cache_dtype: str,
    num_seqs: int,
    num_tokens: int,
    num_heads: int,
    num_kv_heads: int,
    head_size: int,
    max_query_len: int,
    max_context_len: int,
    num_splits: Optional[int] = None,
) -> ps.PrefillLaunch:
    """The launch :mod:`attn_core.runtime.resolve` fits a plan to once it holds the library:
    the large tile where the device lets a block opt in to the library's own shared-memory
    figure for it, and :func:`~attn_core.native.split.prefill_split` from the SM count and the
    kernel's occupancy as the driver reports them (``num_splits`` forces the split)."""
    qk = abi.QUERY_KINDS[query_dtype]
    ck = abi.cache_kind(query_dtype, kv_cache_dtype)
    bucket = abi.head_bucket(head_size)
    props = torch.cuda.get_device_properties(device)
    large = lib.config_facts(ps.CONFIG_LARGE, qk, ck, bucket)
    optin = getattr(props, "shared_memory_per_block_optin", 48 << 10)
    group = num_heads // num_kv_heads
    config = ps.CONFIG_32K
    if large is not None and group <= ps.CONFIG_TILES[ps.CONFIG_LARGE][0]:
        config = ps.choose_config(optin, large.smem_bytes)
    facts = lib.config_facts(config, qk, ck, bucket)
    if facts is None:
        raise ValueError(
            f"the {lib.mma} prefill library has no kernel for config {config}, {query_dtype}, "
            f"kv_cache_dtype={kv_cache_dtype!r}, head bucket {bucket}"
        )
    if num_splits is None:
        num_splits = ps.prefill_split(
            props.multi_processor_count,
            max(1, facts.blocks_per_sm),
            ps.query_tiles(config, group, max_query_len) * num_seqs * num_kv_heads,
            ps.key_tiles(config, max_context_len, max_query_len),
            workspace_per_split=ps.workspace_bytes(2, num_tokens, num_heads, head_size) // 2,
        )
    return ps.prefill_launch(
        config, group, num_tokens, num_heads, head_size, max_query_len, num_splits
    )


def layout_supported(call: Any) -> Optional[str]:
    """None if the kernel can read the strides of ``call``'s tensors (an object with
    ``query``, ``key``, ``value``, ``key_cache``, ``value_cache`` and ``block_tables``, e.g.
    :class:`attn_core.prefill.problem.Problem`) as they are, else why not. The entry point has
    validated shapes, dtypes and devices; the torch path takes any strides."""
    for name in ("query", "key", "value", "block_tables"):
        strides = getattr(call, name).stride()
        if strides[-1] != 1:
            return f"{name} needs a contiguous last dimension, got strides {strides}"
    for name in ("key_cache", "value_cache"):
        cache = getattr(call, name)
        if cache.shape[0] and not cache[0, 0].is_contiguous():
            return f"{name} must be contiguous below the head axis (vLLM's layout)"
    return None


def launch_prefill(
    lib: PrefillLibrary,
    launch: ps.PrefillLaunch,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_tables: torch.Tensor,
    query_start_loc: torch.Tensor,
    context_lens: torch.Tensor,
    out: torch.Tensor,
    *,
    max_query_len: int,
    scale: float,
    alibi_slopes: Optional[torch.Tensor],
    sliding_window: int,
    kv_cache_dtype: str,
    k_scale: float,
    v_scale: float,
    part_out: Optional[torch.Tensor],
    part_lse: Optional[torch.Tensor],
    stream: Optional[int] = None,
) -> None:
    """Attend a packed chunk over each sequence's paged context and itself; writes ``out``.

    Trusts its caller: shapes, dtypes, devices and strides were validated
    (:func:`attn_core.paged_prefix_prefill`, :func:`layout_supported`) and ``launch`` was made
    for at least these lengths.

    Args:
        launch: the plan's tile configuration and split.
        query / out: ``[num_tokens, num_heads, head_size]`` fp16/bf16; key / value
            ``[num_tokens, num_kv_heads, head_size]`` (the chunk's own K/V).
        key_cache / value_cache: vLLM 0.6.3's layouts (fp8 caches as uint8).
        block_tables: ``[num_seqs, max_blocks]`` int32; query_start_loc ``[num_seqs + 1]`` and
            context_lens ``[num_seqs]``, int32 and contiguous.
        scale: the softmax scale; sliding_window: 0 for none.
        part_out / part_lse: fp32 buffers of :func:`attn_core.native.abi.partials_shapes` of
            ``launch.num_splits`` pieces (None with one split).
        stream: the ``cudaStream_t`` to launch on; None: the query device's current stream.
            (0 on host tensors for a host-emulated library: ci/host_emulation.py.)
    """
    num_tokens, num_heads, head_size = query.shape
    fp8 = kv_cache_dtype != "auto"
    args = PrefillArgs(
        out=out.data_ptr(),
        query=query.data_ptr(),
        key=key.data_ptr(),
        value=value.data_ptr(),
        key_cache=key_cache.data_ptr(),
        value_cache=value_cache.data_ptr(),
        block_tables=block_tables.data_ptr(),
        query_start_loc=query_start_loc.data_ptr(),
        context_lens=context_lens.data_ptr(),
        alibi_slopes=alibi_slopes.data_ptr() if alibi_slopes is not None else None,
        part_out=part_out.data_ptr() if part_out is not None else None,
        part_lse=part_lse.data_ptr() if part_lse is not None else None,
        out_tok_stride=out.stride(0),
        out_head_stride=out.stride(1),
        q_tok_stride=query.stride(0),
        q_head_stride=query.stride(1),
        k_tok_stride=key.stride(0),
        k_head_stride=key.stride(1),
        v_tok_stride=value.stride(0),
        v_head_stride=value.stride(1),
        kc_block_stride=key_cache.stride(0),
        kc_head_stride=key_cache.stride(1),
        vc_block_stride=value_cache.stride(0),
        vc_head_stride=value_cache.stride(1),
        table_stride=block_tables.stride(0),
        num_seqs=context_lens.shape[0],
        num_tokens=num_tokens,
        num_heads=num_heads,
        num_kv_heads=key_cache.shape[1],
        head_size=head_size,
        block_size=key_cache.shape[3],
        table_width=block_tables.shape[1],
        max_query_len=max_query_len,
        num_splits=launch.num_splits,
        sliding_window=sliding_window,
        query_kind=abi.QUERY_KINDS[query.dtype],
        cache_kind=abi.cache_kind(query.dtype, kv_cache_dtype),
        config=launch.config,
        scale=scale,
        k_scale=float(k_scale) if fp8 else 1.0,
        v_scale=float(v_scale) if fp8 else 1.0,
    )
    lib.launch(args, abi.current_stream(query.device) if stream is None else stream)


# ------------------------------------------------------------------ check against the reference
# One check per (device, library, query dtype, cache dtype, head size, block size, GQA group).
# The case: four sequences of mixed contexts and chunks (a single token, block - 1, a chunk
# longer than one query tile), permuted blocks, NaN (fp8: the NaN byte) in every cache slot past
# each context (vLLM has written the chunk's K/V there; the kernel must take them from ``key`` /
# ``value``), outputs NaN-poisoned; run with the device's own split and with three forced splits
# (the log-sum-exp merge), against :func:`attn_core.reference.reference_prefix_prefill`.
# Max |error| on outputs of magnitude < 1 (averages of N(0, 1) values): a few output ulps.
TOLERANCE = {torch.float16: 2e-2, torch.bfloat16: 5e-2}
FORCED_SPLITS = 3


def _check(device: torch.device, config: tuple, lib: PrefillLibrary) -> Verdict:
    _, dtype, kv_cache_dtype, head_size, block_size, group = config
    kv_heads = 2
    seqs = [(37, 21), (block_size - 1, 17), (80, 1), (1, 130)]
    fp8 = kv_cache_dtype != "auto"
    case = make_prefill_case(
        seqs, group * kv_heads, kv_heads, head_size, block_size, dtype, device,
        kv_cache_dtype=kv_cache_dtype, k_scale=0.5 if fp8 else 1.0, v_scale=0.5 if fp8 else 1.0,
    )  # fmt: skip
    want = reference_prefix_prefill(**case.reference_kwargs())
    poison_past_context(case)
    outputs = (
        (f"num_splits={splits or 'planned'}", run_case(lib, case, splits))
        for splits in (None, FORCED_SPLITS)
    )
    return verify_once.max_error_verdict(outputs, want, TOLERANCE[dtype])


verify_once.register(PrefillLibrary.VERIFY_KIND, _check)


def poison_past_context(case: PrefillCase) -> None:
    """NaN (fp8: the NaN byte 0x7F) in every cache slot at or past each sequence's context."""
    bs = case.key_cache.shape[3]
    nan = 0x7F if case.kv_cache_dtype != "auto" else math.nan
    for s, (c, n) in enumerate(
        zip(case.context_lens.tolist(), case.seq_lens.tolist(), strict=True)
    ):
        for pos in range(c, -(-n // bs) * bs):
            block = int(case.block_tables[s, pos // bs])
            case.key_cache[block, :, :, pos % bs, :] = nan
            case.value_cache[block, :, :, pos % bs] = nan


def run_case(
    lib: PrefillLibrary,
    case: PrefillCase,
    splits: Optional[int] = None,
    *,
    launch: Optional[ps.PrefillLaunch] = None,
    scale: Optional[float] = None,
    stream: Optional[int] = None,
) -> torch.Tensor:
    """``case`` through ``lib`` on ``stream`` (default: the current one): with ``launch``, else
    the device's own launch (:func:`device_launch`, ``splits`` forcing its split); ``scale``
    defaults to ``head_size ** -0.5``. ``out`` and the partials start as NaN: the kernel must
    write every output and the merge read only what the splits wrote."""
    query = case.query
    num_tokens, num_heads, head_size = query.shape
    context_lens = case.context_lens.to(torch.int32).contiguous()
    if launch is None:
        launch = device_launch(
            lib, query.device, query_dtype=query.dtype, kv_cache_dtype=case.kv_cache_dtype,
            num_seqs=context_lens.shape[0], num_tokens=num_tokens, num_heads=num_heads,
            num_kv_heads=case.key_cache.shape[1], head_size=head_size,
            max_query_len=case.max_query_len, max_context_len=int(context_lens.max()),
            num_splits=splits,
        )  # fmt: skip
    part_out = part_lse = None
    if launch.num_splits > 1:
        o_shape, l_shape = abi.partials_shapes(num_tokens, num_heads, launch.num_splits, head_size)
        part_out = torch.full(o_shape, math.nan, dtype=torch.float32, device=query.device)
        part_lse = torch.full(l_shape, math.nan, dtype=torch.float32, device=query.device)
    out = torch.full_like(query, math.nan)
    window = case.sliding_window if case.sliding_window and case.sliding_window > 0 else 0
    alibi = case.alibi_slopes.contiguous() if case.alibi_slopes is not None else None
    launch_prefill(
        lib, launch, query, case.key, case.value, case.key_cache, case.value_cache,
        case.block_tables, case.query_start_loc.to(torch.int32).contiguous(), context_lens, out,
        max_query_len=case.max_query_len, scale=head_size**-0.5 if scale is None else scale,
        alibi_slopes=alibi, sliding_window=window, kv_cache_dtype=case.kv_cache_dtype,
        k_scale=case.k_scale, v_scale=case.v_scale, part_out=part_out, part_lse=part_lse,
        stream=stream,
    )  # fmt: skip
    return out
