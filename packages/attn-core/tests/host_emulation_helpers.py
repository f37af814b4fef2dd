"""The CoreX source's kernels (decode, prefill, Gated DeltaNet) built for the host CPU
(ci/host_emulation.py) and called through attn-core's own loaders and launchers, on CPU tensors.

Libraries are built once per machine and source under ``ATTN_CORE_EMULATION_CACHE`` (default
``~/.cache/attn_core/host-emulation``): each takes 7-35 s to compile.
"""

from __future__ import annotations

import ctypes
import os
from pathlib import Path
from typing import Optional

import pytest
import torch
from ci_scripts import load_ci_script
from native_helpers import run_native
from native_prefill_helpers import poison_past_context
from native_prefill_helpers import run_native as run_prefill

from attn_core.native.decode import DecodeLibrary
from attn_core.native.gated_delta import GatedDeltaLibrary
from attn_core.native.loader import NativeLibrary
from attn_core.native.prefill import PrefillLibrary
from attn_core.native.split import group_slots
from attn_core.reference import (
    PagedCase,
    PrefillCase,
    make_paged_case,
    make_prefill_case,
    poison_tails,
)


def builder():
    """ci/host_emulation.py as a module."""
    return load_ci_script("host_emulation")


def asan() -> bool:
    """Whether this process builds its libraries with AddressSanitizer
    (``ATTN_CORE_EMULATION_ASAN=1``: test_native_emulation_asan.py runs a subset that way, in
    a process with the ASan runtime preloaded)."""
    return os.environ.get("ATTN_CORE_EMULATION_ASAN") == "1"


def cache_dir() -> Path:
    default = Path.home() / ".cache" / "attn_core" / "host-emulation"
    return Path(os.environ.get("ATTN_CORE_EMULATION_CACHE") or default)


def set_reverse_order(lib: NativeLibrary, reverse: bool) -> None:
    """Run each phase's threads of ``lib``'s emulated launches in reverse index order (True) or
    in order (the emulator's own entry point, ci/host_cuda/cuda_runtime.h)."""
    control = lib._lib.attn_host_emulation_set_order
    control.argtypes = [ctypes.c_int]
    control.restype = None
    control(int(reverse))


# (library name, head slots) -> the host library, built once per process
_LIBRARIES: dict[tuple[str, int], NativeLibrary] = {}


def host_compiler() -> str:
    """The host C++ compiler the emulated libraries are built with. Without one: a skip on a
    laptop, a failure under ``CI=true`` (CI installs g++ and clang: none means a broken setup)."""
    found = builder().find_compiler()
    if found is None:
        why = "needs a host C++ compiler (g++ or clang++) for the emulated kernels"
        if os.environ.get("CI") == "true":
            pytest.fail(why)
        pytest.skip(why)
    return found


def _emulated(name: str, library_class: type, slots: int = 1):
    """The host library ``name`` (built on first use; with ASan when :func:`asan`)."""
    if (name, slots) not in _LIBRARIES:
        path = builder().build(name, cache_dir(), slots=slots, compiler=host_compiler(),
                               asan=asan())  # fmt: skip
        _LIBRARIES[name, slots] = library_class(path)
    return _LIBRARIES[name, slots]


def emulated_decode(slots: int) -> DecodeLibrary:
    """The host decode library for ``slots`` head slots."""
    return _emulated("decode", DecodeLibrary, slots)


def host_case(lens, heads, kv_heads, head_size, block_size, dtype, **kwargs) -> PagedCase:
    """A CPU case with NaN in every cache slot past each sequence's end."""
    case = make_paged_case(lens, heads, kv_heads, head_size, block_size, dtype, "cpu", **kwargs)
    poison_tails(case)
    return case


def run_emulated(
    case: PagedCase, num_partitions: int, partition_size: int, *, reverse: bool = False, **kwargs
) -> torch.Tensor:
    """:func:`native_helpers.run_native` on the host library the case's GQA group needs, each
    phase's threads in reverse order when ``reverse``."""
    lib = emulated_decode(group_slots(case.query.shape[1] // case.key_cache.shape[1]))
    set_reverse_order(lib, reverse)
    try:
        return run_native(case, num_partitions, partition_size, lib=lib, stream=0, **kwargs)
    finally:
        set_reverse_order(lib, False)


def emulated_gated_delta() -> GatedDeltaLibrary:
    """The host Gated DeltaNet library (~1 s to build)."""
    return _emulated("gated_delta", GatedDeltaLibrary)


def both_orders(run, lib: Optional[NativeLibrary] = None):
    """``run()``'s tensors, checked bit-equal with each phase's threads in reverse order (of
    ``lib``'s launches: the CoreX Gated DeltaNet build unless given)."""
    lib = lib or emulated_gated_delta()
    first = run()
    set_reverse_order(lib, True)
    try:
        again = run()
    finally:
        set_reverse_order(lib, False)
    for a, b in zip(first, again, strict=True):
        assert torch.equal(a.view(torch.uint8), b.view(torch.uint8)), "thread order changed bits"
    return first


def emulated_gated_delta_nvidia() -> GatedDeltaLibrary:
    """The Gated DeltaNet library as nvcc builds it (no ``__ILUVATAR__``): the 16-bit pair on
    the matrix unit and asynchronous copies, their PTX emulated (ci/host_cuda/attn_emu_warp.h,
    cuda_pipeline.h); ~3 s to build."""
    return _emulated("gated_delta_nvidia", GatedDeltaLibrary)


def emulated_prefill() -> PrefillLibrary:
    """The host prefill library."""
    return _emulated("prefill", PrefillLibrary)


def host_prefill_case(seqs, heads, kv_heads, head_size, block_size, dtype, **kw) -> PrefillCase:
    """A CPU case with NaN in every cache slot at or past each sequence's context."""
    case = make_prefill_case(seqs, heads, kv_heads, head_size, block_size, dtype, "cpu", **kw)
    poison_past_context(case)
    return case


def run_emulated_prefill(
    case: PrefillCase,
    config: int,
    num_splits: int,
    *,
    reverse: bool = False,
    scale: Optional[float] = None,
) -> torch.Tensor:
    """:func:`native_prefill_helpers.run_native` on the host library, at a forced tile
    configuration and split (then nothing asks a device anything)."""
    lib = emulated_prefill()
    set_reverse_order(lib, reverse)
    try:
        return run_prefill(
            case, "fma", config=config, num_splits=num_splits, scale=scale, lib=lib, stream=0
        )
    finally:
        set_reverse_order(lib, False)
