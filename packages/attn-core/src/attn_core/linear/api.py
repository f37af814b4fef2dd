"""Public entry points of the linear-attention layers, flash-linear-attention and vLLM
compatible: :func:`chunk_gated_delta_rule`, :func:`fused_recurrent_gated_delta_rule`,
:func:`gated_delta_decode`, :func:`causal_conv1d_fn`, :func:`causal_conv1d_update`.

Each validates (:mod:`.inputs`; see there which checks read values and when), plans where a
plan decides anything (:mod:`.plan`), and runs an executor: ``backend=`` (:mod:`.backend`)
picks the native Gated DeltaNet library (decode step, convolutions) or the torch path. Nothing
is written outside the returned outputs, ``out=`` and the named state slots.
"""

from __future__ import annotations

from typing import Optional

import torch

from attn_core.core import verify_once
from attn_core.core.checks import (
    ArgumentTypeError,
    check_out,
    check_tensor,
    resolve_scale,
    type_name,
    value_checks_enabled,
)
from attn_core.core.workspace import is_capturing
from attn_core.linear.backend import check_linear_backend, native_library
from attn_core.linear.chunked import run_chunked
from attn_core.linear.conv import conv_step, conv_varlen
from attn_core.linear.inputs import (
    FLOATS,
    INDEX_DTYPES,
    GatedDeltaInputs,
    check_flag,
    check_gates,
    check_heads_divide,
    check_offsets,
    check_slots,
    gated_delta_inputs,
)
from attn_core.linear.plan import GatedDeltaPlan, plan_gated_delta
from attn_core.linear.recurrent import recurrent_step, run_recurrent
from attn_core.linear.slots import (
    check_pad_slot_id,
    gather_slots,
    pad_as_negative,
    scatter_slots,
    zero_padded,
    zero_padded_tokens,
)
from attn_core.native.gated_delta import (
    GatedDeltaLibrary,
    LinearShape,
    conv_shape,
    conv_supported,
    decode_supported,
    host_to_device,
    launch_chunk_parallel_prefill,
    launch_conv_prefill,
    launch_conv_update,
    launch_decode,
    launch_recurrent_prefill,
    pair16_reads,
    prefill_supported,
)
from attn_core.native.split import native_prefill_kernel

ACTIVATIONS = (None, "silu", "swish")


def chunk_gated_delta_rule(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    scale: Optional[float] = None,
    initial_state: Optional[torch.Tensor] = None,
    output_final_state: bool = False,
    cu_seqlens: Optional[torch.Tensor] = None,
    use_qk_l2norm_in_kernel: bool = False,
    plan: Optional[GatedDeltaPlan] = None,
    backend: Optional[str] = None,
) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
    """The gated delta rule over whole sequences (prefill), in 64-token chunks.

    Args:
        q, k: ``[B, T, H, K]``, fp16/bf16/fp32.
        v: ``[B, T, HV, V]``, q's dtype; ``HV`` a multiple of ``H`` (value head ``h`` reads key
            head ``h // (HV // H)``).
        g: ``[B, T, HV]`` log decay (finite, <= 0); beta: ``[B, T, HV]``.
        scale: query scale, default ``K ** -0.5``.
        initial_state: ``[N, HV, K, V]`` fp32 or None (zeros); N = B, or the number of
            sequences of ``cu_seqlens``.
        output_final_state: also return the state after each sequence.
        cu_seqlens: ``[N + 1]`` int32/int64 token offsets (from 0 to T, never decreasing) of
            the sequences packed in a ``B == 1`` batch, on the CPU or q's device; read on the host.
        use_qk_l2norm_in_kernel: l2-normalise q and k over K first (``eps = 1e-6``).
        plan: segment sizes (default :func:`plan_gated_delta` for these shapes, 512 MiB).
        backend: None (native where ready, :mod:`attn_core.linear.backend`), ``"torch"`` or
            ``"native"`` (K 64 or 128, V a multiple of 32; ``plan`` sizes the torch path only):
            few sequences take the chunk-parallel kernels (64-token chunks, a 64 MiB
            workspace), many the fused 16-token kernel
            (:func:`attn_core.native.split.native_prefill_kernel`).

    Returns:
        ``(o [B, T, HV, V] in v's dtype, final_state [N, HV, K, V] fp32 or None)``.
    """
    chosen = check_linear_backend(backend)
    inputs = gated_delta_inputs(q, k, v, g, beta, scale, initial_state, cu_seqlens,
                                use_qk_l2norm_in_kernel)  # fmt: skip
    want_final = check_flag("output_final_state", output_final_state)
    lib = _native_prefill_library(chosen, "chunk_gated_delta_rule", inputs, q.dtype)
    if lib is not None:
        return _native_prefill(lib, inputs, v, want_final, chunked=True)
    inputs.gates.settle()
    if plan is None:
        h, hv = inputs.num_heads, inputs.num_value_heads
        plan = plan_gated_delta(h, hv, q.shape[3], v.shape[3], q.element_size())
    elif not isinstance(plan, GatedDeltaPlan):
        raise ArgumentTypeError(f"plan must be None or a GatedDeltaPlan, got {type_name(plan)}")
    out = torch.empty(inputs.v.shape, dtype=v.dtype, device=v.device)
    final = run_chunked(plan, inputs, out, want_final)
    return out.view(v.shape), final


