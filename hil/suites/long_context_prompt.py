"""Long-context suite, whole-prompt case: a long prompt prefilled chunk by chunk by the native
kernel (``paged_prefix_prefill(backend="native")``) and by the torch path, compared.

The prompt's K/V are in the paged cache already (a random case with permuted blocks, as vLLM
leaves it after writing each chunk); chunk ``i`` takes its queries at random and its own K/V
from the cache, with ``i * chunk`` tokens of context. Every chunk's native output is compared
with the torch path's (relative L2 over the whole prompt); both are timed with CUDA events and
summed. Only on a GPU; a device where no native variant is built and verified is a skipped
record naming why (the device-facts suite says which variant fails and how).
"""

from __future__ import annotations

import math

import torch

NATIVE_MISSING = "no MMA variant is built and verified"


def prompt_record(prompt_len: int, chunk: int, shape, dtype, device: str, seed: int) -> dict:
    rec = {
        "kind": "prompt",
        "backend": "native vs torch",
        "context_len": prompt_len,
        "query_len": chunk,
        "num_heads": shape.num_heads,
        "num_kv_heads": shape.num_kv_heads,
        "head_size": shape.head_size,
        "block_size": shape.block_size,
        "dtype": str(dtype).replace("torch.", ""),
    }
    if device != "cuda":
        rec["skipped"] = f"the whole-prompt native prefill needs a CUDA device, got {device}"
        return rec
    try:
        rec.update(_compare(prompt_len, chunk, shape, dtype, seed))
    except ValueError as exc:
        if NATIVE_MISSING not in str(exc):
            raise
        rec["skipped"] = f"native prefill unavailable here: {exc}"
    return rec


def _compare(prompt_len: int, chunk: int, shape, dtype, seed: int) -> dict:
    import attn_core
    from attn_core.reference import make_paged_case

    h, kvh, d, bs = shape.num_heads, shape.num_kv_heads, shape.head_size, shape.block_size
    case = make_paged_case([prompt_len], h, kvh, d, bs, dtype, "cuda", seed=seed)
    g = torch.Generator().manual_seed(seed + 2)
    seconds = {"native": 0.0, "torch": 0.0}
    diff = ref = 0.0
    for start in range(0, prompt_len, chunk):
        n = min(chunk, prompt_len - start)
        pos = torch.arange(start, start + n, device="cuda")
        blocks, off = case.block_tables[0, pos // bs].long(), pos % bs
        key = case.key_cache[blocks, :, :, off, :].reshape(n, kvh, d)
        value = case.value_cache[blocks, :, :, off]
        query = torch.randn(n, h, d, generator=g).to(dtype).to("cuda")
        lens = [torch.tensor(v, dtype=torch.int32, device="cuda") for v in
                ([0, n], [start + n], [start])]  # fmt: skip
        outs = {}
        for backend in ("native", "torch"):
            out = torch.full_like(query, math.nan)
            begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            begin.record()
            attn_core.paged_prefix_prefill(
                query, key, value, case.key_cache, case.value_cache, case.block_tables,
                lens[0], lens[1], lens[2], n, out=out, backend=backend,
            )  # fmt: skip
            end.record()
            end.synchronize()
            seconds[backend] += begin.elapsed_time(end) / 1e3
            outs[backend] = out.double()
        diff += float((outs["native"] - outs["torch"]).pow(2).sum())
        ref += float(outs["torch"].pow(2).sum())
        if not bool(torch.isfinite(outs["native"]).all()):
            raise RuntimeError(f"native prefill wrote non-finite values in chunk at {start}")
    return {
        "rel_error": math.sqrt(diff / max(ref, 1e-30)),
        "native_s": seconds["native"],
        "torch_s": seconds["torch"],
    }
