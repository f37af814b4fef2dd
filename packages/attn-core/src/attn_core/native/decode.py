"""The decode kernel family at run time: its C structs, library, launch and reference check.

``csrc/paged_decode.cu`` (ABI ``csrc/attn_decode_abi.h``) is built once per head-slot count
(:data:`attn_core.native.family.DECODE`); a GQA group is served by the library of
:func:`group_slots` slots. The caller (attn-core's decode executor) has validated shapes, dtypes
and devices and its plan chose the partitioning; :class:`PreparedDecode` only translates tensors
into :class:`DecodeArgs` and launches on the current CUDA stream (so a graph capture records
it). The family's check against the float64 reference is registered with the verify-once
registry as ``native_decode``.
"""

from __future__ import annotations

import ctypes
import math
from typing import Optional

import torch

from attn_core.core import verify_once
from attn_core.core.verify_once import Verdict
from attn_core.device.spec import DeviceSpec
from attn_core.native import abi, facts
from attn_core.native.family import DECODE
from attn_core.native.loader import NativeLibrary
from attn_core.native.split import decode_body, group_slots, record_toolchain
from attn_core.reference import make_paged_case, poison_tails, reference_decode


def variant_for(group: int) -> str:
    """The :data:`~attn_core.native.family.DECODE` variant serving GQA ``group``."""
    return f"g{group_slots(group)}"


DecodeArgs = abi.c_struct(
    "DecodeArgs",
    (
        "pointer",
        "out query key_cache value_cache block_tables seq_lens alibi_slopes part_out part_lse",
    ),
    (
        "int64",
        "out_seq_stride out_head_stride q_seq_stride q_head_stride k_block_stride "
        "k_head_stride v_block_stride v_head_stride table_stride",
    ),
    (
        "int32",
        "num_seqs num_heads num_kv_heads head_size block_size table_width num_partitions "
        "partition_size query_kind cache_kind",
    ),
    ("float32", "scale v_scale"),
)


class DecodeLibrary(NativeLibrary):
    """A loaded decode library with typed entry points."""

    FAMILY = DECODE
    VERIFY_KIND = "native_decode"
    FUNCTIONS = {
        "attn_native_group_slots": (ctypes.c_int, []),
        "attn_native_decode": (ctypes.c_int, [ctypes.POINTER(DecodeArgs), ctypes.c_void_p]),
        "attn_native_kernel_info": (
            ctypes.c_int, [ctypes.c_int] * 5 + [ctypes.POINTER(abi.KernelInfo)],
        ),
    }  # fmt: skip

    def __init__(self, path) -> None:
        super().__init__(path)
        self.slots = self._lib.attn_native_group_slots()

    def decode(self, args: ctypes.Structure, stream: int) -> None:
        """Launch one decode step on ``stream`` (a ``cudaStream_t`` as an int)."""
        rc = self._lib.attn_native_decode(ctypes.byref(args), ctypes.c_void_p(stream))
        self.check(rc, "native decode launch")

    def kernel_info(
        self, which: str, query_kind: int, cache_kind: int, bucket: int, group: int
    ) -> abi.KernelFacts:
        """Registers, shared memory and occupancy of the ``"partition"`` or ``"merge"`` kernel
        for a head bucket and GQA group."""
        code = 0 if which == "partition" else 1
        return self.read_kernel_info(
            "attn_native_kernel_info", code, query_kind, cache_kind, bucket, group
        )

    def probe(self) -> None:
        self.kernel_info("merge", abi.FLOAT16, abi.FLOAT16, 256, self.slots)


def launch_decode(
    lib: DecodeLibrary,
    *,
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    out: torch.Tensor,
    scale: float,
    v_scale: float,
    kv_cache_dtype: str,
    num_partitions: int,
    partition_size: int,
    alibi_slopes: Optional[torch.Tensor] = None,
    part_out: Optional[torch.Tensor] = None,
    part_lse: Optional[torch.Tensor] = None,
    stream: Optional[int] = None,
) -> None:
    """Write ``out`` with the native kernel.

    Args:
        query, out: ``[num_seqs, num_heads, head_size]``, last dim contiguous.
        key_cache: ``[num_blocks, num_kv_heads, head_size // x, block_size, x]``, contiguous
            below the head axis (vLLM's layout).
        value_cache: ``[num_blocks, num_kv_heads, head_size, block_size]``, likewise.
        block_tables: ``[num_seqs, width]`` int32, last dim contiguous; seq_lens ``[num_seqs]``
            int32 contiguous.
        scale: the softmax scale times ``k_scale`` for fp8 keys.
        v_scale: ``v_scale`` for fp8 values, else 1.
        num_partitions / partition_size: the plan's split (partition_size a multiple of the
            block size, ``num_partitions * partition_size`` covering every sequence).
        part_out / part_lse: fp32 buffers of :func:`attn_core.native.abi.partials_shapes`,
            needed when ``num_partitions > 1``.
        stream: the ``cudaStream_t`` to launch on; None: the query device's current stream.
            (0 on host tensors for a host-emulated library: ci/host_emulation.py.)
    """
    prepared = PreparedDecode(
        lib, query, key_cache, value_cache, block_tables, out, scale=scale, v_scale=v_scale,
        kv_cache_dtype=kv_cache_dtype, num_partitions=num_partitions,
        partition_size=partition_size,
    )  # fmt: skip
    prepared.launch(
        query, key_cache, value_cache, block_tables, seq_lens, out, alibi_slopes,
        part_out.data_ptr() if part_out is not None else None,
        part_lse.data_ptr() if part_lse is not None else None, stream,
    )  # fmt: skip