def fused_recurrent_gated_delta_rule(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: Optional[torch.Tensor] = None,
    beta: Optional[torch.Tensor] = None,
    scale: Optional[float] = None,
    initial_state: Optional[torch.Tensor] = None,
    output_final_state: bool = False,
    cu_seqlens: Optional[torch.Tensor] = None,
    use_qk_l2norm_in_kernel: bool = False,
    backend: Optional[str] = None,
) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
    """The gated delta rule token by token; same arguments and results as
    :func:`chunk_gated_delta_rule` (``g`` None: no decay; ``beta`` None: ones). One launch
    group per token on the torch path: meant for few tokens (decode, speculative verification).

    ``backend``: None (native where ready, :mod:`attn_core.linear.backend`), ``"torch"`` or
    ``"native"``: one launch for every sequence, each block walking its sequence's tokens with
    its slice of the state on chip (K 64 or 128, V a multiple of 32)."""
    chosen = check_linear_backend(backend)
    check_tensor("v", v, ndim=4, dtype=FLOATS)
    if g is None:
        g = torch.zeros(v.shape[:3], dtype=torch.float32, device=v.device)
    if beta is None:
        beta = torch.ones(v.shape[:3], dtype=torch.float32, device=v.device)
    x = gated_delta_inputs(q, k, v, g, beta, scale, initial_state, cu_seqlens,
                           use_qk_l2norm_in_kernel)  # fmt: skip
    want_final = check_flag("output_final_state", output_final_state)
    lib = _native_prefill_library(chosen, "fused_recurrent_gated_delta_rule", x, q.dtype)
    if lib is not None:  # before the torch path's outputs: the native path allocates its own
        return _native_prefill(lib, x, v, want_final, chunked=False)
    x.gates.settle()
    hv, dk, dv = x.num_value_heads, x.q.shape[2], x.v.shape[2]
    out = torch.empty(x.v.shape, dtype=v.dtype, device=v.device)
    n = len(x.lengths)
    final = torch.empty(n, hv, dk, dv, device=v.device) if want_final else None
    if cu_seqlens is None:  # B sequences of T tokens: one batched step per token
        state = _start_states(x.initial_state, n, hv, dk, dv, v.device)
        shape = (n, x.tokens)
        run_recurrent(
            state, x.q.view(*shape, -1, dk), x.k.view(*shape, -1, dk), x.v.view(*shape, hv, dv),
            x.g.view(*shape, hv), x.beta.view(*shape, hv), x.scale, x.l2norm,
            out.view(*shape, hv, dv),
        )  # fmt: skip
        if final is not None:
            final.copy_(state)
    else:
        for s, (a, length) in enumerate(zip(x.starts, x.lengths, strict=True)):
            init = None if x.initial_state is None else x.initial_state[s : s + 1]
            state = _start_states(init, 1, hv, dk, dv, v.device)
            b = a + length
            run_recurrent(
                state, x.q[None, a:b], x.k[None, a:b], x.v[None, a:b], x.g[None, a:b],
                x.beta[None, a:b], x.scale, x.l2norm, out[None, a:b],
            )  # fmt: skip
            if final is not None:
                final[s] = state[0]
    return out.view(v.shape), final


