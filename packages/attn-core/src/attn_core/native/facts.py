"""What each compiled native kernel needs, as recorded data the simulator can read without a GPU.

``kernel_facts.json`` (beside this module) lists, per kernel instantiation, partition body and
toolchain, the registers, shared memory and spill bytes ptxas reported, with the compiler,
target and a digest of the sources it was built from. ``python -m attn_core.native facts
--write`` regenerates it from the builds' logs (``-Xptxas -v``):

- ``"nvcc"`` records: what an NVIDIA device runs. The default build's 16-bit queries over
  same-type or fp8 caches take the matrix-unit body (``"mma"``, ``csrc/decode_warp.cuh``); a
  build with ``-DATTN_DECODE_MMA=0`` puts every kernel on the CUDA-core body (``"cuda_core"``),
  which is also what the default build runs for the other kinds.
- ``"corex"`` records: the stand-in for CoreX's build on the BI-V100, nvcc compiling the source
  as CoreX sees it (:data:`COREX_DEFINES`: the CUDA-core body and nothing nvcc-only). Shared
  memory is then the body's static arrays, sized by the same constants on both compilers;
  registers come from CoreX's compiler there and are unmeasured until the lab's first build,
  so the simulator treats them as an assumption on that profile.

The two are kept apart because an nvcc-only flag can move nvcc's numbers without moving
CoreX's: shared-memory spilling (CUDA 13's ``enable_smem_spilling``) adds a spill area to the
shared memory ptxas reports and lowers register targets, and a BI-V100 plan sized from those
would be sized for a kernel CoreX never builds. A CPU test fails when the sources changed and
the file did not; a CUDA test compares each ``nvcc`` record with what the driver reports for
the built kernel.
"""

from __future__ import annotations

import contextlib
import functools
import json
import re
from collections.abc import Iterator
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Optional

from attn_core.core.files import write_atomic

FACTS_FILE = Path(__file__).resolve().parent / "kernel_facts.json"
KINDS = ("float32", "float16", "bfloat16", "fp8_e4m3", "fp8_e5m2")  # attn::ElemKind order
THREADS = 128  # csrc/paged_decode.cu kThreads (the CUDA-core body's block) and kMergeThreads
MMA, CUDA_CORE = "mma", "cuda_core"  # the partition bodies
NVCC, COREX = "nvcc", "corex"  # the toolchains a record describes (module docstring)
# The portable build (every kernel on the CUDA-core body, as nvcc builds it) and the build whose
# ptxas report stands in for CoreX's: the same, without nvcc 13's shared-memory spilling, which
# CoreX never sees (csrc/paged_decode.cu ATTN_DECODE_SMEM_SPILL).
PORTABLE_DEFINES = ("ATTN_DECODE_MMA=0",)
COREX_DEFINES = (*PORTABLE_DEFINES, "ATTN_DECODE_SMEM_SPILL=0")
MMA_TILE_TOKENS = 16  # csrc/decode_warp.cuh kTok: tokens of one warp's tile
MMA_WIDE_BUCKET, MMA_WIDE_WARPS, MMA_WARPS = 256, 8, 4  # csrc/decode_warp.cuh warps_for


def partition_threads(body: str, head_bucket: int) -> int:
    """A partition block's threads (paged_decode.cu ``partition_threads``): the matrix-unit
    body's warp streams (eight at head bucket 256, four below) x 32, else :data:`THREADS`."""
    if body != MMA:
        return THREADS
    return 32 * (MMA_WIDE_WARPS if head_bucket == MMA_WIDE_BUCKET else MMA_WARPS)


FP8_KINDS = ("fp8_e4m3", "fp8_e5m2")


def mma_body(query: str, cache: str) -> bool:
    """Whether a (query, cache) pair takes the matrix-unit body where it is built (paged_decode.cu
    ``mma_body``): 16-bit queries over a cache of their own type or an fp8 one."""
    return query in ("float16", "bfloat16") and (cache == query or cache in FP8_KINDS)


_ENTRY = re.compile(r"Compiling entry function '(?P<name>[^']+)' for '(?P<arch>[^']+)'")
_SPILL = re.compile(r"(?P<stack>\d+) bytes stack frame, (?P<stores>\d+) bytes spill stores")
_USED = re.compile(r"Used (?P<regs>\d+) registers.*?(?:(?P<smem>\d+) bytes smem)?$")
_PARTITION = re.compile(r"partition_kernelILi(\d+)ELi(\d+)ELi(\d+)ELi(\d+)E")
_MERGE = re.compile(r"merge_kernelILi(\d+)E")


@dataclass(frozen=True)
class KernelRecord:
    """One kernel instantiation as ptxas reported it."""

    kernel: str  # "partition" or "merge"
    query: str  # element kind names (KINDS)
    cache: str
    head_bucket: int  # 0 for the merge kernel
    slots: int  # query heads per block; 0 for the merge kernel
    registers: int
    smem_bytes: int  # per block, static + dynamic
    spill_bytes: int
    body: str = CUDA_CORE  # the partition body: MMA or CUDA_CORE ("cuda_core" for merge)
    threads: int = THREADS  # per block: partition_threads() for a partition kernel
    toolchain: str = NVCC  # NVCC: the NVIDIA device's kernel; COREX: the BI-V100's stand-in


