"""device-facts ``prefill`` section: which native prefill MMA variant builds and verifies on
this device, and the attention rate it reaches.

For each variant (``wmma``, CoreX's ``corex_wmma``, the CUDA-core ``fma``): the library is
loaded or built (``attn_core.native.loader.load_library``), checked against the float64
reference through the verify-once registry (Qwen3.6's shape: 24 q / 4 KV heads, head 256, fp16,
block 16), and where it verified, one chunk over a long context is timed (CUDA events, median);
the rate is the attention FLOPs (``attn_core.prefill.cost.prefill_work``) over that time, the
number ``attn_core.prefill.cost.EFFICIENCY`` is to be re-fitted from. A variant that does not
build or verify is a row saying why, not a failed suite.
"""

from __future__ import annotations

import torch
from device_facts_rates import event_median_s
from device_facts_record import measured

SHAPE = (24, 4, 256, 16)  # heads, KV heads, head size, block size (Qwen3.6 full attention)


def variant_row(variant: str, case, flops: float, context: int, repeats: int) -> dict:
    from attn_core.core.settings import current_overrides
    from attn_core.core.shapes import AttentionShape
    from attn_core.native.loader import load_library, verify
    from attn_core.native.prefill import PrefillLibrary, device_launch, run_case

    device = case.query.device
    lib, status = load_library(PrefillLibrary, variant, current_overrides().native, device)
    how = f"{status.detail}: {status.path}" if lib is not None else status.detail
    row: dict = {"builds": lib is not None, "library": how}
    if lib is None:
        return row
    verdict = verify(lib, device, AttentionShape(*SHAPE, torch.float16))
    row.update(verified=verdict.ok, detail=verdict.detail)
    if not verdict.ok:
        return row
    tokens, heads, head_size = case.query.shape
    launch = device_launch(
        lib, device, query_dtype=case.query.dtype, kv_cache_dtype="auto", num_seqs=1,
        num_tokens=tokens, num_heads=heads, num_kv_heads=case.key_cache.shape[1],
        head_size=head_size, max_query_len=case.max_query_len, max_context_len=context,
    )  # fmt: skip

    def call() -> None:
        run_case(lib, case, launch=launch)

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
        "attn_core.native load_library (build allowed) + verify against the "
        "float64 reference; timed: the device's own launch (device_launch), "
        f"24 q / 4 kv heads, head 256, fp16, "
        f"block 16, {chunk} new tokens over {context} cached, CUDA events, median of {repeats}; "
        "tflops = attention FLOPs (4 x head x scores x heads) / seconds"
    )
    return {"native_prefill": measured(rows, "", method)}
