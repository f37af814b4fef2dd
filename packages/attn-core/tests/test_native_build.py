"""The native kernel's build machinery, on any machine (no GPU): toolchain discovery, the
build cache key, the recorded kernel facts, the C ABI mirror and the CLI's exit codes."""

from __future__ import annotations

import ctypes
import re
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from attn_core.core.settings import parse_archs
from attn_core.native import abi, build, facts, split
from attn_core.native.__main__ import main as native_main
from attn_core.native.abi import KernelInfo
from attn_core.native.decode import DecodeArgs
from attn_core.native.family import DECODE, DECODE_SLOTS, GATED_DELTA, PREFILL
from attn_core.native.gated_delta import GdnConvArgs, GdnDecodeArgs, GdnPrefillArgs
from attn_core.native.prefill import PrefillArgs, PrefillConfigInfo
from attn_core.native.toolchain import CLANG_FTZ, Toolchain, find_toolchain

CSRC = build.CSRC


def test_recorded_facts_match_the_sources() -> None:
    """kernel_facts.json must be regenerated whenever csrc/ changes
    (``python -m attn_core.native facts --write`` where nvcc exists)."""
    data = facts.load_facts()
    assert data["source_digest"] == build.source_digest(), (
        "csrc/ changed since kernel_facts.json was written: run "
        "`python -m attn_core.native facts --write`"
    )


def test_facts_cover_every_shipped_kernel() -> None:
    data = facts.load_facts()
    kinds = {("float16", "float16"), ("bfloat16", "bfloat16"), ("float32", "float32")}
    kinds |= {(q, c) for q in ("float16", "bfloat16", "float32") for c in ("fp8_e4m3", "fp8_e5m2")}
    have = {
        (r.query, r.cache, r.head_bucket, r.slots, r.body, r.toolchain) for r in data["kernels"]
    }
    for q, c in kinds:
        for bucket in abi.HEAD_BUCKETS:
            for slots in DECODE_SLOTS:
                # every kernel on the CUDA-core body, as nvcc builds it and as CoreX's stand-in;
                # 16-bit queries over their own type or fp8 also on the matrix-unit body
                # (NVIDIA's only)
                for chain in (facts.NVCC, facts.COREX):
                    assert (q, c, bucket, slots, facts.CUDA_CORE, chain) in have, (q, c, chain)
                mma = (q, c, bucket, slots, facts.MMA, facts.NVCC) in have
                assert mma == facts.mma_body(q, c), (q, c, bucket, slots)
                assert (q, c, bucket, slots, facts.MMA, facts.COREX) not in have
    for q in ("float16", "bfloat16", "float32"):
        for chain in (facts.NVCC, facts.COREX):
            assert facts.lookup("merge", q, q, 0, 0, toolchain=chain) is not None, (q, chain)
    for r in data["kernels"]:
        # static arrays within the default 48 KiB (no opt-in); CoreX's within the BI-V100's 32
        assert r.smem_bytes <= (32 if r.toolchain == facts.COREX else 48) * 1024, r


def test_no_kernel_nvcc_builds_spills() -> None:
    """Issue 17's target: no spill stores in nvcc's ptxas report of any kernel (26 of 363 did
    until shared-memory spilling, ATTN_DECODE_SMEM_SPILL, docs round 19). A source change that
    brings a spill back shows here once kernel_facts.json is regenerated. CoreX's stand-in is
    built without that nvcc-only pragma, and its spills are not CoreX's own (unmeasured)."""
    spilling = [
        r for r in facts.load_facts()["kernels"] if r.toolchain == facts.NVCC and r.spill_bytes
    ]
    assert not spilling, spilling


