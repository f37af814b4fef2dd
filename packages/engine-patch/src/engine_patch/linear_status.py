"""``status``'s linear-attention part: each linear op found, what serves it, the native
library's verdicts, and the model's layer plan."""

from __future__ import annotations

from typing import Any, Optional

import torch
from tabulate import tabulate

from attn_core.core import verify_once
from attn_core.native.gated_delta import GatedDeltaLibrary
from engine_patch import linear_ops
from engine_patch.layer_plan import layer_plan, ranges
from engine_patch.state import STATE

KIND = GatedDeltaLibrary.VERIFY_KIND  # "native_gated_delta"


def _verdict(device: torch.device) -> tuple[str, str]:
    """(what attn-core runs for linear ops on ``device``, the native library's verdicts)."""
    if device.type != "cuda":
        return "torch", f"no {KIND} check: the native library needs a CUDA device"
    kept = [(c, v) for k, d, c, v in verify_once.verdicts() if k == KIND and d == str(device)]
    if not kept:
        return "native where verified, else torch", f"{KIND}: not checked yet (on first call)"
    ok = [c for c, v in kept if v.ok]
    serves = "native" if ok and len(ok) == len(kept) else ("native/torch" if ok else "torch")
    lines = [f"{c}: {'verified' if v.ok else 'NOT verified'}" for c, v in kept]
    return serves, f"{KIND}: " + "; ".join(lines)


def linear_report(device: torch.device) -> list[dict[str, Any]]:
    """One row per linear op found in this process's loaded modules."""
    linear_ops.install()  # a target loaded since registration, before the hook, is found now
    serves, verdict = _verdict(device)
    rows = []
    for op in STATE.linear_ops.values():
        if op.serves == linear_ops.SERVED:
            now = serves
        elif op.serves == linear_ops.REFUSED:
            now = "refused (Triton on Iluvatar)"
        else:
            now = "untouched"
        rows.append(
            {
                "op": op.target,
                "convention": op.convention,
                "triton": op.triton,
                "serves": now,
                "verdict": verdict if op.serves == linear_ops.SERVED else "-",
                "reason": op.reason,
                "also_replaced": list(op.holders),
            }
        )
    return rows


def plan_or_default(plan: Optional[dict[str, Any]]) -> dict[str, Any]:
    return plan if plan is not None else layer_plan()


def render_linear(rows: list[dict[str, Any]], plan: dict[str, Any]) -> list[str]:
    parts = []
    if rows:
        cols = ("op", "convention", "triton", "serves", "verdict", "reason")
        parts.append("linear-attention ops found (attn-core serves the matched ones):")
        parts.append(tabulate([[r[c] for c in cols] for r in rows], headers=cols))
    else:
        parts.append("linear-attention ops found: none in this process's loaded modules")
    parts.append(
        f"layer plan ({plan['source']}): {plan['num_layers']} layers; "
        f"linear attention {len(plan['linear'])} ({ranges(plan['linear'])}); "
        f"full attention {len(plan['full'])} ({ranges(plan['full'])})"
    )
    return parts