def _native_prefill_library(
    backend: Optional[str], entry: str, x: GatedDeltaInputs, dtype: torch.dtype
) -> Optional[GatedDeltaLibrary]:
    key = LinearShape(x.num_heads, x.num_value_heads, x.q.shape[2], x.v.shape[2], dtype)
    why = prefill_supported(x.q, x.k, x.v, len(x.lengths))
    return native_library(backend, entry, x.v.device, key, why)


def _native_prefill(
    lib: GatedDeltaLibrary, x: GatedDeltaInputs, v: torch.Tensor, want_final: bool, chunked: bool
) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
    """Every sequence in one native launch: ``(o in v's shape, final states or None)``; the
    gate checks settle after the launch (:mod:`.inputs`)."""
    hv, dk, dv = x.num_value_heads, x.q.shape[2], x.v.shape[2]
    out = torch.empty(x.v.shape, dtype=v.dtype, device=v.device)
    final = torch.empty(len(x.lengths), hv, dk, dv, device=v.device) if want_final else None
    init = None if x.initial_state is None else x.initial_state.contiguous()
    pair = _chunk_parallel_pair(lib, x, v) if chunked else None
    if pair is not None:
        launch_chunk_parallel_prefill(
            lib, x.q, x.k, x.v, x.g, x.beta, x.lengths, out, scale=x.scale, l2norm=x.l2norm,
            initial_state=init, final_state=final, operands16=pair == "pair16",
        )  # fmt: skip
    else:
        bounds = host_to_device([*x.starts, x.starts[-1] + x.lengths[-1]], v.device)
        launch_recurrent_prefill(
            lib, x.q, x.k, x.v, x.g, x.beta, bounds, out, scale=x.scale, l2norm=x.l2norm,
            initial_state=init, final_state=final, chunked=chunked,
        )  # fmt: skip
    x.gates.settle()
    return out.view(v.shape), final


def _chunk_parallel_pair(
    lib: GatedDeltaLibrary, x: GatedDeltaInputs, v: torch.Tensor
) -> Optional[str]:
    """Which chunk-parallel pair serves this chunked prefill: ``"pair16"`` (16-bit operands on
    the matrix unit) wherever the library has it for these inputs and it passed its own check
    here (the plan then picks it at any batch); else ``"pair"`` (fp32) where the plan picks the
    chunk-parallel form for this device and that pair passed its check; None: the fused
    kernel (verified with the family)."""
    sms = torch.cuda.get_device_properties(v.device).multi_processor_count
    hv, dk, dv = x.num_value_heads, x.q.shape[2], x.v.shape[2]
    config = lib.verify_config(LinearShape(x.num_heads, hv, dk, dv, v.dtype))
    pair16 = (
        lib.has_pair16(dk, dv, v.dtype)
        and pair16_reads(x.q, x.k, x.v)
        and verify_once.verdict(GatedDeltaLibrary.PARALLEL16_VERIFY_KIND, v.device, config, lib).ok
    )
    if native_prefill_kernel(len(x.lengths), hv, dv, sms, pair16) != "chunk_parallel":
        return None
    if pair16:
        return "pair16"
    kind = GatedDeltaLibrary.PARALLEL_VERIFY_KIND
    return "pair" if verify_once.verdict(kind, v.device, config, lib).ok else None


def _start_states(
    initial: Optional[torch.Tensor], n: int, hv: int, dk: int, dv: int, device: torch.device
) -> torch.Tensor:
    if initial is None:
        return torch.zeros(n, hv, dk, dv, device=device)
    return initial.clone(memory_format=torch.contiguous_format)