def test_corex_records_differ_from_the_portable_builds_only_where_the_pragma_goes() -> None:
    """CoreX's stand-in is the portable build without nvcc's shared-memory spilling
    (facts.COREX_DEFINES), and the pragma goes into the CUDA-core partition kernels of 2 or more
    head slots alone (csrc/paged_decode.cu allow_smem_spilling): every other record (the merge
    kernels, one head slot) must be the same in both sets, and every record the same kernel,
    body and block size."""
    assert set(facts.COREX_DEFINES) - set(facts.PORTABLE_DEFINES) == {"ATTN_DECODE_SMEM_SPILL=0"}
    data = facts.load_facts()

    def of(chain: str) -> dict:
        return {
            (r.kernel, r.query, r.cache, r.head_bucket, r.slots): r
            for r in data["kernels"]
            if r.toolchain == chain and r.body == facts.CUDA_CORE
        }

    nvcc, corex = of(facts.NVCC), of(facts.COREX)
    assert nvcc.keys() == corex.keys()
    assert all(corex[k].threads == nvcc[k].threads for k in nvcc)
    untouched = [k for k in nvcc if k[0] == "merge" or k[4] < 2]
    assert untouched  # merges of every kind and the one-slot kernels
    differ = [k for k in untouched if replace(corex[k], toolchain=facts.NVCC) != nvcc[k]]
    assert not differ, differ


def test_facts_on_disk_are_what_write_facts_writes(tmp_path, monkeypatch) -> None:
    """The file round-trips through write_facts (one record a line, sorted): a regenerated
    file differs from the committed one only where ptxas reported something else."""
    data = facts.load_facts()
    builds = {  # the default build's matrix-unit kernels, the portable build's, CoreX's
        "default": (facts.MMA, facts.NVCC),
        "portable": (facts.CUDA_CORE, facts.NVCC),
        "corex": (facts.CUDA_CORE, facts.COREX),
    }
    logs = {}
    for name, (body, chain) in builds.items():
        logs[name] = tmp_path / f"{name}.log"
        kept = [r for r in data["kernels"] if (r.body, r.toolchain) == (body, chain)]
        logs[name].write_text("".join(_ptxas_lines(r) for r in kept))
    target = tmp_path / "kernel_facts.json"
    monkeypatch.setattr(facts, "FACTS_FILE", target)
    default, portable, corex = ([logs[name]] for name in builds)
    header = (data["compiler"], data["arch"], data["source_digest"])
    facts.write_facts(default, portable, corex, *header)
    assert target.read_text() == (Path(facts.__file__).parent / "kernel_facts.json").read_text()


_KIND_INDEX = {name: i for i, name in enumerate(facts.KINDS)}


def _ptxas_lines(r: facts.KernelRecord) -> str:
    """What ``nvcc -Xptxas -v`` prints for the kernel ``r`` records (the mangled names'
    template arguments are what the parser reads)."""
    q, c = _KIND_INDEX[r.query], _KIND_INDEX[r.cache]
    if r.kernel == "merge":
        name = f"_ZN4attn12merge_kernelILi{q}EEEv14AttnDecodeArgs"
    else:
        args = f"ILi{q}ELi{c}ELi{r.head_bucket}ELi{r.slots}EE"
        name = f"_ZN4attn16partition_kernel{args}Ev14AttnDecodeArgs"
    return (
        f"ptxas info    : Compiling entry function '{name}' for 'sm_90'\n"
        f"    0 bytes stack frame, {r.spill_bytes} bytes spill stores, 0 bytes spill loads\n"
        f"ptxas info    : Used {r.registers} registers, {r.smem_bytes} bytes smem\n"
    )


def test_ptxas_parser_reads_registers_smem_and_spills() -> None:
    text = """ptxas info    : Compiling entry function '_ZN4attn16partition_kernelILi1ELi3ELi256ELi6EEEv14AttnDecodeArgs' for 'sm_90'
ptxas info    : Function properties for _ZN4attn16partition_kernelILi1ELi3ELi256ELi6EEEv14AttnDecodeArgs
    16 bytes stack frame, 12 bytes spill stores, 12 bytes spill loads
ptxas info    : Used 128 registers, used 1 barriers, 16 bytes cumulative stack size, 9728 bytes smem
ptxas info    : Compiling entry function '_ZN4attn12merge_kernelILi2EEEv14AttnDecodeArgs' for 'sm_90'
ptxas info    : Used 32 registers, used 1 barriers, 1024 bytes smem
"""  # noqa: E501
    part, merge = facts.parse_ptxas(text)
    assert part.body == merge.body == facts.CUDA_CORE
    assert (part.query, part.cache, part.head_bucket, part.slots) == ("float16", "fp8_e4m3", 256, 6)
    assert (part.registers, part.smem_bytes, part.spill_bytes) == (128, 9728, 12)
    assert (merge.kernel, merge.query, merge.registers, merge.smem_bytes) == (
        "merge", "bfloat16", 32, 1024,
    )  # fmt: skip


