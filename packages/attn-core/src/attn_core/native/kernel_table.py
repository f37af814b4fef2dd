"""A loaded decode library's kernels as the driver reports them, beside the records of
``kernel_facts.json`` that the device's plans are sized from (``python -m attn_core.native
status``'s table, the HIL device-facts suite's ``native_kernels``). On a BI-V100 this is the
measure of CoreX's own build against the nvcc stand-in its plans assume."""

from __future__ import annotations

from attn_core.device.spec import DeviceSpec
from attn_core.native import abi, facts
from attn_core.native.split import decode_body, record_toolchain

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
    ``NativeLibrary.kernel_info``): same-type caches, every head bucket, the partition and
    merge kernels as the driver reports them, and the record the split reads on ``spec``
    (:func:`~attn_core.native.split.record_toolchain`'s toolchain, the body
    :func:`~attn_core.native.split.decode_body` picks), suffixed :data:`DIFFERS` where the two
    differ in registers or in 128-byte units of shared memory."""
    chain = record_toolchain(spec)
    slots = abi.group_slots(group)
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