def gated_delta_decode(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    state_pool: torch.Tensor,
    state_indices: torch.Tensor,
    scale: Optional[float] = None,
    use_qk_l2norm_in_kernel: bool = False,
    out: Optional[torch.Tensor] = None,
    backend: Optional[str] = None,
) -> torch.Tensor:
    """One decode token per sequence against states kept in a pool (vLLM's Mamba-style cache).

    Args:
        q, k: ``[N, H, K]``; v: ``[N, HV, V]`` (q's dtype); g, beta: ``[N, HV]``.
        state_pool: ``[slots, HV, K, V]`` fp32; rows ``state_indices`` are read and updated in
            place, no other row is touched.
        state_indices: ``[N]`` int32/int64, distinct, in ``[0, slots)``; a negative one is a
            padding entry (vLLM's ``PAD_SLOT_ID = -1`` in a CUDA-graph batch): the pool is not
            touched for it and its output is zeros, on every backend. Checked only with
            ``ATTN_CORE_CHECKS=1`` outside graph capture (it reads values); unchecked, an index
            past the pool is treated as padding and a repeated one keeps one of its writes.
        out: ``[N, HV, V]`` in v's dtype, or None (allocated).
        backend: None (native where ready, :mod:`attn_core.linear.backend`), ``"torch"`` or
            ``"native"``. The native kernel serves K 64 or 128 and V a multiple of 32 with
            contiguous last dimensions, and a pool of any strides (a key-last ``[.., V, K]``
            pool's transposed view, slots padded apart as a serving cache's pages are); it
            reads and writes each state element once, in place.

    No host sync, no data-dependent shape: capturable in a CUDA graph (the native launch on
    the current stream; torch: ``index_select`` / ``index_copy_`` on the pool).

    Returns:
        ``out``: ``[N, HV, V]``.
    """
    check_tensor("q", q, ndim=3, dtype=FLOATS)
    n, h, dk = q.shape
    dev = q.device
    check_tensor("k", k, shape=(n, h, dk), dtype=q.dtype, device=dev)
    check_tensor("v", v, ndim=3, dtype=q.dtype, device=dev)
    check_tensor("v", v, shape=(n, None, None))
    hv, dv = v.shape[1], v.shape[2]
    check_heads_divide(h, hv)
    check_tensor("g", g, shape=(n, hv), dtype=FLOATS, device=dev)
    check_tensor("beta", beta, shape=(n, hv), dtype=FLOATS, device=dev)
    check_tensor("state_pool", state_pool, ndim=4, dtype=torch.float32, device=dev)
    check_tensor("state_pool", state_pool, shape=(None, hv, dk, dv))
    check_tensor("state_indices", state_indices, shape=(n,), dtype=INDEX_DTYPES, device=dev)
    l2 = check_flag("use_qk_l2norm_in_kernel", use_qk_l2norm_in_kernel)
    chosen = check_linear_backend(backend)
    resolved = resolve_scale(scale, dk)
    if out is None:
        out = torch.empty(n, hv, dv, dtype=v.dtype, device=dev)
    else:
        check_out(out, (n, hv, dv), v.dtype, dev)
    if value_checks_enabled() and not is_capturing(dev):
        check_slots("state_indices", state_indices, state_pool.shape[0])
        check_gates(g, beta)
    if n == 0:
        return out
    why = decode_supported(q, k, v, state_pool, out)
    shape = LinearShape(h, hv, dk, dv, q.dtype)
    lib = native_library(chosen, "gated_delta_decode", dev, shape, why)
    if lib is not None:
        launch_decode(lib, q, k, v, g, beta, state_pool, state_indices, out, scale=resolved,
                      l2norm=l2)  # fmt: skip
        return out
    state, valid, safe = gather_slots(state_pool, state_indices)
    o = recurrent_step(state, q, k, v, g, beta, resolved, l2)
    scatter_slots(state_pool, safe, valid, state)
    out.copy_(zero_padded(o, valid))
    return out


def _check_activation(activation: object) -> Optional[str]:
    """None, "silu" or "swish"; vLLM's True / False stand for "silu" / None."""
    if isinstance(activation, bool):
        return "silu" if activation else None
    if not (activation is None or (isinstance(activation, str) and activation in ACTIVATIONS)):
        raise ValueError(
            f"activation must be None, 'silu', 'swish', True or False, got {activation!r}"
        )
    return activation


