"""The Gated DeltaNet kernel family at run time: its C structs, library, launches and check.

``csrc/gated_delta.cu`` (ABI ``csrc/attn_gated_delta_abi.h``) is one library
(:data:`attn_core.native.family.GATED_DELTA`, variant ``fma``): the recurrent decode step on a
state pool, the chunked (fused 16-token, or chunk-parallel 64-token) and the token-by-token
prefill (head_k 64 or 128, head_v a multiple of
32) and the width-4 causal convolution, decode and varlen prefill. The launch functions trust
their inputs: ``attn_core.linear.api`` has validated shapes, dtypes, devices and layouts
(:func:`decode_supported`, :func:`prefill_supported`, :func:`conv_supported` say which layouts
the kernels read). Every launch goes to the current
CUDA stream of its tensors' device (a graph capture records it), or stream 0 on CPU tensors
for a host-emulated library (ci/host_emulation.py). The family's check against the float64
reference (:mod:`attn_core.reference.gated_delta`) is registered with the verify-once registry
as ``native_gated_delta``.
"""

from __future__ import annotations

import ctypes
import functools
import itertools
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Optional

import torch

from attn_core.core import verify_once
from attn_core.core.verify_once import Verdict
from attn_core.native import abi
from attn_core.native.family import GATED_DELTA
from attn_core.native.loader import NativeLibrary
from attn_core.native.split import (
    CHUNK_PASS16_COLUMNS,
    NATIVE_CHUNK,
    NATIVE_WORKSPACE_BYTES,
    Segment,
    chunk_record_bytes,
    chunk_segments,
    chunk_slots,
    pass_wave_seqs,
)
from attn_core.reference.gated_delta import reference_causal_conv1d, reference_gated_delta

VARIANT = "fma"
HEAD_K = (64, 128)  # decode_step<K> instantiations
COLUMNS = 32  # value columns per block: head_v must be a multiple
CONV_WIDTH = 4  # the convolution width compiled
KERNELS = {
    "decode": 0, "conv_update": 1, "conv_prefill": 2, "conv_prefill_state": 3,
    "recurrent_prefill": 4, "chunked_prefill": 5, "decode_key_last": 6, "chunk_prep": 7,
    "chunk_pass": 8, "chunk_prep16": 9, "chunk_pass16": 10,
}  # fmt: skip
INDEX_KINDS = {torch.int32: 0, torch.int64: 1}


# ATTN_GDN_TOKEN_TENSORS: the pointers both step structs begin with
TOKEN_TENSORS = "out q k v g beta"

GdnDecodeArgs = abi.c_struct(
    "GdnDecodeArgs",
    ("pointer", f"{TOKEN_TENSORS} state_pool state_indices"),
    (
        "int64",
        "q_seq_stride q_head_stride k_seq_stride k_head_stride v_seq_stride v_head_stride "
        "out_seq_stride out_head_stride g_seq_stride g_head_stride beta_seq_stride "
        "beta_head_stride "
        "num_slots state_slot_stride state_head_stride state_k_stride state_v_stride",
    ),
    (
        "int32",
        "num_seqs num_heads num_value_heads head_k head_v heads_per_block qkv_kind g_kind "
        "beta_kind index_kind l2norm",
    ),
    ("float32", "scale"),
)

GdnPrefillArgs = abi.c_struct(
    "GdnPrefillArgs",
    ("pointer", f"{TOKEN_TENSORS} initial_state final_state cu_seqlens workspace seq_order"),
    (
        "int64",
        "q_tok_stride q_head_stride k_tok_stride k_head_stride v_tok_stride v_head_stride "
        "out_tok_stride out_head_stride g_tok_stride g_head_stride beta_tok_stride "
        "beta_head_stride",
    ),
    (
        "int32",
        "num_seqs num_heads num_value_heads head_k head_v qkv_kind g_kind beta_kind "
        "offset_kind l2norm",
    ),
    ("float32", "scale"),
)

GdnConvArgs = abi.c_struct(
    "GdnConvArgs",
    ("pointer", "out x conv_state weight bias indices query_start_loc has_initial_state"),
    (
        "int64",
        "x_stride0 x_stride1 x_stride2 out_stride0 out_stride1 out_stride2 "
        "state_slot_stride state_dim_stride state_pos_stride weight_dim_stride "
        "weight_tap_stride bias_stride num_slots",
    ),
    (
        "int32",
        "num_seqs dim tokens width x_kind weight_kind bias_kind state_kind index_kind "
        "offset_kind silu",
    ),
)


@dataclass(frozen=True)
class LinearShape:
    """What selects and checks the family's code: the verify-once key of a decode step.

    Attributes:
        num_heads, num_value_heads: key heads H and value heads HV (a multiple of H).
        head_k, head_v: K and V.
        dtype: q / k / v's dtype.
    """

    num_heads: int
    num_value_heads: int
    head_k: int
    head_v: int
    dtype: torch.dtype

    @property
    def group(self) -> int:
        return self.num_value_heads // self.num_heads


def conv_shape(dtype: torch.dtype) -> LinearShape:
    """The verify-once key a convolution call of inputs ``dtype`` is checked under (every key's
    check covers the convolutions; they have no head sizes of their own)."""
    return LinearShape(1, 1, 128, 128, dtype)


