"""device-facts ``prefill`` section: which native prefill MMA variant builds and verifies on
this device, and the attention rate it reaches.

For each variant (``wmma``, CoreX's ``corex_wmma``, the CUDA-core ``fma``): the library is
loaded or built (``attn_core.native.prefill_library.load_prefill``), checked against the float64
reference through the verify-once registry (Qwen3.6's shape: 24 q / 4 KV heads, head 256, fp16,
block 16), and where it verified, one chunk over a long context is timed (CUDA events, median);
the rate is the attention FLOPs (``attn_core.prefill.cost.prefill_work``) over that time, the
number ``attn_core.prefill.cost.EFFICIENCY`` is to be re-fitted from. A variant that does not
build or verify is a row saying why, not a failed suite.
"""

from __future__ import annotations

import math

import torch
from device_facts_rates import event_median_s
from device_facts_record import measured

SHAPE = (24, 4, 256, 16)  # heads, KV heads, head size, block size (Qwen3.6 full attention)


def variant_row(variant: str, case, flops: float, context: int, repeats: int) -> dict:
    from attn_core.core.shapes import AttentionShape
    from attn_core.native.prefill_launch import native_prefix_prefill
    from attn_core.native.prefill_library import load_prefill
    from attn_core.native.prefill_verify import verify_native_prefill

    device = case.query.device
    lib, how = load_prefill(variant, device)
    row: dict = {"builds": lib is not None, "library": how}
    if lib is None:
        return row
    verdict = verify_native_prefill(lib, device, AttentionShape(*SHAPE, torch.float16))
    row.update(verified=verdict.ok, detail=verdict.detail)
    if not verdict.ok:
        return row
    out = torch.full_like(case.query, math.nan)

    def call() -> None:
        native_prefix_prefill(lib, *case.args(), None, max_context_len=context, out=out)

    seconds = event_median_s(call, repeats, warmup=1)
    row.update(seconds=seconds, tflops=round(flops / seconds / 1e12, 2))
    return row


def prefill_facts(chunk: int, context: int, repeats: int, device: torch.device) -> dict:
    from attn_core.core.shapes import AttentionShape
    from attn_core.prefill.cost import prefill_work
    from attn_core.prefill.plan_native import VARIANTS
    from attn_core.reference import make_prefill_case

    heads, kv_heads, head_size, block = SHAPE
    case = make_prefill_case([(context, chunk)], heads, kv_heads, head_size, block,
                             torch.float16, device)  # fmt: skip
    flops = prefill_work(AttentionShape(*SHAPE, torch.float16), 1, chunk, context).flops
    rows = {}
    for variant in VARIANTS:
        try:
            rows[variant] = variant_row(variant, case, flops, context, repeats)
        except Exception as exc:  # one variant's failure is data about it
            rows[variant] = {"builds": False, "library": f"raised {type(exc).__name__}: {exc}"}
    method = (
        "attn_core.native load_prefill (build allowed) + verify_native_prefill against the "
        f"float64 reference; timed: native_prefix_prefill, 24 q / 4 kv heads, head 256, fp16, "
        f"block 16, {chunk} new tokens over {context} cached, CUDA events, median of {repeats}; "
        "tflops = attention FLOPs (4 x head x scores x heads) / seconds"
    )
    return {"native_prefill": measured(rows, "", method)}