def test_a_default_build_records_the_matrix_unit_body() -> None:
    text = """ptxas info    : Compiling entry function '_ZN4attn48_GLOBAL__N__2e9472f3_15_paged_decode_cu_f259084416partition_kernelILi1ELi1ELi128ELi6EEEv14AttnDecodeArgs' for 'sm_90'
ptxas info    : Used 168 registers, used 1 barriers, 20736 bytes smem
ptxas info    : Compiling entry function '_ZN4attn48_GLOBAL__N__2e9472f3_15_paged_decode_cu_f259084416partition_kernelILi1ELi4ELi128ELi6EEEv14AttnDecodeArgs' for 'sm_90'
ptxas info    : Used 96 registers, used 1 barriers, 9728 bytes smem
"""  # noqa: E501
    mma, fp8 = facts.parse_ptxas(text, mma_built=True)
    assert (mma.body, mma.registers, mma.smem_bytes) == (facts.MMA, 168, 20736)
    # fp8 caches are widened in registers: the same body
    assert (fp8.body, fp8.registers, fp8.smem_bytes) == (facts.MMA, 96, 9728)
    (portable, _) = facts.parse_ptxas(text, mma_built=False)
    assert portable.body == facts.CUDA_CORE and portable.smem_bytes == 20736


@pytest.mark.parametrize("group, slots", [(1, 1), (6, 6), (8, 8), (9, 5), (12, 6), (16, 8)])
def test_group_slots_mirror_the_kernel(group: int, slots: int) -> None:
    assert split.group_slots(group) == slots
    source = (CSRC / "paged_decode.cu").read_text()
    assert "int group_slots(int group)" in source  # the rule this mirrors


def test_merge_slices_mirror_the_kernel() -> None:
    """split.merge_dims and merge_grid launch what paged_decode.cu's merge_dims() serves."""
    source = (CSRC / "paged_decode.cu").read_text()

    def constant(name: str) -> int:
        match = re.search(rf"\b{name} = (\d+)", source)
        assert match, f"{name} not in paged_decode.cu"
        return int(match.group(1))

    at = constant("kMergeNarrowAt")
    narrow, wide = constant("kMergeNarrowDims"), constant("kMergeWideDims")
    assert (split.MERGE_NARROW_AT, split.MERGE_NARROW_DIMS, split.MERGE_WIDE_DIMS) == (
        at,
        narrow,
        wide,
    )
    assert "num_partitions >= kMergeNarrowAt ? kMergeNarrowDims : kMergeWideDims" in source
    assert split.merge_dims(at - 1) == wide and split.merge_dims(at) == narrow
    # head 256 over 131 partitions: 16 slices of 16 dimensions; head 72 over 2: 3 of 32
    assert split.merge_grid(1, 6, 256, 131) == (6, 1, 16)
    assert split.merge_grid(2, 24, 72, 2) == (24, 2, 3)
    # the dependent launch's limit (split.merge_is_dependent, the simulator's merge gap)
    assert split.MERGE_DEPENDENT_BLOCKS_PER_SM == constant("kMergeBlocksPerSm")
    assert "<= overlap.max_blocks" in source and "kMergeBlocksPerSm * sms" in source