def _check_conv_weights(weight: object, bias: object, dim: int, dev: torch.device) -> int:
    check_tensor("weight", weight, ndim=2, dtype=FLOATS, device=dev)
    assert isinstance(weight, torch.Tensor)
    check_tensor("weight", weight, shape=(dim, None))
    if weight.shape[1] < 2:
        raise ValueError(f"weight's width (dimension 1) must be >= 2, got {weight.shape[1]}")
    if bias is not None:
        check_tensor("bias", bias, shape=(dim,), dtype=FLOATS, device=dev)
    return weight.shape[1]


def _check_state(name: str, state: object, dim: int, width: int, dev: torch.device) -> None:
    check_tensor(name, state, ndim=3, dtype=FLOATS, device=dev)
    assert isinstance(state, torch.Tensor)
    check_tensor(name, state, shape=(None, dim, None))
    if state.shape[2] < width - 1:
        raise ValueError(
            f"{name} must hold at least width - 1 = {width - 1} inputs (dimension 2), got "
            f"shape {tuple(state.shape)}"
        )


def causal_conv1d_fn(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: Optional[torch.Tensor] = None,
    conv_states: Optional[torch.Tensor] = None,
    query_start_loc: Optional[torch.Tensor] = None,
    cache_indices: Optional[torch.Tensor] = None,
    has_initial_state: Optional[torch.Tensor] = None,
    activation: Optional[str] = None,
    pad_slot_id: Optional[int] = -1,
    backend: Optional[str] = None,
) -> torch.Tensor:
    """Depthwise causal convolution over whole sequences (prefill), vLLM's conventions.

    Args:
        x: ``[dim, total_tokens]`` with ``query_start_loc``, or ``[B, dim, T]`` without.
        weight: ``[dim, W]``, ``W >= 2``; bias: ``[dim]`` or None.
        conv_states: ``[slots, dim, state_len >= W - 1]`` or None. Sequence ``i`` uses slot
            ``cache_indices[i]`` (default ``i``): positions ``[0, W - 1)`` are its inputs before
            the sequence, oldest first, read where ``has_initial_state[i]`` and written with its
            last ``W - 1`` inputs afterwards.
        query_start_loc: ``[N + 1]`` int32/int64 offsets (0 .. total_tokens, never decreasing).
        cache_indices: ``[N]`` int32/int64, distinct slots; has_initial_state: ``[N]`` bool
            (default: no sequence has one).
        activation: None, ``"silu"`` or ``"swish"`` (True / False: ``"silu"`` / None).
        pad_slot_id: a ``cache_indices`` entry equal to it, or negative, is padding (vLLM's
            ``PAD_SLOT_ID``, -1): that sequence's slot is neither read nor written and its
            outputs are zeros; padding entries may repeat.
        backend: None (native where ready, :mod:`attn_core.linear.backend`), ``"torch"`` or
            ``"native"`` (width 4 only).

    Values (offsets, slots) are checked on every call (one sync; see :mod:`.inputs`).

    Returns:
        ``out``: x's shape and dtype.
    """
    check_tensor("x", x, dtype=FLOATS)
    dev = x.device
    act = _check_activation(activation)
    pad = check_pad_slot_id(pad_slot_id)
    chosen = check_linear_backend(backend)
    if x.dim() == 3:
        if query_start_loc is not None:
            raise ValueError("query_start_loc must be None for x of shape [B, dim, T]")
        b, dim, t = x.shape
        flat = x.permute(1, 0, 2).reshape(dim, b * t)
        offsets = torch.arange(b + 1, device=dev) * t
    elif x.dim() == 2:
        if query_start_loc is None:
            raise ValueError("query_start_loc must be given for x of shape [dim, total_tokens]")
        dim = x.shape[0]
        flat = x
        check_tensor("query_start_loc", query_start_loc, ndim=1, dtype=INDEX_DTYPES, device=dev)
        if query_start_loc.shape[0] < 2:
            raise ValueError(
                f"query_start_loc must have N + 1 >= 2 entries, got shape "
                f"{tuple(query_start_loc.shape)}"
            )
        offsets = query_start_loc
    else:
        raise ValueError(
            f"x must have 2 dimensions [dim, total_tokens] or 3 [B, dim, T], got {x.dim()} "
            f"with shape {tuple(x.shape)}"
        )
    width = _check_conv_weights(weight, bias, dim, dev)
    n = offsets.shape[0] - 1
    slots, padded = _check_prefill_states(
        conv_states, cache_indices, has_initial_state, n, dim, width, dev, pad
    )
    if x.dim() == 2:
        check_offsets("query_start_loc", offsets, flat.shape[1])
    lib = native_library(chosen, "causal_conv1d_fn", dev, conv_shape(x.dtype),
                         conv_supported(weight, n, dim))  # fmt: skip
    if lib is not None and n > 0:  # the kernels skip a negative slot's reads and writes
        out = torch.empty(dim, flat.shape[1], dtype=x.dtype, device=dev)
        launch_conv_prefill(lib, flat, offsets, weight, bias, conv_states, slots, has_initial_state,
                            out, silu=act is not None)  # fmt: skip
    else:
        out = _conv_prefill_torch(flat, weight, bias, offsets, conv_states, slots,
                                  has_initial_state, act).to(x.dtype)  # fmt: skip
    if padded:
        assert slots is not None
        zero_padded_tokens(out, slots, offsets)
    if x.dim() == 3:
        return out.view(dim, x.shape[0], x.shape[2]).permute(1, 0, 2).contiguous()
    return out


