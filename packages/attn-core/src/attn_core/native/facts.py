"""What each compiled native kernel needs, as recorded data the simulator can read without a GPU.

``kernel_facts.json`` (beside this module) lists, per kernel instantiation and partition body,
the registers, shared memory and spill bytes ptxas reported, with the compiler, target and a
digest of the sources it was built from. ``python -m attn_core.native facts --write``
regenerates it from two builds' logs (``-Xptxas -v``): the default one, whose 16-bit queries
over same-type or fp8 caches take the matrix-unit body (``"mma"``, ``csrc/decode_warp.cuh``,
NVIDIA only), and one with ``-DATTN_DECODE_MMA=0``, every kernel on the CUDA-core body
(``"cuda_core"``: what CoreX compiles). A CPU test fails when the sources changed and the file
did not.

Every body's shared memory is static, so ptxas reports it, and a CUDA test compares each record
with what the driver reports for the built kernel. On the BI-V100 the CUDA-core body's shared
memory is the same (static arrays sized by the same constants); registers come from CoreX's
compiler there and are unmeasured until the lab's first build, so the simulator treats the
sm_90 counts as an assumption on that profile.
"""

from __future__ import annotations

import functools
import json
import re
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Optional

FACTS_FILE = Path(__file__).resolve().parent / "kernel_facts.json"
KINDS = ("float32", "float16", "bfloat16", "fp8_e4m3", "fp8_e5m2")  # attn::ElemKind order
THREADS = 128  # csrc/paged_decode.cu kThreads (the CUDA-core body's block) and kMergeThreads
MMA, CUDA_CORE = "mma", "cuda_core"  # the partition bodies
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


def parse_ptxas(text: str, *, mma_built: bool = False) -> list[KernelRecord]:
    """Records from ``nvcc -Xptxas -v`` output (one library's log); ``mma_built``: the library
    was built with the matrix-unit body on (the default), so the kernels that take it are
    recorded as :data:`MMA`."""
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
                records.append(record)
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
    logs: list[Path], portable_logs: list[Path], compiler: str, arch: str, digest: str
) -> Path:
    """Merge the records of every library log into :data:`FACTS_FILE`: ``logs`` from the default
    build (the matrix-unit body's kernels), ``portable_logs`` from ``-DATTN_DECODE_MMA=0``."""
    records: dict[tuple, KernelRecord] = {}
    for paths, mma_built in ((portable_logs, False), (logs, True)):
        for log in paths:
            for r in parse_ptxas(log.read_text(), mma_built=mma_built):
                if mma_built and r.body != MMA:
                    continue  # the same kernel as the portable build's
                records[(r.kernel, r.query, r.cache, r.head_bucket, r.slots, r.body)] = r
    payload = {
        "source_digest": digest,
        "compiler": compiler,
        "arch": arch,
        "kernels": [asdict(r) for _, r in sorted(records.items())],
    }
    FACTS_FILE.write_text(json.dumps(payload, indent=1) + "\n")
    return FACTS_FILE


def load_facts() -> dict:
    """The recorded facts (``kernels`` as :class:`KernelRecord`)."""
    data = json.loads(FACTS_FILE.read_text())
    data["kernels"] = [KernelRecord(**k) for k in data["kernels"]]
    return data


@functools.lru_cache(maxsize=1)
def _records() -> tuple[KernelRecord, ...]:
    return tuple(load_facts()["kernels"])


def lookup(
    kernel: str, query: str, cache: str, head_bucket: int, slots: int, body: str = CUDA_CORE
) -> Optional[KernelRecord]:
    """The record of one instantiation and body (``head_bucket`` / ``slots`` / ``body`` ignored
    for ``merge``)."""
    for r in _records():
        if r.kernel != kernel or r.query != query or r.cache != cache:
            continue
        if kernel == "merge":
            return r
        if (r.head_bucket, r.slots, r.body) == (head_bucket, slots, body):
            return r
    return None