def test_block_threads_mirror_the_kernel() -> None:
    """facts.partition_threads (what the split and the simulator price) is what paged_decode.cu
    launches: decode_warp.cuh's warps_for() on the matrix-unit body, kThreads elsewhere, and
    kMergeThreads for the merge."""
    from attn_core.native import facts

    decode = (CSRC / "paged_decode.cu").read_text()
    warp = (CSRC / "decode_warp.cuh").read_text()
    wide = re.search(r"#define ATTN_DECODE_WARPS_256 (\d+)", warp)
    threads = re.search(r"#define ATTN_THREADS (\d+)", decode)
    merge = re.search(r"\bkMergeThreads = (\d+)", decode)
    assert wide and threads and merge
    assert "return HEAD_MAX == 256 ? ATTN_DECODE_WARPS_256 : 4;" in warp
    assert "return decode_warp::warps_for<HEAD_MAX>() * 32;" in decode
    assert facts.THREADS == int(threads.group(1)) == int(merge.group(1))
    assert facts.partition_threads(facts.MMA, 256) == 32 * int(wide.group(1))
    assert facts.partition_threads(facts.MMA, 128) == facts.partition_threads(facts.MMA, 64) == 128
    assert facts.partition_threads(facts.CUDA_CORE, 256) == facts.THREADS
    for record in facts.load_facts()["kernels"]:
        if record.kernel == "merge":
            assert record.threads == facts.THREADS, record
        else:
            want = facts.partition_threads(record.body, record.head_bucket)
            assert record.threads == want, record


# Each family's ABI header and the version it defines (a struct's header may be shared)
ABI_VERSION = {
    DECODE.name: ("attn_decode_abi.h", "ATTN_NATIVE_ABI_VERSION"),
    PREFILL.name: ("attn_prefill_abi.h", "ATTN_PREFILL_ABI_VERSION"),
    GATED_DELTA.name: ("attn_gated_delta_abi.h", "ATTN_GDN_ABI_VERSION"),
}


def _expand_field_lists(header: str, lines: list[str]) -> list[str]:
    """``lines`` with each line that names a field-list macro of ``header`` (a ``#define`` of
    field declarations, e.g. ATTN_GDN_TOKEN_TENSORS) replaced by its declarations."""
    macros = {}
    for found in re.finditer(r"#define (\w+)\s*\\\n((?:.*\\\n)*.*)", header):
        body = found.group(2).replace("\\\n", "\n").splitlines()
        macros[found.group(1)] = [line.strip() for line in body if line.strip()]
    out = []
    for line in lines:
        out += macros.get(line.strip(), [line])
    return out


@pytest.mark.parametrize(
    "header, struct, mirror, family",
    [
        ("attn_decode_abi.h", "AttnDecodeArgs", DecodeArgs, DECODE),
        ("attn_kernel_info.h", "AttnKernelInfo", KernelInfo, DECODE),
        ("attn_kernel_info.h", "AttnKernelInfo", KernelInfo, GATED_DELTA),
        ("attn_prefill_abi.h", "AttnPrefillArgs", PrefillArgs, PREFILL),
        ("attn_prefill_abi.h", "AttnPrefillConfig", PrefillConfigInfo, PREFILL),
        ("attn_gated_delta_abi.h", "AttnGdnDecodeArgs", GdnDecodeArgs, GATED_DELTA),
        ("attn_gated_delta_abi.h", "AttnGdnPrefillArgs", GdnPrefillArgs, GATED_DELTA),
        ("attn_gated_delta_abi.h", "AttnGdnConvArgs", GdnConvArgs, GATED_DELTA),
    ],
    ids=[
        "decode args", "decode kernel info", "gated delta kernel info", "prefill args",
        "prefill config", "gated delta decode args", "gated delta prefill args",
        "gated delta conv args",
    ],
)  # fmt: skip
def test_abi_structs_mirror_the_header(header, struct, mirror, family) -> None:
    """Field names, order and widths of each family's ctypes structs follow its header, the
    family's ABI header includes the struct's, and its ABI version is the header's."""
    text = (CSRC / header).read_text()
    start, end = text.index(f"typedef struct {struct} {{"), text.index(f"}} {struct};")
    declared = []
    for line in _expand_field_lists(text, text[start:end].splitlines()[1:]):
        line = line.split("//")[0].strip().rstrip(";")
        match = re.fullmatch(r"(?:const\s+)?(\w+)\s*(\*?)\s*(.+)", line)
        if match:
            ctype = match.group(1) + match.group(2)
            declared += [(n.strip(), ctype) for n in match.group(3).split(",")]
    widths = {"int64_t": 8, "int32_t": 4, "float": 4}
    fields = mirror._fields_
    assert [n for n, _ in declared] == [n for n, _ in fields]
    for (name, ctype), (_, ptype) in zip(declared, fields, strict=True):
        want = widths.get(ctype, ctypes.sizeof(ctypes.c_void_p))
        assert ctypes.sizeof(ptype) == want, name
    abi_header, version = ABI_VERSION[family.name]
    family_text = (CSRC / abi_header).read_text()
    assert header == abi_header or f'#include "{header}"' in family_text
    found = re.search(rf"#define {version} (\d+)", family_text)
    assert found and int(found.group(1)) == family.abi_version