def _conv_prefill_torch(
    flat: torch.Tensor,
    weight: torch.Tensor,
    bias: Optional[torch.Tensor],
    offsets: torch.Tensor,
    conv_states: Optional[torch.Tensor],
    slots: Optional[torch.Tensor],
    has_initial_state: Optional[torch.Tensor],
    act: Optional[str],
) -> torch.Tensor:
    """:func:`causal_conv1d_fn` on the torch path: ``out [dim, total]`` fp32, the slots'
    windows read and written (a negative slot neither)."""
    n, dim, width = offsets.shape[0] - 1, flat.shape[0], weight.shape[1]
    window = torch.zeros(n, dim, width - 1, device=flat.device)
    lanes = safe = valid = None
    if conv_states is not None and slots is not None:
        lanes = conv_states[:, :, : width - 1]
        read, valid, safe = gather_slots(lanes, slots)
        if has_initial_state is not None:  # where, not a product: a fresh slot may hold NaN
            window = torch.where((has_initial_state & valid)[:, None, None], read.float(), window)
    out, new = conv_varlen(flat, weight, bias, offsets, window, act)
    if lanes is not None and safe is not None and valid is not None:
        scatter_slots(lanes, safe, valid, new)
    return out


def _check_prefill_states(
    conv_states: object,
    cache_indices: object,
    has_initial_state: object,
    n: int,
    dim: int,
    width: int,
    dev: torch.device,
    pad_slot_id: Optional[int],
) -> tuple[Optional[torch.Tensor], bool]:
    """The slots of each sequence (``[N]`` int64, -1 for padding; None without
    ``conv_states``) and whether one is padding."""
    if conv_states is None:
        for name, value in (("cache_indices", cache_indices),
                            ("has_initial_state", has_initial_state)):  # fmt: skip
            if value is not None:
                raise ValueError(f"{name} needs conv_states, got conv_states=None")
        return None, False
    _check_state("conv_states", conv_states, dim, width, dev)
    assert isinstance(conv_states, torch.Tensor)
    if has_initial_state is not None:
        check_tensor("has_initial_state", has_initial_state, shape=(n,), dtype=torch.bool,
                     device=dev)  # fmt: skip
    if cache_indices is None:
        if conv_states.shape[0] < n:
            raise ValueError(
                f"conv_states must have a slot per sequence without cache_indices "
                f"({n}), got {conv_states.shape[0]}"
            )
        return torch.arange(n, device=dev), False
    check_tensor("cache_indices", cache_indices, shape=(n,), dtype=INDEX_DTYPES, device=dev)
    assert isinstance(cache_indices, torch.Tensor)
    slots = pad_as_negative(cache_indices, pad_slot_id)
    padded = check_slots("cache_indices", slots, conv_states.shape[0])
    return slots.long(), padded


