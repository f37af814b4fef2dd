"""What the status commands say about the native prefill: each MMA variant's library, its
verdict for a shape, and the plan a call of that shape resolves to (with its reason).

``python -m attn_core.native status`` and ``engine-patch status`` both print these lines, so
the two commands cannot disagree.
"""

from __future__ import annotations

from typing import Any

import torch

from attn_core.core.settings import current_overrides
from attn_core.core.shapes import AttentionShape
from attn_core.native import abi
from attn_core.native import split as ps
from attn_core.native.loader import load_library
from attn_core.native.loader import verify as verify_library
from attn_core.native.prefill import PrefillLibrary
from attn_core.prefill.plan import PrefillLengths
from attn_core.prefill.plan_native import VARIANTS, NativePrefillPlan
from attn_core.runtime.prefill import prefill_plan_for

DTYPE_KINDS = {torch.float16: abi.FLOAT16, torch.bfloat16: abi.BFLOAT16}


def native_prefill_report(
    shape: AttentionShape, device: torch.device, *, verify: bool = True
) -> list[dict[str, Any]]:
    """One row per MMA variant: ``variant``, ``library`` (how it was found, or why not),
    ``verified`` (True / False / None: not checked) and ``detail``, and the large and 32 KiB
    tiles' resources where the library has them."""
    settings = current_overrides().native
    device = torch.device(device)
    rows = []
    for variant in VARIANTS:
        lib, status = load_library(PrefillLibrary, variant, settings, device)
        how = f"{status.detail}: {status.path}" if lib is not None else status.detail
        row: dict[str, Any] = {"variant": variant, "library": how, "verified": None, "detail": ""}
        if lib is not None and verify and shape.dtype in DTYPE_KINDS:
            verdict = verify_library(lib, device, shape)
            row["verified"], row["detail"] = verdict.ok, verdict.detail
        if lib is not None and shape.dtype in DTYPE_KINDS:
            kind = DTYPE_KINDS[shape.dtype]
            for config, name in ((ps.CONFIG_LARGE, "large"), (ps.CONFIG_32K, "32k")):
                f = lib.config_facts(config, kind, kind, abi.head_bucket(shape.head_size))
                row[f"{name}_tile"] = (
                    f"{f.rows}x{f.keys}, {f.threads} threads, {f.smem_bytes} B smem, "
                    f"{f.num_regs} regs, {f.local_bytes} B spill, {f.blocks_per_sm}/SM"
                    if f is not None
                    else "none"
                )
        rows.append(row)
    return rows


def prefill_plan_row(
    shape: AttentionShape, device: torch.device, chunk: int, context: int
) -> dict[str, Any]:
    """The resolved plan of one call of ``chunk`` new tokens over ``context`` cached ones; a
    forced backend that cannot serve it is a row saying why (status reports, it does not
    raise)."""
    try:
        plan = prefill_plan_for(shape, PrefillLengths(chunk, context), torch.device(device))
    except ValueError as exc:
        return {
            "context": context, "chunk": chunk, "backend": "unavailable", "variant": "-",
            "splits": "-", "query_tile": "-", "key_tile": "-", "stream_chunk": "-",
            "workspace_bytes": 0, "price_ms": None, "reason": str(exc),
        }  # fmt: skip
    row: dict[str, Any] = {"context": context, "chunk": chunk, "backend": plan.backend}
    if isinstance(plan, NativePrefillPlan):
        row.update(variant=plan.variant, splits=plan.num_splits, query_tile=plan.tokens_per_tile)
        row.update(key_tile="-", stream_chunk="-")
    else:
        row.update(variant="-", splits="-", query_tile=plan.query_tile)
        row.update(key_tile=plan.key_tile, stream_chunk=plan.stream_chunk)
    row["workspace_bytes"] = plan.workspace_bytes
    row["price_ms"] = round(plan.cost.seconds * 1e3, 3) if plan.cost is not None else None
    row["reason"] = plan.backend_reason
    return row


def status_lines(
    shape: AttentionShape, device: torch.device, chunk: int, context: int
) -> list[str]:
    """The native CLI's prefill section."""
    lines = []
    if torch.device(device).type == "cuda":
        for row in native_prefill_report(shape, device):
            state = {True: "verified", False: "NOT verified", None: "not checked"}[row["verified"]]
            lines.append(
                f"native prefill {row['variant']}: {row['library']}; {state} {row['detail']}"
            )
            for tile in ("large_tile", "32k_tile"):
                if tile in row:
                    lines.append(f"  {tile.replace('_', ' ')}: {row[tile]}")
    plan = prefill_plan_row(shape, device, chunk, context)
    lines.append(
        f"prefill plan on {device} ({shape.num_heads}/{shape.num_kv_heads} heads, head "
        f"{shape.head_size}, {shape.dtype}, block {shape.block_size}; {chunk} new tokens over "
        f"{context}): {plan['backend']}"
        + (f" ({plan['variant']}, {plan['splits']} split(s))" if plan["variant"] != "-" else "")
        + f": {plan['reason']}"
    )
    return lines