def parse_ptxas(text: str, *, mma_built: bool = False, toolchain: str = NVCC) -> list[KernelRecord]:
    """Records from ``nvcc -Xptxas -v`` output (one library's log); ``mma_built``: the library
    was built with the matrix-unit body on (the default), so the kernels that take it are
    recorded as :data:`MMA`; ``toolchain``: what the records describe (:data:`NVCC` or
    :data:`COREX`)."""
    records, current = [], None
    spill = 0
    for line in text.splitlines():
        entry = _ENTRY.search(line)
        if entry:
            current, spill = entry.group("name"), 0
            continue
        spilled = _SPILL.search(line)
        if spilled and current:
            spill = int(spilled.group("stores"))
            continue
        used = _USED.search(line.strip())
        if used and current and "registers" in line:
            smem = int(used.group("smem") or 0)
            record = _record(current, int(used.group("regs")), smem, spill, mma_built)
            if record is not None:
                records.append(replace(record, toolchain=toolchain))
            current = None
    return records


def _record(name: str, regs: int, smem: int, spill: int, mma_built: bool) -> Optional[KernelRecord]:
    p = _PARTITION.search(name)
    if p:
        q, c, bucket, slots = (int(x) for x in p.groups())
        query, cache = KINDS[q], KINDS[c]
        body = MMA if mma_built and mma_body(query, cache) else CUDA_CORE
        threads = partition_threads(body, bucket)
        return KernelRecord(
            "partition", query, cache, bucket, slots, regs, smem, spill, body, threads
        )
    m = _MERGE.search(name)
    if m:
        q = int(m.group(1))
        return KernelRecord("merge", KINDS[q], KINDS[q], 0, 0, regs, smem, spill)
    return None


def write_facts(
    logs: list[Path],
    portable_logs: list[Path],
    corex_logs: list[Path],
    compiler: str,
    arch: str,
    digest: str,
) -> Path:
    """Merge the records of every library log into :data:`FACTS_FILE`: ``logs`` from the default
    build (the matrix-unit body's kernels), ``portable_logs`` from ``-DATTN_DECODE_MMA=0`` (the
    CUDA-core body's, both :data:`NVCC`), ``corex_logs`` from :data:`COREX_DEFINES`
    (:data:`COREX`). One record a line, so a regenerated file's diff reads kernel by kernel."""
    records: dict[tuple, KernelRecord] = {}
    builds = ((corex_logs, False, COREX), (portable_logs, False, NVCC), (logs, True, NVCC))
    for paths, mma_built, toolchain in builds:
        for log in paths:
            for r in parse_ptxas(log.read_text(), mma_built=mma_built, toolchain=toolchain):
                if mma_built and r.body != MMA:
                    continue  # the same kernel as the portable build's
                key = (r.kernel, r.query, r.cache, r.head_bucket, r.slots, r.body, r.toolchain)
                records[key] = r
    header = {"source_digest": digest, "compiler": compiler, "arch": arch}
    fields = [f" {json.dumps(name)}: {json.dumps(value)}" for name, value in header.items()]
    kernels = ",\n".join(f"  {json.dumps(asdict(r))}" for _, r in sorted(records.items()))
    write_atomic(
        FACTS_FILE, "{\n" + ",\n".join(fields) + ',\n "kernels": [\n' + kernels + "\n ]\n}\n"
    )
    return FACTS_FILE


def load_facts(path: Optional[Path] = None) -> dict:
    """The recorded facts of :data:`FACTS_FILE` or ``path`` (``kernels`` as
    :class:`KernelRecord`)."""
    data = json.loads((path or FACTS_FILE).read_text())
    data["kernels"] = [KernelRecord(**k) for k in data["kernels"]]
    return data


_Key = tuple  # _key()'s: what lookup() finds a record by


def _key(
    kernel: str, query: str, cache: str, head_bucket: int, slots: int, body: str, toolchain: str
) -> _Key:
    """A merge kernel serves every head bucket, slot count and body of its query kind."""
    if kernel == "merge":
        return (kernel, query, cache, toolchain)
    return (kernel, query, cache, head_bucket, slots, body, toolchain)


def _index(records: list[KernelRecord]) -> dict[_Key, KernelRecord]:
    index: dict[_Key, KernelRecord] = {}
    for r in records:
        key = _key(r.kernel, r.query, r.cache, r.head_bucket, r.slots, r.body, r.toolchain)
        index.setdefault(key, r)
    return index


@functools.lru_cache(maxsize=1)
def _shipped_index() -> dict[_Key, KernelRecord]:
    return _index(load_facts()["kernels"])


_planned_from: Optional[dict[_Key, KernelRecord]] = None  # set by recorded_in()


@contextlib.contextmanager
def recorded_in(path: Path) -> Iterator[None]:
    """Within the block, :func:`lookup` (so every split) reads another build's facts file: a
    benchmark timing two builds each at its own split (``bench/native_ab.py --facts``). One
    thread; not reentrant.

    Raises:
        ValueError: ``path`` is not a facts file (unreadable, not JSON, or records of another
            shape), named.
    """
    global _planned_from
    try:
        index = _index(load_facts(path)["kernels"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"{path} is not a kernel facts file: {exc}") from None
    _planned_from = index
    try:
        yield
    finally:
        _planned_from = None


def lookup(
    kernel: str,
    query: str,
    cache: str,
    head_bucket: int,
    slots: int,
    body: str = CUDA_CORE,
    toolchain: str = NVCC,
) -> Optional[KernelRecord]:
    """The record of one instantiation, body and toolchain (``head_bucket`` / ``slots`` /
    ``body`` ignored for ``merge``)."""
    index = _planned_from if _planned_from is not None else _shipped_index()
    return index.get(_key(kernel, query, cache, head_bucket, slots, body, toolchain))
