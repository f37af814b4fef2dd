"""The state of attn-core's native decode kernel for ``engine-patch status``.

Says whether the kernel's library for the model's GQA group is built (prebuilt, cached or built
now) or why not (no toolkit, a failed build, no GPU), which compiler and target made it, what
the driver reports for the model's kernel (registers, shared memory, spills, resident blocks per
SM), and whether it matched the float64 reference on this device - the condition under which
attn-core's decode uses it.
"""

from __future__ import annotations

from typing import Any

import torch

from attn_core.core.settings import current_overrides
from attn_core.core.shapes import AttentionShape
from attn_core.native import abi
from attn_core.native.decode import DecodeLibrary, group_slots, variant_for
from attn_core.native.loader import load_library
from attn_core.native.loader import verify as verify_library
from attn_core.native.toolchain import find_toolchain


def native_decode_report(
    shape: AttentionShape, device: torch.device, *, verify: bool
) -> dict[str, Any]:
    """A flat dict (``--json``); ``verify`` runs the one-time reference check on the device."""
    settings = current_overrides().native
    toolchain, why = find_toolchain(settings.cuda_home, (settings.arch,) if settings.arch else None)
    report: dict[str, Any] = {
        "group": shape.group,
        "head_slots": group_slots(shape.group),
        "compiler": f"{toolchain.kind} {toolchain.version}" if toolchain else why,
        "available": False,
        "detail": None,
        "verified": None,
    }
    lib, status = load_library(DecodeLibrary, variant_for(shape.group), settings, device)
    report.update(
        available=lib is not None,
        detail=status.detail,
        library=status.path,
        built_by=status.toolchain,
        platform=status.platform,
    )
    if lib is None:
        return report
    query = abi.QUERY_KINDS[shape.dtype]
    cache = abi.cache_kind(shape.dtype, shape.kv_cache_dtype)
    facts = lib.kernel_info(
        "partition", query, cache, abi.head_bucket(shape.head_size), shape.group
    )
    report.update(
        registers=facts.num_regs,
        shared_mem_bytes=facts.smem_bytes,
        spill_bytes=facts.local_bytes,
        threads_per_block=facts.threads_per_block,
        blocks_per_sm=facts.blocks_per_sm,
    )
    if verify:
        verdict = verify_library(lib, device, shape)
        report.update(verified=verdict.ok, verification=verdict.detail)
    return report