def test_build_key_follows_sources_and_flags(tmp_path: Path) -> None:
    tc = Toolchain("nvcc", "/x/nvcc", "/x", ("sm_90",), "V13.0")
    other = Toolchain("nvcc", "/x/nvcc", "/x", ("sm_80",), "V13.0")
    assert build.build_key(tc) != build.build_key(other)
    assert build.build_key(tc) == build.build_key(tc)
    # the same compiler installed elsewhere builds the same library (a carried cache is found)
    moved = Toolchain("nvcc", "/usr/local/cuda/bin/nvcc", "/usr/local/cuda", ("sm_90",), "V13.0")
    assert build.build_key(moved) == build.build_key(tc)


def test_each_library_hashes_only_the_files_it_includes(tmp_path: Path, monkeypatch) -> None:
    """A prefill-layer edit must not rebuild the 16 decode libraries (nor stale
    kernel_facts.json), a decode-only edit must not rebuild prefill; a shared header (the
    platform's, the m16n8k16 register level both matrix-unit paths use) rebuilds both."""
    copy = tmp_path / "csrc"
    shutil.copytree(CSRC, copy)
    monkeypatch.setattr(build, "CSRC", copy)
    decode, prefill = copy / DECODE.source, copy / PREFILL.source

    def names(entry: Path) -> set[str]:
        return {p.name for p in build.include_closure(entry)}

    assert {"decode_warp.cuh", "attn_m16n8k16.cuh", "attn_decode_abi.h"} <= names(decode)
    assert not {"attn_mma.cuh", "attn_async.cuh", "paged_prefill.cu"} & names(decode)
    assert {"attn_mma.cuh", "attn_m16n8k16.cuh", "attn_prefill_abi.h"} <= names(prefill)
    assert not {"decode_warp.cuh", "paged_decode.cu"} & names(prefill)

    def digests() -> tuple[str, str]:
        return build.source_digest(decode), build.source_digest(prefill)

    def edit(name: str) -> None:
        path = copy / name
        path.write_bytes(path.read_bytes() + b"\n// edited\n")

    for name, decode_moves, prefill_moves in (
        ("attn_mma.cuh", False, True),
        ("decode_warp.cuh", True, False),
        ("attn_platform.cuh", True, True),
        ("attn_m16n8k16.cuh", True, True),
    ):
        before = digests()
        edit(name)
        after = digests()
        assert (after[0] != before[0], after[1] != before[1]) == (decode_moves, prefill_moves), name