def causal_conv1d_update(
    x: torch.Tensor,
    conv_state: torch.Tensor,
    weight: torch.Tensor,
    bias: Optional[torch.Tensor] = None,
    activation: Optional[str] = None,
    conv_state_indices: Optional[torch.Tensor] = None,
    pad_slot_id: Optional[int] = -1,
    backend: Optional[str] = None,
) -> torch.Tensor:
    """Depthwise causal convolution of new tokens (decode), the conv state updated in place.

    Args:
        x: ``[N, dim]`` (one token per sequence) or ``[N, dim, L]``.
        conv_state: ``[slots, dim, state_len >= W - 1]``; positions ``[0, W - 1)`` of row
            ``conv_state_indices[i]`` (default ``i``) are read and then hold the last ``W - 1``
            inputs.
        weight: ``[dim, W]``; bias: ``[dim]`` or None; activation: None, "silu" or "swish".
        conv_state_indices: ``[N]`` int32/int64, distinct, in range; one equal to
            ``pad_slot_id``, or negative, is a padding entry (vLLM's ``PAD_SLOT_ID``, -1): its
            state is not touched and its outputs are zeros. Checked only with
            ``ATTN_CORE_CHECKS=1`` outside graph capture (no sync otherwise).
        pad_slot_id: the padding index (vLLM's keyword; -1 or None changes nothing here).
        backend: None (native where ready, :mod:`attn_core.linear.backend`), ``"torch"`` or
            ``"native"`` (width 4 only).

    No host sync unless checks are on: capturable in a CUDA graph.

    Returns:
        ``out``: x's shape and dtype.
    """
    check_tensor("x", x, dtype=FLOATS)
    if x.dim() not in (2, 3):
        raise ValueError(
            f"x must have 2 dimensions [N, dim] or 3 [N, dim, L], got {x.dim()} with shape "
            f"{tuple(x.shape)}"
        )
    dev = x.device
    n, dim = x.shape[0], x.shape[1]
    act = _check_activation(activation)
    pad = check_pad_slot_id(pad_slot_id)
    chosen = check_linear_backend(backend)
    width = _check_conv_weights(weight, bias, dim, dev)
    _check_state("conv_state", conv_state, dim, width, dev)
    if conv_state_indices is None:
        if conv_state.shape[0] < n:
            raise ValueError(
                f"conv_state must have a slot per sequence without conv_state_indices "
                f"({n}), got {conv_state.shape[0]}"
            )
        idx = torch.arange(n, device=dev)
    else:
        check_tensor("conv_state_indices", conv_state_indices, shape=(n,), dtype=INDEX_DTYPES,
                     device=dev)  # fmt: skip
        conv_state_indices = pad_as_negative(conv_state_indices, pad)
        if value_checks_enabled() and not is_capturing(dev):
            check_slots("conv_state_indices", conv_state_indices, conv_state.shape[0])
        idx = conv_state_indices.long()
    seq = x if x.dim() == 3 else x[:, :, None]
    lib = native_library(chosen, "causal_conv1d_update", dev, conv_shape(x.dtype),
                         conv_supported(weight, n, dim))  # fmt: skip
    if lib is not None and n > 0:
        out = torch.empty(seq.shape, dtype=x.dtype, device=dev)
        launch_conv_update(lib, seq, conv_state, weight, bias, conv_state_indices, out,
                           silu=act is not None)  # fmt: skip
        return out.view(x.shape)
    lanes = conv_state[:, :, : width - 1]
    window, valid, safe = gather_slots(lanes, idx)
    out, new = conv_step(seq, window, weight, bias, act)
    scatter_slots(lanes, safe, valid, new)
    return zero_padded(out, valid).to(x.dtype).view(x.shape)