class GatedDeltaLibrary(NativeLibrary):
    """A loaded Gated DeltaNet library with typed entry points."""

    FAMILY = GATED_DELTA
    VERIFY_KIND = "native_gated_delta"
    PARALLEL_VERIFY_KIND = "native_gated_delta_chunk_parallel"
    PARALLEL16_VERIFY_KIND = "native_gated_delta_chunk_parallel16"
    FUNCTIONS = {
        "attn_gdn_decode": (ctypes.c_int, [ctypes.POINTER(GdnDecodeArgs), ctypes.c_void_p]),
        "attn_gdn_recurrent_prefill": (
            ctypes.c_int, [ctypes.POINTER(GdnPrefillArgs), ctypes.c_void_p],
        ),
        "attn_gdn_chunked_prefill": (
            ctypes.c_int, [ctypes.POINTER(GdnPrefillArgs), ctypes.c_void_p],
        ),
        "attn_gdn_chunk_parallel_prefill": (
            ctypes.c_int,
            [ctypes.POINTER(GdnPrefillArgs), ctypes.POINTER(ctypes.c_int32), ctypes.c_int,
             ctypes.c_void_p],
        ),
        "attn_gdn_chunk_record_floats": (ctypes.c_int64, [ctypes.c_int, ctypes.c_int]),
        "attn_gdn_chunk_parallel_prefill16": (
            ctypes.c_int,
            [ctypes.POINTER(GdnPrefillArgs), ctypes.POINTER(ctypes.c_int32), ctypes.c_int,
             ctypes.c_void_p],
        ),
        "attn_gdn_chunk_record16_bytes": (ctypes.c_int64, [ctypes.c_int, ctypes.c_int]),
        "attn_gdn_conv_update": (ctypes.c_int, [ctypes.POINTER(GdnConvArgs), ctypes.c_void_p]),
        "attn_gdn_conv_prefill": (ctypes.c_int, [ctypes.POINTER(GdnConvArgs), ctypes.c_void_p]),
        "attn_gdn_kernel_info": (
            ctypes.c_int, [ctypes.c_int, ctypes.c_int, ctypes.POINTER(abi.KernelInfo)],
        ),
    }  # fmt: skip

    def decode(self, args: ctypes.Structure, stream: int) -> None:
        """Launch one decode step on ``stream`` (a ``cudaStream_t`` as an int)."""
        rc = self._lib.attn_gdn_decode(ctypes.byref(args), ctypes.c_void_p(stream))
        self.check(rc, "native gated delta decode launch")

    def prefill(self, args: ctypes.Structure, stream: int, *, chunked: bool) -> None:
        """Launch the chunked (``chunk_gated_delta_rule``) or token-by-token prefill."""
        fn = self._lib.attn_gdn_chunked_prefill if chunked else self._lib.attn_gdn_recurrent_prefill
        rc = fn(ctypes.byref(args), ctypes.c_void_p(stream))
        self.check(rc, f"native {'chunked' if chunked else 'token-by-token'} prefill launch")

    def chunk_parallel_prefill(
        self,
        args: ctypes.Structure,
        segments: Sequence[Segment],
        stream: int,
        *,
        operands16: bool = False,
    ) -> None:
        """Launch the chunk-parallel prefill: two kernels for each of ``segments``, the fp32
        pair or (``operands16``) the 16-bit pair on the matrix unit."""
        flat = (ctypes.c_int32 * (4 * len(segments)))(*itertools.chain.from_iterable(segments))
        fn = (
            self._lib.attn_gdn_chunk_parallel_prefill16
            if operands16
            else self._lib.attn_gdn_chunk_parallel_prefill
        )
        rc = fn(ctypes.byref(args), flat, len(segments), ctypes.c_void_p(stream))
        self.check(rc, f"native chunk-parallel prefill{'16' if operands16 else ''} launch")

    def chunk_record_floats(self, head_k: int, head_v: int) -> int:
        """Floats of the fp32 pair's workspace record of one chunk and value head."""
        return int(self._lib.attn_gdn_chunk_record_floats(head_k, head_v))

    def chunk_record16_bytes(self, head_k: int, head_v: int) -> int:
        """Bytes of the 16-bit pair's record; 0 where this library has no such pair (CoreX
        and host builds) or these sizes are not compiled (head_k other than 128)."""
        return int(self._lib.attn_gdn_chunk_record16_bytes(head_k, head_v))

    def has_pair16(self, head_k: int, head_v: int, dtype: torch.dtype) -> bool:
        """Whether the 16-bit pair serves these sizes and q's ``dtype`` in this library (head_k
        128, head_v a multiple of 32 up to 128, fp16 or bf16)."""
        return (
            dtype in (torch.float16, torch.bfloat16)
            and head_v % CHUNK_PASS16_COLUMNS == 0
            and self.chunk_record16_bytes(head_k, head_v) > 0
        )

    def conv_update(self, args: ctypes.Structure, stream: int) -> None:
        rc = self._lib.attn_gdn_conv_update(ctypes.byref(args), ctypes.c_void_p(stream))
        self.check(rc, "native causal_conv1d_update launch")

    def conv_prefill(self, args: ctypes.Structure, stream: int) -> None:
        rc = self._lib.attn_gdn_conv_prefill(ctypes.byref(args), ctypes.c_void_p(stream))
        self.check(rc, "native causal_conv1d_fn launch")

    def kernel_info(self, which: str, head_k: int = 128) -> abi.KernelFacts:
        """Registers, shared memory and occupancy of one of :data:`KERNELS` (the decode step's
        for ``head_k``)."""
        return self.read_kernel_info("attn_gdn_kernel_info", KERNELS[which], head_k)

    def probe(self) -> None:
        self.kernel_info("decode", 128)

    def verify_config(self, shape: LinearShape) -> tuple:  # type: ignore[override]
        return (self.path.name, shape.dtype, shape.head_k, shape.head_v, shape.group)