class PreparedDecode:
    """The launch arguments that depend only on tensor sizes and strides, made once.

    A steady-state call (the same shapes, strides and dtypes as an earlier one; only the data
    moved) launches from this template: a copy of it with the call's pointers filled in, so two
    threads sharing a template never see each other's pointers. Building the 30-field argument
    block from the tensors each call cost ~16 us of the ~70 us of host work per call (CPU
    stand-in); copying the template and setting 9 pointers costs ~5 there.
    """

    def __init__(
        self,
        lib: DecodeLibrary,
        query: torch.Tensor,
        key_cache: torch.Tensor,
        value_cache: torch.Tensor,
        block_tables: torch.Tensor,
        out: torch.Tensor,
        *,
        scale: float,
        v_scale: float,
        kv_cache_dtype: str,
        num_partitions: int,
        partition_size: int,
    ) -> None:
        num_seqs, num_heads, head_size = query.shape
        _, num_kv_heads, _, block_size, _ = key_cache.shape
        self.lib = lib
        self.device_index = query.device.index
        self.template = DecodeArgs(
            out_seq_stride=out.stride(0),
            out_head_stride=out.stride(1),
            q_seq_stride=query.stride(0),
            q_head_stride=query.stride(1),
            k_block_stride=key_cache.stride(0),
            k_head_stride=key_cache.stride(1),
            v_block_stride=value_cache.stride(0),
            v_head_stride=value_cache.stride(1),
            table_stride=block_tables.stride(0),
            num_seqs=num_seqs,
            num_heads=num_heads,
            num_kv_heads=num_kv_heads,
            head_size=head_size,
            block_size=block_size,
            table_width=block_tables.shape[1],
            num_partitions=num_partitions,
            partition_size=partition_size,
            query_kind=abi.QUERY_KINDS[query.dtype],
            cache_kind=abi.cache_kind(query.dtype, kv_cache_dtype),
            scale=scale,
            v_scale=v_scale,
        )

    def launch(
        self,
        query: torch.Tensor,
        key_cache: torch.Tensor,
        value_cache: torch.Tensor,
        block_tables: torch.Tensor,
        seq_lens: torch.Tensor,
        out: torch.Tensor,
        alibi_slopes: Optional[torch.Tensor],
        part_out: Optional[int],
        part_lse: Optional[int],
        stream: Optional[int] = None,
    ) -> None:
        """Launch on ``stream`` (None: the current stream of the query's device); ``part_out``
        / ``part_lse`` are the partial buffers' addresses (None with one partition). The
        tensors must have the sizes and strides the template was made from (the caller's
        steady-state key says so)."""
        k_ptr, v_ptr = key_cache.data_ptr(), value_cache.data_ptr()
        if (k_ptr | v_ptr) % VECTOR_BYTES:
            raise ValueError(
                f"key_cache and value_cache must start at {VECTOR_BYTES}-byte aligned addresses "
                f"(the kernel reads {VECTOR_BYTES}-byte vectors), got {k_ptr:#x} and {v_ptr:#x}"
            )
        args = DecodeArgs.from_buffer_copy(self.template)
        args.out = out.data_ptr()
        args.query = query.data_ptr()
        args.key_cache = k_ptr
        args.value_cache = v_ptr
        args.block_tables = block_tables.data_ptr()
        args.seq_lens = seq_lens.data_ptr()
        args.alibi_slopes = alibi_slopes.data_ptr() if alibi_slopes is not None else None
        args.part_out = part_out
        args.part_lse = part_lse
        self.lib.decode(args, abi.current_stream(query.device) if stream is None else stream)


VECTOR_BYTES = 16  # the kernel's cache loads (csrc/paged_decode.cu: 16-byte key/value vectors)


def layout_supported(
    query: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor, out: torch.Tensor
) -> Optional[str]:
    """None if the kernel can read these tensors' strides as they are, else why not."""
    if query.stride(-1) != 1 or out.stride(-1) != 1:
        return "query and out need a contiguous last dimension"
    if not key_cache[0, 0].is_contiguous() or not value_cache[0, 0].is_contiguous():
        return "each cache block must be contiguous below the head axis (vLLM's layout)"
    return None


# ------------------------------------------------------------- the kernels beside their records
# A loaded library's kernels as the driver reports them, beside the records of kernel_facts.json
# that the device's plans are sized from (``python -m attn_core.native status``'s table, the HIL
# device-facts suite's ``native_kernels``). On a BI-V100 this is the measure of CoreX's own build
# against the nvcc stand-in its plans assume.
COLUMNS = ("kernel", "group", "head bucket", "dtype", "registers", "smem bytes", "spill bytes",
           "blocks/SM", "recorded registers / smem")  # fmt: skip