def test_includes_are_followed_transitively(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(build, "CSRC", tmp_path)
    (tmp_path / "a.cu").write_text('#include <cstdio>\n#include "b.cuh"\n#include "cuda_fp16.h"\n')
    (tmp_path / "b.cuh").write_text('#if X\n  #  include "c.h"  // under any #if\n#endif\n')
    (tmp_path / "c.h").write_text('#include "b.cuh"  // a cycle ends\n')
    (tmp_path / "unused.h").write_text("")
    assert [p.name for p in build.include_closure(tmp_path / "a.cu")] == ["a.cu", "b.cuh", "c.h"]


def test_no_toolchain_is_a_reason_not_an_error(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    toolchain, why = find_toolchain(str(tmp_path / "nowhere"), None)
    if toolchain is not None and toolchain.compiler.startswith("/usr/local/cuda"):
        pytest.skip("/usr/local/cuda/bin/nvcc exists here: the search finds it by design")
    assert toolchain is None and "nvcc" in why


def test_corex_commands_name_the_arch_and_both_languages(tmp_path: Path) -> None:
    tc = Toolchain("corex-clang", "/usr/local/corex/bin/clang++", "/usr/local/corex",
                   ("ivcore10",), "clang 16")  # fmt: skip
    cmds = tc.commands(Path("a.cu"), Path("inc"), Path("out.so"), ("ATTN_GROUP_SLOTS=6",))
    assert [c[2] for c in cmds] == ["ivcore", "cuda"]
    for c in cmds:
        assert "--cuda-gpu-arch=ivcore10" in c and "-DATTN_GROUP_SLOTS=6" in c and "-lcudart" in c


def test_flushing_subnormals_is_a_flag_and_a_cache_key() -> None:
    nv = Toolchain("nvcc", "/usr/local/cuda/bin/nvcc", "/usr/local/cuda", ("sm_90",), "13.0")
    plain = nv.commands(Path("a.cu"), Path("inc"), Path("out.so"))
    (ftz,) = nv.commands(Path("a.cu"), Path("inc"), Path("out.so"), flush_denormals=True)
    assert "-ftz=true" in ftz and all("-ftz=true" not in c for c in plain)
    assert build.build_key(nv) != build.build_key(nv, flush_denormals=True)
    # CoreX's clang may not know the flag: with it first, then the plain lines as fallbacks
    cx = Toolchain("corex-clang", "/usr/local/corex/bin/clang++", "/usr/local/corex",
                   ("ivcore10",), "clang 16")  # fmt: skip
    cmds = cx.commands(Path("a.cu"), Path("inc"), Path("out.so"), flush_denormals=True)
    assert [CLANG_FTZ in c for c in cmds] == [True, True, False, False]
    assert [c[2] for c in cmds] == ["ivcore", "cuda", "ivcore", "cuda"]
    assert cmds[2:] == cx.commands(Path("a.cu"), Path("inc"), Path("out.so"))


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc to compile")
def test_one_library_builds_and_records_its_kernels(tmp_path: Path) -> None:
    toolchain, why = find_toolchain(None, ("sm_90",))
    assert toolchain is not None, why
    tuning = ("ATTN_TUNING_ONLY",)
    path, seconds = build.build_variant(toolchain, tmp_path, DECODE, "g1", defines=tuning)
    assert path.is_file() and seconds > 0
    records = facts.parse_ptxas(build.log_path(path).read_text())
    assert {r.kernel for r in records} == {"partition", "merge"}
    assert build.build_variant(toolchain, tmp_path, DECODE, "g1", defines=tuning)[1] == 0.0


@pytest.mark.parametrize("arch", ["../x", "sm90", "sm_90,bogus", "ivcore"])
def test_bad_targets_are_usage_errors_naming_the_option(arch: str, capsys) -> None:
    assert native_main(["build", "--arch", arch]) == 2  # refused before any compiler runs
    assert "--arch must list targets" in capsys.readouterr().err


def test_good_targets_parse() -> None:
    assert parse_archs("--arch", " sm_90, sm_90a,compute_80,ivcore11 ") == (
        "sm_90", "sm_90a", "compute_80", "ivcore11",
    )  # fmt: skip


def test_cli_usage_and_cpu_status(capsys) -> None:
    assert native_main(["bogus"]) == 2
    assert native_main(["status", "--groups", "0"]) == 2
    assert native_main(["status", "--groups", "abc"]) == 2
    assert "--groups must list positive integers, got 'abc'" in capsys.readouterr().err
    import torch

    if not torch.cuda.is_available():
        assert native_main(["status"]) == 3
        assert "no CUDA device" in capsys.readouterr().out


def test_module_runs_as_a_script() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "attn_core.native", "--help"], capture_output=True, text=True
    )
    assert done.returncode == 0 and "status" in done.stdout and "facts" in done.stdout