def pair16_reads(*tensors: torch.Tensor) -> bool:
    """Whether the 16-bit pair can read these ``[T, heads, dim]`` inputs: it copies whole
    16-byte rows, so each base address and every stride but the last (in elements) must be
    16-byte aligned; the library refuses other layouts by name (cudaErrorInvalidValue)."""
    return all(
        t.data_ptr() % 16 == 0 and all(s * t.element_size() % 16 == 0 for s in t.stride()[:-1])
        for t in tensors
    )


# ---------------------------------------------------------------------------------- launches
def _stream(t: torch.Tensor, stream: Optional[int]) -> int:
    if stream is not None:
        return stream
    return abi.current_stream(t.device) if t.is_cuda else 0


def _cu_seqlens(lengths: Sequence[int]) -> torch.Tensor:
    """``[N + 1]`` int32 (CPU) offsets of sequences of ``lengths`` packed back to back."""
    return torch.tensor([0, *itertools.accumulate(lengths)], dtype=torch.int32)


def host_to_device(values: Sequence[int], device: torch.device) -> torch.Tensor:
    """``values`` as int32 on ``device``, copied from pinned memory on CUDA: a copy from
    pageable memory may wait for the stream to drain first, which would stall the device
    between one launch and the next."""
    if torch.device(device).type != "cuda":
        return torch.tensor(values, dtype=torch.int32, device=device)
    host = torch.tensor(values, dtype=torch.int32, pin_memory=True)
    return host.to(device, non_blocking=True)


def _token_fields(
    row: str,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    out: torch.Tensor,
) -> dict[str, int]:
    """The :data:`TOKEN_TENSORS` fields of a step struct: each tensor's address and its row and
    head strides (``row``: ``"seq"`` in the decode step's struct, ``"tok"`` in a prefill's)."""
    fields = {}
    for name, t in (("q", q), ("k", k), ("v", v), ("out", out), ("g", g), ("beta", beta)):
        fields[name] = t.data_ptr()
        fields[f"{name}_{row}_stride"], fields[f"{name}_head_stride"] = t.stride(0), t.stride(1)
    return fields


def decode_supported(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, state_pool: torch.Tensor, out: torch.Tensor
) -> Optional[str]:
    """None if the decode kernel serves these head sizes and layouts, else why not."""
    dk, dv = q.shape[-1], v.shape[-1]
    if dk not in HEAD_K:
        return f"head_k must be one of {HEAD_K}, got {dk}"
    if dv % COLUMNS:
        return f"head_v must be a multiple of {COLUMNS}, got {dv}"
    if any(t.stride(-1) != 1 for t in (q, k, v, out)):
        return "q, k, v and out need a contiguous last dimension"
    strides = state_pool.stride()
    if min(strides) < 1:
        return f"state_pool needs positive strides, got {strides}"
    if max(dk * strides[2], dv * strides[3]) >= 2**31:
        return f"state_pool's row and column strides must keep offsets below 2^31, got {strides}"
    if q.shape[0] > 65535:
        return f"at most 65535 sequences a launch, got {q.shape[0]}"
    return None


@functools.lru_cache(maxsize=16)
def _sm_count(device: torch.device) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count