DIFFERS = " (differs)"
_KINDS = (("fp16", abi.FLOAT16), ("bf16", abi.BFLOAT16), ("fp32", abi.FLOAT32))


def smem_units(nbytes: int) -> int:
    """Shared memory in the H200's 128-byte allocation units: a build's static arrays may be
    padded differently from ptxas's record of the same body (fp32, head 64: 5504 vs 5440)."""
    return -(-nbytes // 128)


def kernel_rows(lib, group: int, spec: DeviceSpec) -> list[tuple]:
    """One row (:data:`COLUMNS`) per kernel of GQA ``group``'s library ``lib`` (anything with
    ``DecodeLibrary.kernel_info``): same-type caches, every head bucket, the partition and
    merge kernels as the driver reports them, and the record the split reads on ``spec``
    (:func:`~attn_core.native.split.record_toolchain`'s toolchain, the body
    :func:`~attn_core.native.split.decode_body` picks), suffixed :data:`DIFFERS` where the two
    differ in registers or in 128-byte units of shared memory."""
    chain = record_toolchain(spec)
    slots = group_slots(group)
    rows = []
    for bucket in abi.HEAD_BUCKETS:
        for name, kind in _KINDS:
            query = facts.KINDS[kind]  # the records' name of the ABI's kind
            body = decode_body(spec, query, query)
            for which in ("partition", "merge"):
                f = lib.kernel_info(which, kind, kind, bucket, group)
                record = facts.lookup(which, query, query, bucket, slots, body, chain)
                if record is None:
                    planned = "no record"
                else:
                    same_smem = smem_units(record.smem_bytes) == smem_units(f.smem_bytes)
                    same = same_smem and record.registers == f.num_regs
                    planned = f"{record.registers} / {record.smem_bytes}"
                    planned += "" if same else DIFFERS
                rows.append((which, group, bucket, name, f.num_regs, f.smem_bytes,
                             f.local_bytes, f.blocks_per_sm, planned))  # fmt: skip
    return rows


# ------------------------------------------------------------------ check against the reference
# One check per (device, library, query dtype, cache dtype, head size, block size, GQA group): a
# small random case in vLLM's layout (permuted blocks, lengths 1, block - 1, block + 1 and two
# longer ones, NaN in the cache slots past each sequence's end) through one partition and
# through several plus the merge, against :func:`attn_core.reference.reference_decode`.
# Max |error| on outputs of magnitude ~1 (averages of N(0, 1) values): a few output ulps.
TOLERANCE = {torch.float16: 5e-3, torch.bfloat16: 3e-2, torch.float32: 1e-4}


def _check(device: torch.device, config: tuple, lib: DecodeLibrary) -> Verdict:
    _, dtype, kv_cache_dtype, head_size, block_size, group = config
    kv_heads = 2
    lens = [1, block_size - 1, block_size + 1, 300, 777]
    case = make_paged_case(
        lens, group * kv_heads, kv_heads, head_size, block_size, dtype, device,
        kv_cache_dtype=kv_cache_dtype, k_scale=0.5 if kv_cache_dtype != "auto" else 1.0,
    )  # fmt: skip
    poison_tails(case)
    want = reference_decode(
        case.query.cpu(), case.key_cache.cpu(), case.value_cache.cpu(),
        case.block_tables.cpu(), case.seq_lens.cpu(), None, None, kv_cache_dtype,
        case.k_scale, case.v_scale,
    )  # fmt: skip
    # one partition; several, partial tiles, merge
    splits = ((1, 1024), (7, 128))
    outputs = ((f"{parts} partition(s)", _run(lib, case, parts, size)) for parts, size in splits)
    return verify_once.max_error_verdict(outputs, want, TOLERANCE[dtype])


verify_once.register(DecodeLibrary.VERIFY_KIND, _check)


def _run(lib: DecodeLibrary, case, parts: int, size: int) -> torch.Tensor:
    num_seqs, num_heads, head_size = case.query.shape
    out = torch.full_like(case.query, math.nan)
    o_shape, l_shape = abi.partials_shapes(num_seqs, num_heads, parts, head_size)
    fp8 = case.kv_cache_dtype != "auto"
    launch_decode(
        lib, query=case.query, key_cache=case.key_cache, value_cache=case.value_cache,
        block_tables=case.block_tables, seq_lens=case.seq_lens, out=out,
        scale=head_size**-0.5 * (case.k_scale if fp8 else 1.0),
        v_scale=case.v_scale if fp8 else 1.0, kv_cache_dtype=case.kv_cache_dtype,
        num_partitions=parts, partition_size=size,
        part_out=torch.empty(o_shape, device=out.device) if parts > 1 else None,
        part_lse=torch.empty(l_shape, device=out.device) if parts > 1 else None,
    )  # fmt: skip
    return out
