"""ci/clang_library.py's two readings of tool output: clang 16's fatbinary arguments in CUDA
13's spelling, and ptxas's spill report (the lines recorded from a real build, 2026-12-03)."""

from __future__ import annotations

from ci_scripts import load_ci_script


def _module():
    return load_ci_script("clang_library")


def test_clang_16s_images_become_image3_and_the_rest_passes_through():
    clang_argv = ["-64", "--create", "/tmp/a.fatbin",
                  "--image=profile=sm_90,file=/tmp/d/paged_decode-sm_90.cubin",
                  "--image=profile=compute_90,file=/tmp/e/paged_decode-sm_90.s"]  # fmt: skip
    assert _module().image3_args(clang_argv) == [
        "-64", "--create", "/tmp/a.fatbin",
        "--image3=kind=elf,sm=90,file=/tmp/d/paged_decode-sm_90.cubin",
        "--image3=kind=ptx,sm=90,file=/tmp/e/paged_decode-sm_90.s",
    ]  # fmt: skip


def test_only_the_kernels_that_spill_are_reported():
    log = (
        "ptxas info    : Function properties for _ZN4attn16partition_kernelILi1ELi1ELi256ELi6EEEv\n"
        "    256 bytes stack frame, 256 bytes spill stores, 376 bytes spill loads\n"
        "ptxas info    : Used 255 registers, used 1 barriers, 39168 bytes smem\n"
        "ptxas info    : Function properties for _ZN4attn16partition_kernelILi1ELi3ELi256ELi6EEEv\n"
        "    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads\n"
    )
    assert _module().spilling_kernels(log) == [
        ("_ZN4attn16partition_kernelILi1ELi1ELi256ELi6EEEv", 256)
    ]
