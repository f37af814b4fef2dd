"""What each compiled native kernel needs, as recorded data the simulator can read without a GPU.

``kernel_facts.json`` (beside this module) lists, per kernel instantiation, the registers,
static shared memory and spill bytes ptxas reported, with the compiler, target and a digest of
the sources it was built from. ``python -m attn_core.native facts --write`` regenerates it from
the build logs (``-Xptxas -v``); a CPU test fails when the sources changed and the file did not.

On the BI-V100 the shared memory is the same (static arrays sized by the same constants);
registers come from CoreX's compiler there and are unmeasured until the lab's first build, so
the simulator treats the sm_90 counts as an assumption on that profile.
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
THREADS = 128  # csrc/paged_decode.cu kThreads (the default ATTN_THREADS)

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
    smem_bytes: int
    spill_bytes: int


def parse_ptxas(text: str) -> list[KernelRecord]:
    """Records from ``nvcc -Xptxas -v`` output (one library's log)."""
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
            record = _record(current, int(used.group("regs")), int(used.group("smem") or 0), spill)
            if record is not None:
                records.append(record)
            current = None
    return records


def _record(name: str, regs: int, smem: int, spill: int) -> Optional[KernelRecord]:
    p = _PARTITION.search(name)
    if p:
        q, c, bucket, slots = (int(x) for x in p.groups())
        return KernelRecord("partition", KINDS[q], KINDS[c], bucket, slots, regs, smem, spill)
    m = _MERGE.search(name)
    if m:
        q = int(m.group(1))
        return KernelRecord("merge", KINDS[q], KINDS[q], 0, 0, regs, smem, spill)
    return None


def write_facts(logs: list[Path], compiler: str, arch: str, digest: str) -> Path:
    """Merge the records of every library log into :data:`FACTS_FILE`."""
    records: dict[tuple, KernelRecord] = {}
    for log in logs:
        for r in parse_ptxas(log.read_text()):
            records[(r.kernel, r.query, r.cache, r.head_bucket, r.slots)] = r
    payload = {
        "source_digest": digest,
        "compiler": compiler,
        "arch": arch,
        "threads_per_block": THREADS,
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
    kernel: str, query: str, cache: str, head_bucket: int, slots: int
) -> Optional[KernelRecord]:
    """The record of one instantiation (``head_bucket`` / ``slots`` ignored for ``merge``)."""
    for r in _records():
        if r.kernel != kernel or r.query != query or r.cache != cache:
            continue
        if kernel == "merge" or (r.head_bucket == head_bucket and r.slots == slots):
            return r
    return None
