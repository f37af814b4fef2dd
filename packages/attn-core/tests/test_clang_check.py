"""ci/clang_check.py's reading of clang's PTX: the property it gates on (no local memory in any
kernel) must be found wherever it occurs and only there."""

from __future__ import annotations

from ci_scripts import load_ci_script


def _module():
    return load_ci_script("clang_check")


def _entry(name: str, body: str) -> str:
    return f".visible .entry {name}(\n\t.param .align 8 .b8 {name}_param_0[232]\n)\n{{\n{body}}}\n"


CLEAN = "\t.reg .b32 %r<9>;\n\tld.global.v4.u32 {%r1, %r2, %r3, %r4}, [%rd1];\n\tret;\n"
DEPOT = "\t.local .align 16 .b8 __local_depot3[48];\n\tmov.u64 %SPL, __local_depot3;\n"
SPILL = "\tst.local.u32 [%rd9], %r1;\n"


def test_local_memory_is_found_in_the_kernel_that_has_it() -> None:
    check = _module()
    ptx = "//\n.version 7.8\n.target sm_80\n" + _entry("_Za", CLEAN) + _entry("_Zb", DEPOT)
    ptx += _entry("_Zc", CLEAN + SPILL) + _entry("_Zd", CLEAN)
    assert check.kernels_with_local_memory(ptx) == ["_Zb", "_Zc"]


def test_clean_ptx_has_no_local_memory_and_every_entry_is_counted() -> None:
    check = _module()
    ptx = "".join(_entry(f"_Z{i}", CLEAN) for i in range(check.KERNELS_PER_LIBRARY))
    assert check.kernels_with_local_memory(ptx) == []
    assert len(check._ENTRY.findall(ptx)) == check.KERNELS_PER_LIBRARY


def test_weak_entries_are_kernels_too() -> None:
    check = _module()
    assert check.kernels_with_local_memory(_entry("_Zw", DEPOT).replace(".visible", ".weak")) == [
        "_Zw"
    ]
