"""Kernel families as data: what each native library is built from (standard library only).

A *family* is one CUDA C++ source in ``csrc/`` compiled into one shared library per *variant*
(the decode kernel's head-slot counts, the prefill kernel's matrix-tile layers). This module is
everything the build needs to know about a family, so ``setup.py`` (which loads it by path,
without torch) prebuilds every family, and ``python -m attn_core.native build`` does the same.
What a family does at run time (its argument structs, launch, check against the float64
reference) is its binding module beside this one (:mod:`.decode`, :mod:`.prefill`), a subclass
of :class:`attn_core.native.loader.NativeLibrary` that names its :class:`Family`.

Adding a family: a source in ``csrc/`` exporting ``<prefix>_abi_version``, ``<prefix>_platform``
and ``<prefix>_error_string``, one :class:`Family` entry in :data:`FAMILIES`, and its binding.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional


@dataclass(frozen=True)
class Family:
    """One kernel family.

    Attributes:
        name: how the CLI and the status report name it (``"decode"``).
        source: its entry file in ``csrc/``.
        prefix: the C symbol prefix of its exports and of its libraries' file names.
        abi_version: the ``<prefix>_abi_version()`` its binding's structs mirror.
        variants: variant name -> the ``-D`` defines that build it.
        toolchains: toolchain kind -> the variants that compiler builds (default: all).
        flush_denormals: built with fp32 subnormals flushed to zero
            (:meth:`attn_core.native.toolchain.Toolchain.commands` says what it buys).
        cache_prefix: prefix of its build-cache folder (decode's is empty: a cache built before
            the families were described stays valid).
    """

    name: str
    source: str
    prefix: str
    abi_version: int
    variants: dict[str, tuple[str, ...]]
    toolchains: Optional[dict[str, tuple[str, ...]]] = None
    flush_denormals: bool = False
    cache_prefix: str = ""

    def library_name(self, variant: str) -> str:
        """The file name of ``variant``'s library (``ValueError`` for an unknown variant)."""
        if variant not in self.variants:
            raise ValueError(
                f"{self.name} variant must be one of {sorted(self.variants)}, got {variant!r}"
            )
        return f"lib{self.prefix}_{variant}.so"

    def variants_for(self, toolchain_kind: str) -> tuple[str, ...]:
        """The variants a toolchain of ``toolchain_kind`` builds (a prebuild builds these)."""
        if self.toolchains is None or toolchain_kind not in self.toolchains:
            return tuple(self.variants)
        return self.toolchains[toolchain_kind]


DECODE_SLOTS = tuple(range(1, 9))  # query heads one block serves (csrc/paged_decode.cu GROUP)

DECODE = Family(
    name="decode",
    source="paged_decode.cu",
    prefix="attn_native",
    abi_version=4,
    variants={f"g{n}": (f"ATTN_GROUP_SLOTS={n}",) for n in DECODE_SLOTS},
)

# csrc/attn_mma.cuh's MmaKind: the CUDA-core layer, NVIDIA's wmma, CoreX's wmma. NVIDIA's layer
# compiles to nothing but the merge kernels under CoreX, and CoreX's needs CoreX's headers.
PREFILL_MMA_KINDS = {"fma": 0, "wmma": 1, "corex_wmma": 2}

PREFILL = Family(
    name="prefill",
    source="paged_prefill.cu",
    prefix="attn_prefill",
    abi_version=2,
    variants={k: (f"ATTN_PREFILL_MMA={v}",) for k, v in PREFILL_MMA_KINDS.items()},
    toolchains={"nvcc": ("fma", "wmma"), "corex-clang": ("fma", "corex_wmma")},
    flush_denormals=True,
    cache_prefix="prefill-",
)

# The hybrid model's Gated DeltaNet layers (decode step, token-by-token and chunked prefill,
# short convolutions): one library of
# CUDA-core kernels for every dtype and both head sizes (64, 128 as template parameters); it
# builds in ~3 s with nvcc, so there is nothing to gain from variants yet.
GATED_DELTA = Family(
    name="gated_delta",
    source="gated_delta.cu",
    prefix="attn_gdn",
    abi_version=6,
    variants={"fma": ()},
    cache_prefix="gdn-",
)

FAMILIES = {f.name: f for f in (DECODE, PREFILL, GATED_DELTA)}