def heads_per_block(
    num_seqs: int, num_heads: int, num_value_heads: int, head_v: int, sm_count: int
) -> int:
    """Value heads one decode block serves: the largest divisor of the GQA group that still
    leaves 4 blocks per SM (a block's 128 threads stream 16 KiB of state per head at
    K = V = 128; fewer than ~4 resident blocks an SM leave bandwidth unused), else 1."""
    group = num_value_heads // num_heads
    slices = head_v // COLUMNS
    best = 1
    for hpb in range(1, group + 1):
        if group % hpb == 0 and num_seqs * (num_value_heads // hpb) * slices >= 4 * sm_count:
            best = hpb
    return best


def launch_decode(
    lib: GatedDeltaLibrary,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    state_pool: torch.Tensor,
    state_indices: torch.Tensor,
    out: torch.Tensor,
    *,
    scale: float,
    l2norm: bool,
    block_heads: Optional[int] = None,
    stream: Optional[int] = None,
) -> None:
    """One decode step (shapes: :func:`attn_core.linear.gated_delta_decode`), ``state_pool``
    updated in place at ``state_indices``. ``block_heads``: value heads a block serves (default
    :func:`heads_per_block` for the device; 1 on the CPU)."""
    n, h, dk = q.shape
    hv, dv = v.shape[1], v.shape[2]
    indices = state_indices.contiguous()  # kept alive (a copy if strided) until the launch
    pool_strides = state_pool.stride()
    if block_heads is None:
        sms = _sm_count(q.device) if q.is_cuda else 1
        block_heads = heads_per_block(n, h, hv, dv, sms) if q.is_cuda else 1
    args = GdnDecodeArgs(
        **_token_fields("seq", q, k, v, g, beta, out),
        state_pool=state_pool.data_ptr(), state_indices=indices.data_ptr(),
        num_slots=state_pool.shape[0], num_seqs=n, num_heads=h, num_value_heads=hv,
        state_slot_stride=pool_strides[0], state_head_stride=pool_strides[1],
        state_k_stride=pool_strides[2], state_v_stride=pool_strides[3],
        head_k=dk, head_v=dv, heads_per_block=block_heads,
        qkv_kind=abi.QUERY_KINDS[q.dtype], g_kind=abi.QUERY_KINDS[g.dtype],
        beta_kind=abi.QUERY_KINDS[beta.dtype], index_kind=INDEX_KINDS[state_indices.dtype],
        l2norm=int(l2norm), scale=scale,
    )  # fmt: skip
    lib.decode(args, _stream(q, stream))


def prefill_supported(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, num_seqs: int
) -> Optional[str]:
    """None if the token-by-token prefill serves ``q, k [T, H, K]``, ``v [T, HV, V]`` of
    ``num_seqs`` sequences, else why not."""
    dk, dv = q.shape[-1], v.shape[-1]
    if dk not in HEAD_K:
        return f"head_k must be one of {HEAD_K}, got {dk}"
    if dv % COLUMNS:
        return f"head_v must be a multiple of {COLUMNS}, got {dv}"
    if any(t.stride(-1) != 1 for t in (q, k, v)):
        return "q, k and v need a contiguous last dimension"
    if not 1 <= num_seqs <= 65535:
        return f"1 to 65535 sequences a launch, got {num_seqs}"
    return None


def launch_recurrent_prefill(
    lib: GatedDeltaLibrary,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    cu_seqlens: torch.Tensor,
    out: torch.Tensor,
    *,
    scale: float,
    l2norm: bool,
    initial_state: Optional[torch.Tensor] = None,
    final_state: Optional[torch.Tensor] = None,
    chunked: bool = False,
    stream: Optional[int] = None,
) -> None:
    """Every sequence of ``q, k [T, H, K]``, ``v, out [T, HV, V]``, ``g, beta [T, HV]`` token
    by token, or in 16-token chunks (``chunked``: the same results); ``cu_seqlens [N + 1]`` on
    their device; ``initial_state`` / ``final_state`` ``[N, HV, K, V]`` fp32 contiguous or
    None (the same tensor: advanced in place)."""
    offsets = cu_seqlens.contiguous()  # alive until the launch
    args = _prefill_args(q, k, v, g, beta, out, offsets, initial_state, final_state, scale, l2norm)
    lib.prefill(args, _stream(q, stream), chunked=chunked)


def _prefill_args(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    out: torch.Tensor,
    offsets: torch.Tensor,
    initial_state: Optional[torch.Tensor],
    final_state: Optional[torch.Tensor],
    scale: float,
    l2norm: bool,
) -> ctypes.Structure:
    """The prefill struct of these tensors (``offsets [N + 1]`` contiguous on their device)."""
    return GdnPrefillArgs(
        **_token_fields("tok", q, k, v, g, beta, out), cu_seqlens=offsets.data_ptr(),
        initial_state=None if initial_state is None else initial_state.data_ptr(),
        final_state=None if final_state is None else final_state.data_ptr(),
        num_seqs=offsets.shape[0] - 1, num_heads=q.shape[1], num_value_heads=v.shape[1],
        head_k=q.shape[2], head_v=v.shape[2], qkv_kind=abi.QUERY_KINDS[q.dtype],
        g_kind=abi.QUERY_KINDS[g.dtype], beta_kind=abi.QUERY_KINDS[beta.dtype],
        offset_kind=INDEX_KINDS[offsets.dtype], l2norm=int(l2norm), scale=scale,
    )  # fmt: skip


@functools.cache
def wave_blocks(lib: GatedDeltaLibrary, device: torch.device, kernel: str, head_k: int) -> int:
    """Blocks of ``kernel`` (a :data:`KERNELS` name) one wave of ``device`` runs at once: its
    SMs x the driver's resident blocks an SM for that library and head size; 0 off CUDA (a
    device of unknown width). Sizes :func:`~attn_core.native.split.chunk_slots` (``chunk_prep``)
    and :func:`~attn_core.native.split.pass_wave_seqs` (``chunk_pass``). Read once a library,
    device, kernel and head size: the driver's occupancy query stays off the launch path."""
    if device.type != "cuda":
        return 0
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    return sms * lib.kernel_info(kernel, head_k).blocks_per_sm


def launch_chunk_parallel_prefill(
    lib: GatedDeltaLibrary,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    lengths: Sequence[int],
    out: torch.Tensor,
    *,
    scale: float,
    l2norm: bool,
    initial_state: Optional[torch.Tensor] = None,
    final_state: Optional[torch.Tensor] = None,
    workspace_bytes: int = NATIVE_WORKSPACE_BYTES,
    operands16: bool = False,
    stream: Optional[int] = None,
) -> None:
    """:func:`launch_recurrent_prefill`'s problem (sequences of ``lengths`` packed in ``q, k
    [T, H, K]``, ``v, out [T, HV, V]``) in 64-token chunks, two kernels a segment of chunks
    (:func:`attn_core.native.split.chunk_segments`) whose intermediates fit ``workspace_bytes``
    (at least one chunk slot). ``head_v`` must be a multiple of
    :data:`~attn_core.native.split.CHUNK_PASS_COLUMNS`. ``operands16``: the 16-bit pair on the
    matrix unit (:meth:`GatedDeltaLibrary.has_pair16` says where it serves)."""
    dk, hv, dv = q.shape[2], v.shape[1], v.shape[2]
    dev = q.device
    # the library's own size (a host test holds them equal)
    record = chunk_record_bytes(dk, dv, operands16)
    # Everything this call allocates counts against workspace_bytes: the index tensors and,
    # unless the caller keeps it, the state carried from segment to segment.
    carry = 0 if final_state is not None else len(lengths) * hv * dk * dv * 4
    prep, walk = ("chunk_prep16", "chunk_pass16") if operands16 else ("chunk_prep", "chunk_pass")
    slots = chunk_slots(hv, dk, dv, workspace_bytes, carry, wave_blocks(lib, dev, prep, dk),
                        operands16)  # fmt: skip
    side_by_side = pass_wave_seqs(wave_blocks(lib, dev, walk, dk), hv, dv, operands16)
    chunks = [-(-n // NATIVE_CHUNK) for n in lengths]
    order, segments = chunk_segments(chunks, slots, side_by_side)
    widest = max(width * depth for _, width, _, depth in segments)
    workspace = torch.empty(widest * hv * record // 4, dtype=torch.float32, device=dev)
    if final_state is None:
        final_state = torch.empty(len(lengths), hv, dk, dv, dtype=torch.float32, device=dev)
    offsets = host_to_device([0, *itertools.accumulate(lengths)], dev)
    seq_order = host_to_device(order, dev)
    args = _prefill_args(q, k, v, g, beta, out, offsets, initial_state, final_state, scale, l2norm)
    args.workspace, args.seq_order = workspace.data_ptr(), seq_order.data_ptr()
    lib.chunk_parallel_prefill(args, segments, _stream(q, stream), operands16=operands16)


def conv_supported(weight: torch.Tensor, num_seqs: int, dim: int) -> Optional[str]:
    """None if the convolution kernels serve this width and size, else why not."""
    if dim < 1:
        return f"needs at least one channel, got dim = {dim}"
    if weight.shape[1] != CONV_WIDTH:
        return f"the convolution width must be {CONV_WIDTH}, got {weight.shape[1]}"
    if num_seqs > 65535 or -(-dim // 128) > 65535:
        return f"at most 65535 sequences and 65535 x 128 channels, got {num_seqs} and {dim}"
    return None


def _conv_args(
    x: torch.Tensor,
    out: torch.Tensor,
    weight: torch.Tensor,
    bias: Optional[torch.Tensor],
    state: Optional[torch.Tensor],
    indices: Optional[torch.Tensor],
    silu: bool,
) -> ctypes.Structure:
    xs, os_ = list(x.stride()) + [0], list(out.stride()) + [0]
    args = GdnConvArgs(
        out=out.data_ptr(), x=x.data_ptr(), weight=weight.data_ptr(),
        x_stride0=xs[0], x_stride1=xs[1], x_stride2=xs[2],
        out_stride0=os_[0], out_stride1=os_[1], out_stride2=os_[2],
        weight_dim_stride=weight.stride(0), weight_tap_stride=weight.stride(1),
        width=weight.shape[1], x_kind=abi.QUERY_KINDS[x.dtype],
        weight_kind=abi.QUERY_KINDS[weight.dtype], silu=int(silu),
    )  # fmt: skip
    if bias is not None:
        args.bias, args.bias_stride = bias.data_ptr(), bias.stride(0)
        args.bias_kind = abi.QUERY_KINDS[bias.dtype]
    if state is not None:
        args.conv_state, args.num_slots = state.data_ptr(), state.shape[0]
        args.state_slot_stride, args.state_dim_stride, args.state_pos_stride = state.stride()
        args.state_kind = abi.QUERY_KINDS[state.dtype]
    if indices is not None:
        args.indices, args.index_kind = indices.data_ptr(), INDEX_KINDS[indices.dtype]
    return args


def launch_conv_update(
    lib: GatedDeltaLibrary,
    x: torch.Tensor,
    conv_state: torch.Tensor,
    weight: torch.Tensor,
    bias: Optional[torch.Tensor],
    indices: Optional[torch.Tensor],
    out: torch.Tensor,
    *,
    silu: bool,
    stream: Optional[int] = None,
) -> None:
    """``x, out [N, dim, L]``; ``conv_state [slots, dim, >= 3]`` updated in place at
    ``indices`` (None: sequence i's slot is i)."""
    indices = None if indices is None else indices.contiguous()  # alive until the launch
    args = _conv_args(x, out, weight, bias, conv_state, indices, silu)
    args.num_seqs, args.dim, args.tokens = x.shape
    lib.conv_update(args, _stream(x, stream))


def launch_conv_prefill(
    lib: GatedDeltaLibrary,
    x: torch.Tensor,
    query_start_loc: torch.Tensor,
    weight: torch.Tensor,
    bias: Optional[torch.Tensor],
    conv_states: Optional[torch.Tensor],
    cache_indices: Optional[torch.Tensor],
    has_initial_state: Optional[torch.Tensor],
    out: torch.Tensor,
    *,
    silu: bool,
    stream: Optional[int] = None,
) -> None:
    """``x, out [dim, total]``; ``query_start_loc [N + 1]`` on x's device; the states
    (:func:`attn_core.linear.causal_conv1d_fn`'s) read and written in place."""
    # 1-D arguments the kernels index densely; the copies of strided ones live until the launch
    offsets = query_start_loc.contiguous()
    cache_indices = None if cache_indices is None else cache_indices.contiguous()
    has_initial_state = None if has_initial_state is None else has_initial_state.contiguous()
    args = _conv_args(x, out, weight, bias, conv_states, cache_indices, silu)
    args.num_seqs = query_start_loc.shape[0] - 1
    args.dim, args.tokens = x.shape
    args.query_start_loc = offsets.data_ptr()
    args.offset_kind = INDEX_KINDS[offsets.dtype]
    if has_initial_state is not None:
        args.has_initial_state = has_initial_state.data_ptr()
    lib.conv_prefill(args, _stream(x, stream))


# ------------------------------------------------------------------ check against the reference
# One check per (device, library, dtype, head_k, head_v, GQA group): a decode step of 3
# sequences in a pool of 6 slots (indices permuted, NaN in every slot not named), with and
# without l2 normalisation, the token-by-token and the fused chunked prefill of 4 sequences
# (1, 0, 70 and 5 tokens) from random initial states, then the convolutions
# (update of 2 tokens, a varlen prefill of 4 sequences of 0, 1, 2 and 37 tokens, half with a
# prior window), against the float64 reference.
# Errors are relative to max(1, the reference's largest magnitude): outputs are stored in the
# input dtype (a few of its ulps), states in fp32.
TOLERANCE = {torch.float16: 5e-3, torch.bfloat16: 3e-2, torch.float32: 1e-4}
STATE_TOLERANCE = 1e-4
# The final state's tolerance of the 16-bit pair (its products' operands rounded to the input
# dtype, as FLA's are): two to three times what moving the inputs by half an ulp of their dtype
# moves the exact state (1.9e-3 bf16, 2.4e-4 fp16; bench/linear_bf16_numerics.py and
# docs/design/gated-delta-prefill.md#what-16-bit-operands-would-cost). Every other kernel keeps
# STATE_TOLERANCE.
OPERANDS16_STATE_TOLERANCE = {torch.float16: 6e-4, torch.bfloat16: 5e-3}


def _err(got: torch.Tensor, want: torch.Tensor) -> float:
    got = got.detach().double().cpu()
    if not bool(torch.isfinite(got).all()):
        return float("inf")
    return float((got - want).abs().max()) / max(1.0, float(want.abs().max()))


def decode_case(
    heads: int,
    value_heads: int,
    head_k: int,
    head_v: int,
    dtype: torch.dtype,
    device: torch.device,
    seqs: int = 3,
    slots: int = 6,
    seed: int = 0,
    key_last: bool = False,
) -> dict:
    """A random decode step: inputs, a NaN-poisoned pool (named slots random) and indices;
    ``key_last``: the pool stored ``[.., V, K]`` and given as its ``[.., K, V]`` view."""
    gen = torch.Generator().manual_seed(seed)

    def rand(*shape, scale=1.0):
        return (torch.randn(*shape, generator=gen) * scale).to(device)

    idx = torch.randperm(slots, generator=gen)[:seqs]
    pool = torch.full((slots, value_heads, head_k, head_v), float("nan"))
    pool[idx] = torch.randn(seqs, value_heads, head_k, head_v, generator=gen) * 0.3
    return dict(
        q=rand(seqs, heads, head_k).to(dtype), k=rand(seqs, heads, head_k, scale=0.3).to(dtype),
        v=rand(seqs, value_heads, head_v).to(dtype),
        g=-torch.rand(seqs, value_heads, generator=gen).to(device),
        beta=torch.rand(seqs, value_heads, generator=gen).to(device).to(dtype),
        state_pool=_stored(pool.to(device), key_last), state_indices=idx.to(device, torch.int32),
    )  # fmt: skip


def _stored(pool: torch.Tensor, key_last: bool) -> torch.Tensor:
    return pool.transpose(-1, -2).contiguous().transpose(-1, -2) if key_last else pool


def decode_errors(
    lib: GatedDeltaLibrary,
    case: dict,
    *,
    l2norm: bool,
    scale: float,
    stream: Optional[int] = None,
    block_heads: Optional[int] = None,
) -> tuple:
    """``(output error, state error, untouched)`` of one launch on ``case`` (its pool updated)
    against :func:`reference_gated_delta`; untouched: slots not named kept their bits."""
    c = case
    before = c["state_pool"].clone()
    idx = c["state_indices"].long()
    n, hv, dv = c["v"].shape
    out = torch.full((n, hv, dv), float("nan"), dtype=c["v"].dtype, device=c["v"].device)
    want_o, want_s = reference_gated_delta(
        c["q"][:, None], c["k"][:, None], c["v"][:, None], c["g"][:, None], c["beta"][:, None],
        scale=scale, initial_state=before[idx], use_qk_l2norm=l2norm,
    )  # fmt: skip
    launch_decode(lib, c["q"], c["k"], c["v"], c["g"], c["beta"], c["state_pool"],
                  c["state_indices"], out, scale=scale, l2norm=l2norm, stream=stream,
                  block_heads=block_heads)  # fmt: skip
    others = torch.ones(before.shape[0], dtype=torch.bool)
    others[idx.cpu()] = False
    same = before[others].view(torch.int32).equal(c["state_pool"][others].view(torch.int32))
    return _err(out, want_o[:, 0]), _err(c["state_pool"][idx], want_s), same


def conv_errors(
    lib: GatedDeltaLibrary,
    dtype: torch.dtype,
    device: torch.device,
    stream: Optional[int] = None,
    seed: int = 0,
) -> float:
    """The worst error of a conv update and a varlen conv prefill against
    :func:`reference_causal_conv1d` (outputs and states)."""
    gen = torch.Generator().manual_seed(seed)
    dim, w = 200, CONV_WIDTH
    weight = torch.randn(dim, w, generator=gen).to(device, dtype)
    bias = torch.randn(dim, generator=gen).to(device, dtype)
    worst = 0.0
    # update: 3 sequences in 5 slots, 2 tokens each, SiLU
    state = torch.randn(5, dim, w + 1, generator=gen).to(device, dtype)
    idx = torch.tensor([4, 0, 2], dtype=torch.int64, device=device)
    x = torch.randn(3, dim, 2, generator=gen).to(device, dtype)
    out = torch.full_like(x, float("nan"))
    before = state.clone()
    launch_conv_update(lib, x, state, weight, bias, idx, out, silu=True, stream=stream)
    for i, slot in enumerate(idx.tolist()):
        want, window = reference_causal_conv1d(x[i], weight, bias, before[slot, :, : w - 1], "silu")
        worst = max(worst, _err(out[i], want), _err(state[slot, :, : w - 1], window))
    # prefill: lengths 0, 1, 2, 37; slots 3, 1, 0, 2; windows where has_initial_state
    lens = [0, 1, 2, 37]
    qsl = torch.tensor([0, 0, 1, 3, 40], dtype=torch.int32, device=device)
    slots = torch.tensor([3, 1, 0, 2], dtype=torch.int32, device=device)
    has = torch.tensor([True, True, False, True], device=device)
    states = torch.randn(4, dim, w - 1, generator=gen).to(device, dtype)
    before = states.clone()
    xp = torch.randn(40, dim, generator=gen).to(device, dtype).t()  # vLLM's [dim, total] view
    outp = torch.full((dim, 40), float("nan"), dtype=dtype, device=device)
    launch_conv_prefill(lib, xp, qsl, weight, bias, states, slots, has, outp, silu=False,
                        stream=stream)  # fmt: skip
    for i, length in enumerate(lens):
        a, slot = int(qsl[i]), int(slots[i])
        prior = before[slot] if bool(has[i]) else None
        want, window = reference_causal_conv1d(xp[:, a : a + length], weight, bias, prior)
        if length:
            worst = max(worst, _err(outp[:, a : a + length], want))
        worst = max(worst, _err(states[slot], window))
    return worst


def prefill_errors(
    lib: GatedDeltaLibrary,
    heads: int,
    value_heads: int,
    head_k: int,
    head_v: int,
    dtype: torch.dtype,
    device: torch.device,
    *,
    lengths: tuple[int, ...] = (1, 0, 70, 5),
    l2norm: bool = True,
    chunked: bool = False,
    parallel: bool = False,
    workspace_bytes: int = NATIVE_WORKSPACE_BYTES,
    operands16: bool = False,
    stream: Optional[int] = None,
    seed: int = 0,
) -> tuple[float, float]:
    """``(output error, final state error)`` of the prefill of sequences of ``lengths`` (an
    empty one included) from random initial states, against :func:`reference_gated_delta`;
    the output and final states are NaN-poisoned first. Token by token, in 16-token chunks
    (``chunked``) or chunk-parallel (``parallel``, its segments sized by ``workspace_bytes``;
    ``operands16``: the 16-bit pair)."""
    gen = torch.Generator().manual_seed(seed)
    total = sum(lengths)
    q = torch.randn(total, heads, head_k, generator=gen).to(device, dtype)
    k = (torch.randn(total, heads, head_k, generator=gen) * 0.3).to(device, dtype)
    v = torch.randn(total, value_heads, head_v, generator=gen).to(device, dtype)
    g = (-torch.rand(total, value_heads, generator=gen) * 0.5).to(device)
    beta = torch.rand(total, value_heads, generator=gen).to(device, dtype)
    init = (torch.randn(len(lengths), value_heads, head_k, head_v, generator=gen) * 0.3).to(device)
    cu = _cu_seqlens(lengths)
    out = torch.full((total, value_heads, head_v), float("nan"), dtype=dtype, device=device)
    final = torch.full_like(init, float("nan"))
    scale = head_k**-0.5
    if parallel:
        launch_chunk_parallel_prefill(lib, q, k, v, g, beta, lengths, out, scale=scale,
                                      l2norm=l2norm, initial_state=init, final_state=final,
                                      workspace_bytes=workspace_bytes,
                                      operands16=operands16, stream=stream)  # fmt: skip
    else:
        launch_recurrent_prefill(lib, q, k, v, g, beta, cu.to(device), out, scale=scale,
                                 l2norm=l2norm, initial_state=init, final_state=final,
                                 chunked=chunked, stream=stream)  # fmt: skip
    want_o, want_s = reference_gated_delta(
        q[None], k[None], v[None], g[None], beta[None], scale=scale, initial_state=init,
        cu_seqlens=cu, use_qk_l2norm=l2norm,
    )  # fmt: skip
    return _err(out, want_o[0]), _err(final, want_s)


def check_library(
    lib: GatedDeltaLibrary, device: torch.device, config: tuple, stream: Optional[int] = None
) -> Verdict:
    """The family's reference check of ``config`` (:meth:`GatedDeltaLibrary.verify_config`)."""
    _, dtype, head_k, head_v, group = config
    worst_o = worst_s = 0.0
    for l2norm, key_last in itertools.product((False, True), (False, True)):
        case = decode_case(2, 2 * group, head_k, head_v, dtype, device, seed=int(l2norm),
                           key_last=key_last)  # fmt: skip
        o, s, same = decode_errors(lib, case, l2norm=l2norm, scale=head_k**-0.5, stream=stream)
        if not same:
            return Verdict(False, "the decode step wrote a state slot it was not given")
        worst_o, worst_s = max(worst_o, o), max(worst_s, s)
    worst_c = conv_errors(lib, dtype, device, stream=stream)
    for chunked in (False, True):
        p_o, p_s = prefill_errors(lib, 2, 2 * group, head_k, head_v, dtype, device,
                                  chunked=chunked, stream=stream)  # fmt: skip
        worst_o, worst_s = max(worst_o, p_o), max(worst_s, p_s)
    tol = TOLERANCE[dtype]
    ok = worst_o <= tol and worst_c <= tol and worst_s <= STATE_TOLERANCE
    return Verdict(
        ok,
        f"max relative error: output {worst_o:.1e}, state {worst_s:.1e}, conv {worst_c:.1e} "
        f"(tolerances {tol:.0e}, {STATE_TOLERANCE:.0e})",
    )


def check_chunk_parallel(
    lib: GatedDeltaLibrary, device: torch.device, config: tuple, stream: Optional[int] = None
) -> Verdict:
    """The chunk-parallel prefill's own check of ``config``: the family's prefill case in one
    segment and in one-slot segments (every chunk's state handed over through the final-state
    buffer). Kept apart from :func:`check_library` so that a device that cannot run this pair
    (its ``chunk_pass`` takes the BI-V100's whole 32 KiB of shared memory a block) keeps the
    rest of the family and the fused chunked kernel."""
    cases = itertools.product((NATIVE_WORKSPACE_BYTES, 1), ((1, 0, 70, 5),))
    return _pair_verdict(lib, device, config, cases, STATE_TOLERANCE, False, stream)


def check_chunk_parallel16(
    lib: GatedDeltaLibrary, device: torch.device, config: tuple, stream: Optional[int] = None
) -> Verdict:
    """:func:`check_chunk_parallel` for the 16-bit pair (16-bit inputs), lengths around the
    chunk added, its final state held to :data:`OPERANDS16_STATE_TOLERANCE`; a refusal where
    the library or sizes lack the pair. Its own verify kind: a device or build without the
    pair keeps the fp32 one."""
    _, dtype, head_k, head_v, _ = config
    if not lib.has_pair16(head_k, head_v, dtype):
        return Verdict(False, f"no 16-bit pair for {dtype}, head_k {head_k}, head_v {head_v}")
    cases = itertools.product((NATIVE_WORKSPACE_BYTES, 1), ((1, 0, 70, 5), (63, 64, 65, 200)))
    state_tol = OPERANDS16_STATE_TOLERANCE[dtype]
    return _pair_verdict(lib, device, config, cases, state_tol, True, stream)


def _pair_verdict(
    lib: GatedDeltaLibrary,
    device: torch.device,
    config: tuple,
    cases: Iterable[tuple[int, tuple[int, ...]]],
    state_tol: float,
    operands16: bool,
    stream: Optional[int],
) -> Verdict:
    """A chunk-parallel pair's verdict over ``(workspace_bytes, lengths)`` cases: two key
    heads, the config's group, the worst output and final-state errors."""
    _, dtype, head_k, head_v, group = config
    worst_o = worst_s = 0.0
    for workspace_bytes, lengths in cases:
        o, s = prefill_errors(lib, 2, 2 * group, head_k, head_v, dtype, device, lengths=lengths,
                              parallel=True, workspace_bytes=workspace_bytes,
                              operands16=operands16, stream=stream)  # fmt: skip
        worst_o, worst_s = max(worst_o, o), max(worst_s, s)
    tol = TOLERANCE[dtype]
    return Verdict(
        worst_o <= tol and worst_s <= state_tol,
        f"max relative error: output {worst_o:.1e}, state {worst_s:.1e} (tolerances "
        f"{tol:.0e}, {state_tol:.0e})",
    )


def _synchronized(check: Callable[..., Verdict]) -> Callable[..., Verdict]:
    """``check`` as verify-once calls it, finished on the device before its verdict counts."""

    def run(device: torch.device, config: tuple, lib: GatedDeltaLibrary) -> Verdict:
        verdict = check(lib, device, config)
        torch.cuda.synchronize(device)
        return verdict

    return run


verify_once.register(GatedDeltaLibrary.VERIFY_KIND, _synchronized(check_library))
verify_once.register(GatedDeltaLibrary.PARALLEL_VERIFY_KIND, _synchronized(check_chunk_parallel))
verify_once.register(
    GatedDeltaLibrary.PARALLEL16_VERIFY_KIND, _synchronized(check_chunk_parallel16)
)
