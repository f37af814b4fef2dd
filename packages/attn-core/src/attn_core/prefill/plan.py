"""Launch plan for chunked prefill over a paged prefix: backend, tiles, streaming, memory.

:func:`plan_prefill` is the single place where prefill's launch decisions are made; the execution
in :mod:`attn_core.runtime.prefill`, the simulator and ``bench/prefill_bench.py`` all read the same
:class:`PrefillPlan`.

How the numbers are chosen (torch backend):

- The cost floor of the torch path is elementwise traffic over the score tile, not the matmuls:
  per score it writes the QK^T result, reads it for the row max, subtracts and exponentiates in
  place and reads it once more for P@V, whose GEMM also yields the row sums (a ones column
  beside V, :data:`attn_core.prefill.gather.SUM_COLUMNS`; a separate sum pass took 2 more
  bytes) - 14 bytes per score at 2-byte scores (:data:`ELEMENTWISE_BYTES_PER_SCORE`). At the
  Qwen3.6 shape (24/4 heads, head 256), 100K context, 8K chunk that is ~21 G scores, 294 GB,
  ~61 ms at the H200's 4.8 TB/s (the bench prints this floor beside the measurement).
- Tile sizes do not change that traffic, so they are chosen to amortise launches (about a dozen
  small torch ops per tile update) under the transient-memory budget: the key tile is the
  plain loop's 4096 keys (the issue's baseline, measured at 327 ms with 13 GB transient), and
  the query tile is the largest power of two whose score tile + running state fit the budget.
  ``bench/prefill_bench.py --sweep`` times other tile pairs on the device; record the result
  here when it moves the choice.
- Scores: fp16 on CUDA for fp16 (tensor-core matmul writes them, and 2-byte scores halve the
  floor above); fp32 for bf16 where the GEMM can write fp32 (bf16's 8-bit significand is too
  coarse for logits, see :func:`_score_dtypes`), at ~2x the elementwise traffic; sums and the
  accumulator are fp32 always. On the CPU everything is fp32: half-precision CPU matmuls are
  slower than fp32 ones (0.069 s vs 0.045 s for a [4, 1536, 256] x [4, 256, 1024] bmm on this
  project's 2-core runners) and torch 2.1's CPU has none for fp16.
- Streaming: the gathered context (K and V in the compute dtype) is bounded by the budget; a
  context larger than that is gathered in chunks of ``stream_chunk`` tokens instead of whole.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Optional, Union

import torch

from attn_core.core.checks import check_type, check_types, check_window
from attn_core.core.plan_types import KernelStep
from attn_core.core.settings import PrefillOverrides
from attn_core.core.shapes import AttentionShape, dtype_from_name
from attn_core.device.capabilities import Capabilities
from attn_core.device.spec import DeviceSpec
from attn_core.prefill.cost import PrefillCost, prefill_work, price
from attn_core.prefill.plan_native import (
    VARIANTS,
    NativePrefillPlan,
    plan_native_prefill,
    unsupported,
)

BACKEND_ENV = "ATTN_CORE_PREFILL_BACKEND"  # named in reasons and errors (settings reads it)
DEFAULT_BUDGET_BYTES = 1 << 30  # the bound on transient memory beyond the context
# Elementwise bytes per score of the torch path with 2-byte scores (module docstring).
ELEMENTWISE_BYTES_PER_SCORE = 14

# The baseline loop used 4096-token key tiles; kept until a device sweep says otherwise.
DEFAULT_KEY_TILE = 4096
MIN_QUERY_TILE = 16  # below this the launches per tile dominate; shrink the key tile instead
MIN_KEY_TILE = 64
# fp32 state per query row and head: acc (head_size) + max, new max, sum, correction.
_STATE_FLOATS_EXTRA = 4


@dataclass(frozen=True)
class PrefillPlan:
    """Every launch decision of one prefill call.

    Attributes:
        backend: "torch" (portable online softmax), "sdpa" (torch's fused flash kernel on the
            gathered context + chunk) or "vendor_flash" (the vendor's varlen flash attention).
        backend_reason: why that backend (the forced env var, a feature the fused one lacks, ...).
        query_tile / key_tile: torch backend's tile sizes in tokens.
        stream_chunk: context tokens gathered at once; 0 means the whole context once per sequence.
        score_dtype: dtype of the score tile (softmax sums and the accumulator are fp32).
        matmul_dtype: dtype of the matmul operands (gathered K/V, query tile, probabilities);
            differs from ``score_dtype`` only for bf16 on CUDA, where QK^T writes fp32 scores.
        pv_dtype: dtype P @ [V | 1] writes (fp32 where the GEMM can write it).
        budget_bytes: bound on transient memory beyond the gathered context.
        cost: the price the choice compared (:mod:`attn_core.prefill.cost`).
        workspace_bytes: what the per-call buffers take (score tile, state, query tile, P@V).
        steps: launches of one (query tile, key tile) update, for the simulator; run
            :meth:`num_tile_updates` times per sequence.
    """

    backend: str
    backend_reason: str
    num_heads: int
    num_kv_heads: int
    head_size: int
    dtype: torch.dtype
    score_dtype: torch.dtype
    matmul_dtype: torch.dtype
    pv_dtype: torch.dtype
    max_query_len: int
    query_tile: int
    key_tile: int
    stream_chunk: int
    budget_bytes: int
    workspace_bytes: int
    device_name: str
    steps: tuple[KernelStep, ...]
    cost: Optional[PrefillCost] = None  # its price (attn_core.prefill.cost); None: not priced

    @property
    def group_size(self) -> int:
        return self.num_heads // self.num_kv_heads

    def num_tile_updates(self, query_len: int, context_len: int) -> int:
        """(query tile, key tile) pairs the torch backend runs for one sequence (causal skip);
        for a fused backend, kernel calls per sequence (parts merged by log-sum-exp)."""
        if self.backend != "torch":
            tiles = _ceil_div(query_len, self.query_tile)
            chunks = _ceil_div(context_len, self.stream_chunk or max(context_len, 1))
            return tiles * (chunks + 1) + max(tiles - 1, 0)
        count = 0
        for q0 in range(0, query_len, self.query_tile):
            last_pos = context_len + min(q0 + self.query_tile, query_len) - 1
            count += _ceil_div(context_len, self.key_tile)
            count += _ceil_div(last_pos + 1 - context_len, self.key_tile)
        return count


@dataclass(frozen=True)
class PrefillLengths:
    """The lengths one prefill call is planned for.

    Attributes:
        max_query_len: the longest chunk of new tokens in the batch (tiles are sized for it).
        max_context_len: the longest cached context; decides streaming unless forced.
        num_seqs: sequences in the batch (the native grid and the prices count them).
        num_tokens: tokens of the packed chunk (sizes the native kernel's partials); 0 means
            ``num_seqs * max_query_len``.
    """

    max_query_len: int
    max_context_len: int = 0
    num_seqs: int = 1
    num_tokens: int = 0

    def __post_init__(self) -> None:
        q, c = self.max_query_len, self.max_context_len
        if isinstance(q, bool) or not isinstance(q, int) or q < 1:
            raise ValueError(f"max_query_len must be a positive int, got {q!r}")
        if isinstance(c, bool) or not isinstance(c, int) or c < 0:
            raise ValueError(f"max_context_len must be a non-negative int, got {c!r}")
        n, t = self.num_seqs, self.num_tokens
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"num_seqs must be a positive int, got {n!r}")
        if isinstance(t, bool) or not isinstance(t, int) or not 0 <= t <= n * q:
            raise ValueError(
                f"num_tokens must be an int in 0..num_seqs * max_query_len = {n * q}, got {t!r}"
            )

    @property
    def tokens(self) -> int:
        """Tokens of the packed chunk (``num_tokens``, or the bound when 0)."""
        return self.num_tokens or self.num_seqs * self.max_query_len


AnyPrefillPlan = Union[PrefillPlan, NativePrefillPlan]
# Overrides only the torch / fused plans understand: a forced native backend with one of them
# contradicts itself, and an unforced plan that has one set keeps to those backends.
PORTABLE_ONLY_OVERRIDES = ("stream", "query_tile", "key_tile", "score_dtype")


def plan_prefill(
    shape: AttentionShape,
    lengths: PrefillLengths,
    spec: DeviceSpec,
    caps: Capabilities,
    overrides: Optional[PrefillOverrides] = None,
    *,
    alibi: bool = False,
    sliding_window: int = 0,
    large_scale: bool = False,
) -> AnyPrefillPlan:
    """Plan one prefill call: a pure function of its arguments (no environment, no kernels).

    Args:
        shape: heads, head size and the compute dtype (the block size does not matter here).
        lengths: the longest query chunk and cached context.
        spec: the device profile the launch grids are sized for.
        caps: what the device's torch can do; ``caps.fused_prefill`` are the fused backends
            the plan may pick (the caller narrows it to verified ones, see
            :mod:`attn_core.prefill.verify`); ``caps.native_prefill`` the native kernel's
            verified MMA variants (the resolver's answer).
        overrides: forced backend, budget, streaming, tiles, score dtype (None: the plan's).
        alibi / sliding_window: features of the call (the fused backends take neither; the
            native kernel takes both).
        large_scale: the call's softmax scale exceeds 1; the torch plan then scores in fp32
            (:func:`large_scale_dtypes`), a forced ``score_dtype`` included. The
            fused and native backends apply the scale in fp32 already.

    The backend is the cheapest (:mod:`attn_core.prefill.cost`) of the torch path, the fused
    backend where the call allows it, and each verified native variant; a forced one is taken
    as asked (a forced ``"native"`` that cannot run raises, naming why). Where the BLAS matrix
    units beat the CUDA-core tile, the torch / fused path stays the default until a matrix
    variant verifies.
    """
    check_types(
        ("shape", shape, AttentionShape), ("lengths", lengths, PrefillLengths),
        ("spec", spec, DeviceSpec), ("caps", caps, Capabilities),
        ("overrides", overrides, PrefillOverrides),
    )  # fmt: skip
    check_type("alibi", alibi, bool, "a bool")
    check_type("large_scale", large_scale, bool, "a bool")
    check_window(sliding_window)
    overrides = overrides if overrides is not None else PrefillOverrides()
    if overrides.native_mma is not None and overrides.backend not in (None, "native"):
        raise ValueError(
            f"overrides.native_mma ({overrides.native_mma!r}, ATTN_CORE_PREFILL_MMA) picks a "
            f"native variant, but overrides.backend ({overrides.backend!r}, "
            "ATTN_CORE_PREFILL_BACKEND) forces another backend: unset one"
        )
    if overrides.backend == "native":
        return _forced_native(shape, lengths, spec, caps, overrides)
    plan = _portable_plan(shape, lengths, spec, caps, overrides, alibi, sliding_window, large_scale)
    if overrides.backend is not None:
        return plan
    native, why = _cheapest_native(shape, lengths, spec, caps, overrides)
    if native is None:
        reason = plan.backend_reason + (f"; native prefill: {why}" if why else "")
        return dataclasses.replace(plan, backend_reason=reason)
    assert plan.cost is not None
    mine, theirs = plan.cost.seconds, native.cost.seconds
    if theirs < mine:
        return dataclasses.replace(
            native,
            backend_reason=f"native {native.variant} (verified here) priced {_ms(theirs)}, "
            f"below {plan.backend} at {_ms(mine)}",
        )
    reason = (
        f"{plan.backend_reason}; priced {_ms(mine)}, at or below the verified native "
        f"{native.variant} at {_ms(theirs)}"
    )
    return dataclasses.replace(plan, backend_reason=reason)


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.3g} ms"


def _native_variants(caps: Capabilities, overrides: PrefillOverrides) -> tuple[str, ...]:
    return tuple(
        v for v in VARIANTS
        if v in caps.native_prefill and overrides.native_mma in (None, v)
    )  # fmt: skip


def _cheapest_native(
    shape: AttentionShape,
    lengths: PrefillLengths,
    spec: DeviceSpec,
    caps: Capabilities,
    overrides: PrefillOverrides,
) -> tuple[Optional[NativePrefillPlan], str]:
    """The cheapest verified native plan, or ``(None, why none)``."""
    portable = [n for n in PORTABLE_ONLY_OVERRIDES if getattr(overrides, n) is not None]
    if portable:
        return None, f"override(s) {', '.join(portable)} are the torch / fused plans'"
    not_here = unsupported(shape, spec)
    if not_here:
        return None, not_here
    variants = _native_variants(caps, overrides)
    if not variants:
        mma = f" ({overrides.native_mma} only)" if overrides.native_mma else ""
        return None, (caps.native_prefill_why or "no verified variant") + mma if (
            caps.native_prefill_why or mma
        ) else ""
    plans = [
        plan_native_prefill(
            shape,
            spec,
            v,
            num_seqs=lengths.num_seqs,
            num_tokens=lengths.tokens,
            max_query_len=lengths.max_query_len,
            max_context_len=lengths.max_context_len,
        )  # fmt: skip
        for v in variants
    ]
    return min(plans, key=lambda p: p.cost.seconds), ""


def _forced_native(
    shape: AttentionShape,
    lengths: PrefillLengths,
    spec: DeviceSpec,
    caps: Capabilities,
    overrides: PrefillOverrides,
) -> NativePrefillPlan:
    asked = f"prefill backend 'native' (forced by {BACKEND_ENV} / backend=)"
    portable = [n for n in PORTABLE_ONLY_OVERRIDES if getattr(overrides, n) is not None]
    if portable:
        raise ValueError(
            f"{asked} contradicts the torch / fused override(s) {', '.join(portable)}: drop one"
        )
    not_here = unsupported(shape, spec)
    if not_here:
        raise ValueError(f"{asked} cannot serve this call: {not_here}")
    variants = _native_variants(caps, overrides)
    if not variants:
        mma = f" (ATTN_CORE_PREFILL_MMA={overrides.native_mma})" if overrides.native_mma else ""
        raise ValueError(
            f"{asked}, but no MMA variant{mma} is built and verified here: "
            f"{caps.native_prefill_why or 'not checked'} (python -m attn_core.native status)"
        )
    plan, _ = _cheapest_native(shape, lengths, spec, caps, overrides)
    assert plan is not None
    reason = f"{asked}; {plan.variant} verified here, priced {_ms(plan.cost.seconds)}"
    return dataclasses.replace(plan, backend_reason=reason)


def _portable_plan(
    shape: AttentionShape,
    lengths: PrefillLengths,
    spec: DeviceSpec,
    caps: Capabilities,
    overrides: PrefillOverrides,
    alibi: bool,
    sliding_window: int,
    large_scale: bool,
) -> PrefillPlan:
    """The torch or fused plan (the cheaper of the two where the fused one may run)."""
    dtype, head_size = shape.dtype, shape.head_size
    budget = overrides.budget_bytes or DEFAULT_BUDGET_BYTES
    forced_scores = dtype_from_name(overrides.score_dtype) if overrides.score_dtype else None
    matmul_dtype, score_dtype = _score_dtypes(dtype, caps, forced_scores)
    pv_dtype = _pv_dtype(matmul_dtype, caps)
    if large_scale:  # before the tiles are sized: fp32 scores take twice the bytes
        matmul_dtype, score_dtype, pv_dtype = large_scale_dtypes(
            matmul_dtype, score_dtype, pv_dtype
        )
    chosen, reason = _choose_backend(overrides.backend, caps, dtype, alibi, sliding_window)
    sizing = _TileSizing(
        shape.num_heads,
        head_size,
        shape.element_size,
        score_bytes=torch.empty((), dtype=score_dtype).element_size(),
        operand_bytes=torch.empty((), dtype=matmul_dtype).element_size(),
        separate_probs=matmul_dtype != score_dtype,
        alibi=alibi,
    )
    fused = None
    if chosen != "torch":
        fused = _priced(
            _fused_plan(chosen, reason, shape, lengths, overrides, sizing, budget, spec), shape,
            lengths, spec,
        )  # fmt: skip
        if overrides.backend is not None:
            return fused
        reason = f"{chosen} priced above the torch path ({_ms(fused.cost.seconds)})"  # type: ignore[union-attr]
    tk = overrides.key_tile if overrides.key_tile is not None else DEFAULT_KEY_TILE
    tq = overrides.query_tile or sizing.query_tile(tk, lengths.max_query_len, budget)
    if overrides.query_tile is None and overrides.key_tile is None:
        while tq < min(MIN_QUERY_TILE, lengths.max_query_len) and tk > MIN_KEY_TILE:
            tk //= 2
            tq = sizing.query_tile(tk, lengths.max_query_len, budget)
    stream_chunk = _stream_chunk(
        overrides.stream, lengths.max_context_len, shape.num_kv_heads, head_size,
        shape.element_size, budget, tk,
    )  # fmt: skip
    torch_plan = PrefillPlan(
        backend="torch",
        backend_reason=reason,
        **_call_fields(shape, lengths, spec),
        score_dtype=score_dtype,
        matmul_dtype=matmul_dtype,
        pv_dtype=pv_dtype,
        query_tile=tq,
        key_tile=tk,
        stream_chunk=stream_chunk,
        budget_bytes=budget,
        workspace_bytes=sizing.bytes(tq, tk),
        steps=_tile_steps(spec, shape.num_kv_heads, shape.group, head_size, tq, tk, alibi=alibi),
    )
    torch_plan = _priced(torch_plan, shape, lengths, spec)
    if fused is not None and fused.cost.seconds <= torch_plan.cost.seconds:  # type: ignore[union-attr]
        return fused
    return torch_plan


def _call_fields(
    shape: AttentionShape, lengths: PrefillLengths, spec: DeviceSpec
) -> dict[str, Any]:
    """The :class:`PrefillPlan` fields every backend's plan copies from the call: the layer's
    sizes and dtype, the longest query, the device."""
    layer = {
        name: getattr(shape, name) for name in ("num_heads", "num_kv_heads", "head_size", "dtype")
    }
    return {**layer, "max_query_len": lengths.max_query_len, "device_name": spec.name}


def _priced(
    plan: PrefillPlan, shape: AttentionShape, lengths: PrefillLengths, spec: DeviceSpec
) -> PrefillPlan:
    """``plan`` with its price: the torch path launches its steps once per tile update; a
    fused backend its kernel once per call of its loop."""
    work = prefill_work(shape, lengths.num_seqs, lengths.max_query_len, lengths.max_context_len)
    updates = plan.num_tile_updates(lengths.max_query_len, lengths.max_context_len)
    launches = lengths.num_seqs * updates * len(plan.steps)
    return dataclasses.replace(plan, cost=price(plan.backend, work, spec, launches=launches))


@dataclass(frozen=True)
class _TileSizing:
    """Bytes of the per-call buffers for a (query tile, key tile) pair."""

    num_heads: int
    head_size: int
    elem: int  # the compute dtype's (fused backends)
    score_bytes: int
    operand_bytes: int  # the matmul operands' (torch backend)
    separate_probs: bool  # fp32 scores with a 2-byte copy of the probabilities for P@V
    alibi: bool = False  # an fp32 [tq, tk] key - query distance tile (prefill_torch._add_alibi)

    def bytes(self, tq: int, tk: int) -> int:
        rows = self.num_heads * tq
        per_score = self.score_bytes + (self.operand_bytes if self.separate_probs else 0)
        scores = rows * tk * per_score
        state = rows * (self.head_size + _STATE_FLOATS_EXTRA) * 4
        # query tile + P @ [V | 1] (8 extra columns, fp32 where the GEMM can write it)
        query_and_pv = rows * self.head_size * self.operand_bytes + rows * (self.head_size + 8) * 4
        masks = 3 * tq * tk  # bool temporaries of a causal / window mask (shared by all heads)
        # fp32 distances (+ a score-dtype copy) and positions
        alibi = (4 + self.score_bytes) * tq * tk + 4 * (tq + 2 * tk) if self.alibi else 0
        return scores + state + query_and_pv + masks + alibi + rows * self.score_bytes

    def fused_bytes(self, tq: int) -> int:
        """Fused path: fp32 merged output + one part's fp32 output and the kernel's own output,
        the folded query copy and the causal block's K/V expanded to every query head."""
        rows = self.num_heads * tq
        return rows * self.head_size * (4 + 4 + self.elem + self.elem + 2 * self.elem) + rows * 12

    def query_tile(self, tk: int, max_query_len: int, budget: int) -> int:
        """Largest power of two (capped at the chunk, rounded up) whose buffers fit the budget."""
        return _largest_pow2(max_query_len, lambda tq: self.bytes(tq, tk) <= budget)


def _largest_pow2(max_query_len: int, fits) -> int:
    tq = 1 << max(0, (max_query_len - 1).bit_length())
    while tq > 1 and not fits(tq):
        tq //= 2
    return tq


def _fused_plan(
    backend: str,
    reason: str,
    shape: AttentionShape,
    lengths: PrefillLengths,
    overrides: PrefillOverrides,
    sizing: _TileSizing,
    budget: int,
    spec: DeviceSpec,
) -> PrefillPlan:
    """A fused backend tiles keys inside its kernel; the plan tiles queries (merge state) and
    decides streaming; ``key_tile`` is 0."""
    tq = overrides.query_tile or _largest_pow2(
        lengths.max_query_len, lambda t: sizing.fused_bytes(t) <= budget
    )
    stream_chunk = _stream_chunk(
        overrides.stream, lengths.max_context_len, shape.num_kv_heads, shape.head_size,
        sizing.elem, budget, DEFAULT_KEY_TILE,
    )  # fmt: skip
    # The kernel's own grid: 128-query blocks per head (flash-attention's forward tiling).
    kernel = KernelStep("prefill_fused_attention", (_ceil_div(tq, 128), shape.num_heads, 1), 128, 0)
    return PrefillPlan(
        backend=backend,
        backend_reason=reason,
        **_call_fields(shape, lengths, spec),
        score_dtype=torch.float32,
        matmul_dtype=shape.dtype,
        pv_dtype=torch.float32,
        query_tile=tq,
        key_tile=0,
        stream_chunk=stream_chunk,
        budget_bytes=budget,
        workspace_bytes=sizing.fused_bytes(tq),
        steps=(kernel,),
    )


def _score_dtypes(
    dtype: torch.dtype, caps: Capabilities, forced: Optional[torch.dtype]
) -> tuple[torch.dtype, torch.dtype]:
    """``(matmul_dtype, score_dtype)`` of the torch backend.

    - CPU: fp32 for both (fp32 CPU matmuls are the fast ones, see the module docstring).
    - GPU fp16: fp16 for both. 2-byte scores halve the elementwise floor; fp16's 11-bit
      significand keeps a logit of 30 within 0.008 (0.8 % on its weight).
    - GPU bf16: bf16 operands, fp32 scores where ``caps.bmm_writes_fp32`` (recent torch):
      bf16's 8-bit significand would put a logit of 30 off by up to 0.06 (6 % on its weight).
      Without it (torch 2.1), bf16 scores, and that error stands.
    ``forced`` (tests, sweeps) sets both. A scale > 1 then takes :func:`large_scale_dtypes`.
    """
    if forced is not None:
        return forced, forced
    if dtype == torch.float32 or caps.device_type not in ("cuda", "meta"):
        return torch.float32, torch.float32
    if dtype == torch.bfloat16 and caps.bmm_writes_fp32:
        return dtype, torch.float32
    return dtype, dtype


def large_scale_dtypes(
    matmul_dtype: torch.dtype, score_dtype: torch.dtype, pv_dtype: torch.dtype
) -> tuple[torch.dtype, torch.dtype, torch.dtype]:
    """``(matmul, score, pv)`` dtypes of the torch backend for a softmax ``scale > 1``.

    A 2-byte score tile holds logits up to 65504; with ``scale = 65536`` a logit of 1 is
    already inf and the softmax NaN where the float64 reference is finite. Scales
    <= 1 cannot push a logit past the unscaled product, so only ``scale > 1`` gets fp32 scores
    (:mod:`attn_core.prefill.torch_path` then applies the scale to them), at twice the score
    tile's bytes: such scales are far from any model's ``1 / sqrt(head_size)``. Where the GEMM
    writes fp32 from the 2-byte operands (``pv_dtype`` fp32 says so) the operands stay 2-byte;
    otherwise everything is fp32. The planner applies this before sizing tiles; the entry point
    applies it to a caller's plan made without ``large_scale``.
    """
    f32 = torch.float32
    if score_dtype == f32:
        return matmul_dtype, score_dtype, pv_dtype
    if pv_dtype == f32:
        return matmul_dtype, f32, f32
    return f32, f32, f32


def _pv_dtype(matmul_dtype: torch.dtype, caps: Capabilities) -> torch.dtype:
    """P @ [V | 1]'s output: fp32 where the GEMM can write it (the row sums then carry no
    2-byte rounding; ``[rows, hs + 8]`` is small beside the score tile)."""
    if matmul_dtype != torch.float32 and caps.device_type == "cuda" and caps.bmm_writes_fp32:
        return torch.float32
    return matmul_dtype


def _choose_backend(
    forced: Optional[str],
    caps: Capabilities,
    dtype: torch.dtype,
    alibi: bool,
    sliding_window: int,
) -> tuple[str, str]:
    """Backend name and the reason; a forced fused backend is checked where it runs."""
    if forced is not None:
        if forced != "torch" and (alibi or sliding_window):
            raise ValueError(
                f"prefill backend {forced!r} (forced by {BACKEND_ENV} / PrefillOverrides.backend) "
                f"supports neither alibi nor sliding_window; got alibi={alibi}, "
                f"sliding_window={sliding_window}"
            )
        return forced, f"forced by {BACKEND_ENV} / PrefillOverrides.backend"
    if alibi:
        return "torch", "alibi: the fused kernels take no ALiBi bias"
    if sliding_window:
        return "torch", "sliding_window: the fused formulation has no window mask"
    if not caps.fused_prefill:
        return "torch", f"no fused backend on {caps.device_type} for {dtype}"
    return caps.fused_prefill[0], "fused backend for this device (verified against the reference)"


def _stream_chunk(
    stream: Optional[bool],
    max_context_len: int,
    num_kv_heads: int,
    head_size: int,
    elem: int,
    budget: int,
    key_tile: int,
) -> int:
    per_token = 2 * num_kv_heads * head_size * elem  # gathered K and V
    if stream is None:
        stream = max_context_len * per_token > budget
    if not stream:
        return 0
    chunk = max(key_tile, (budget // per_token) // key_tile * key_tile)
    return chunk


def _tile_steps(
    spec: DeviceSpec,
    kv_heads: int,
    group: int,
    head_size: int,
    tq: int,
    tk: int,
    alibi: bool = False,
) -> tuple[KernelStep, ...]:
    """One tile update as launches: two batched GEMMs and the elementwise softmax update.

    GEMM grids use 128x128 output tiles (the common tensor-core CTA tile) staging up to 32 KiB
    of operands in shared memory (less where the device's per-block budget is smaller);
    elementwise grids one thread per 4 elements at the device's max block size.
    """
    rows = group * tq
    threads = spec.max_threads_per_block
    smem = min(32 * 1024, spec.shared_mem_per_block - spec.shared_mem_reserved_per_block)

    def gemm(name: str, m: int, n: int) -> KernelStep:
        return KernelStep(name, (_ceil_div(m, 128), _ceil_div(n, 128), kv_heads), 256, smem)

    def elementwise(name: str, n: int) -> KernelStep:
        return KernelStep(name, (_ceil_div(n, threads * 4), 1, 1), threads, 0)

    scores = kv_heads * rows * tk
    bias = (elementwise("prefill_alibi_dist", tq * tk), elementwise("prefill_alibi", scores))
    return (
        gemm("prefill_qk", rows, tk),
        *(bias if alibi else ()),
        elementwise("prefill_row_max", scores),
        elementwise("prefill_sub_max", scores),
        elementwise("prefill_exp", scores),
        gemm("prefill_pv", rows, head_size + 8),  # + the row sums (prefill_gather.SUM_COLUMNS)
        elementwise("prefill_rescale_acc", kv_heads * rows * head_size),
    )


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)
