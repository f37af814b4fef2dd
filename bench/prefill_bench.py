"""Chunked-prefill benchmark: attn-core's backends beside two baselines, in one run.

    python bench/prefill_bench.py [--out results/] [--quick] [--sweep] [--contexts 32768,100000]
        [--chunks 2048,8192] [--iters 5] [--dtype float16|bfloat16]

Shape: Qwen3.6 (24 query / 4 KV heads, head 256, fp16), batch 1, block size 16. For each
(context, chunk) it times, on pre-built inputs with a preallocated output:

- ``attn-core torch``: the portable path (paged; gathers the context inside the timed call);
- ``attn-core sdpa`` / ``attn-core vendor_flash``: the fused backends where they pass their
  reference check here (paged, gather included);
- ``baseline loop``: a plain torch online-softmax loop over 4096-token key tiles on pre-gathered,
  contiguous K/V, whole chunk at once (what the issue measured at 327 ms / 13 GB);
- ``baseline sdpa``: torch SDPA on contiguous K/V expanded to every head with a
  ``causal_lower_right`` mask (torch >= 2.3; skipped with the reason elsewhere).

Columns: median ms, TFLOP/s and its share of the measured fp16 matmul rate, the time over the
compute floor (FLOPs / measured matmul rate), peak transient memory above the inputs and output
(CUDA), device launches per call, and the max |error| against the shared float64 reference on the
chunk's first and last 32 rows. ``floor_elem_ms`` is the torch path's own floor: 16 bytes of
elementwise traffic per score (module docstring of attn_core.plan_prefill) at the measured copy
bandwidth. ``--sweep`` also times the torch path over (query_tile, key_tile) pairs at the
largest case. ``--quick`` uses tiny sizes that finish on a CPU in seconds. Full results:
``<out>/prefill_bench.json``.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import sys
from collections.abc import Callable
from typing import Any, Optional

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _timing import (  # noqa: E402
    copy_bandwidth,
    device_info,
    kernel_launches,
    matmul_flops,
    median_time_s,
    print_table,
    synchronize,
    transient_peak_bytes,
    write_results,
)

from attn_core import paged_prefix_prefill, plan_prefill, write_to_paged_cache  # noqa: E402
from attn_core.prefill_backends import BACKENDS, ensure_verified  # noqa: E402
from attn_core.prefill_case import PrefillCase, make_prefill_case  # noqa: E402
from attn_core.testing import reference_prefix_prefill  # noqa: E402

SHAPE = {"num_heads": 24, "num_kv_heads": 4, "head_size": 256}
QUICK_SHAPE = {"num_heads": 4, "num_kv_heads": 1, "head_size": 64}
CHECK_ROWS = 32
BASELINE_KEY_TILE = 4096
COLUMNS = (
    "impl", "context", "chunk", "ms", "tflops", "pct_matmul", "x_floor", "floor_ms",
    "floor_elem_ms", "transient_gb", "launches", "max_err", "note",
)  # fmt: skip


def main(argv: Optional[list[str]] = None) -> None:
    args = _parse(argv)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    shape = QUICK_SHAPE if args.quick else SHAPE
    contexts = _ints(args.contexts) or ([300] if args.quick else [32768, 100_000])
    chunks = _ints(args.chunks) or ([64, 200] if args.quick else [2048, 8192])
    args.sweep_at = (max(contexts), max(chunks))  # sweep once, at the largest case
    matmul_rate = matmul_flops(device, torch.float16, n=1024 if args.quick else 8192)
    bandwidth = copy_bandwidth(device, nbytes=(1 << 24) if args.quick else (1 << 30))
    rows: list[dict[str, Any]] = []
    for ctx in contexts:
        for chunk in chunks:
            case = _case(ctx, chunk, shape, device, getattr(torch, args.dtype))
            want = _reference_rows(case)
            rows += _measure_all(case, want, shape, device, matmul_rate, bandwidth, args)
    payload = {
        "device": device_info(device),
        "shape": shape,
        "dtype": args.dtype,
        "matmul_fp16_flops": matmul_rate,
        "copy_bandwidth_bytes_s": bandwidth,
        "rows": rows,
    }
    path = write_results(args.out, "prefill_bench.json", payload)
    print(f"matmul fp16 {matmul_rate / 1e12:.1f} TFLOP/s, copy {bandwidth / 1e9:.0f} GB/s; {path}")
    print_table(rows, COLUMNS)


def _parse(argv: Optional[list[str]]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="results")
    p.add_argument("--quick", action="store_true", help="tiny sizes (CPU smoke run)")
    p.add_argument("--sweep", action="store_true", help="also sweep the torch path's tiles")
    p.add_argument("--contexts", default="")
    p.add_argument("--chunks", default="")
    p.add_argument("--iters", type=int, default=5)
    p.add_argument("--dtype", choices=("float16", "bfloat16"), default="float16")
    return p.parse_args(argv)


def _ints(text: str) -> list[int]:
    return [int(t) for t in text.split(",") if t.strip()]


def _case(
    ctx: int, chunk: int, shape: dict, device: torch.device, dtype: torch.dtype
) -> PrefillCase:
    return make_prefill_case(
        [(ctx, chunk)], shape["num_heads"], shape["num_kv_heads"], shape["head_size"],
        16, dtype, device, seed=ctx + chunk,
    )  # fmt: skip


# --- correctness: the shared float64 reference on the chunk's first and last rows ------------


def _reference_rows(case: PrefillCase) -> torch.Tensor:
    """Reference for rows ``[:CHECK_ROWS]`` and ``[-CHECK_ROWS:]`` of the chunk (float64, CPU).

    The tail rows are computed as their own chunk whose context includes the chunk's earlier
    tokens, written into the cache with write_to_paged_cache (as vLLM does before attention).
    """
    ctx, n = int(case.context_lens[0]), case.query.shape[0]
    m = min(CHECK_ROWS, n)
    head = _one_seq_reference(case, 0, m, ctx)
    pos = torch.arange(ctx, ctx + n, device=case.query.device)
    table = case.block_tables[0].long()
    slots = table[pos // 16] * 16 + pos % 16
    k_cache, v_cache = case.key_cache.clone(), case.value_cache.clone()
    write_to_paged_cache(case.key, case.value, k_cache, v_cache, slots)
    tail_case = dataclasses.replace(case, key_cache=k_cache, value_cache=v_cache)
    tail = _one_seq_reference(tail_case, n - m, n, ctx + n - m)
    return torch.cat([head, tail])


def _one_seq_reference(case: PrefillCase, r0: int, r1: int, ctx: int) -> torch.Tensor:
    kw = case.reference_kwargs()
    kw.update(
        query=case.query[r0:r1], key=case.key[r0:r1], value=case.value[r0:r1],
        query_start_loc=torch.tensor([0, r1 - r0]), context_lens=torch.tensor([ctx]),
    )  # fmt: skip
    return reference_prefix_prefill(**kw)


def _max_err(out: torch.Tensor, want: torch.Tensor) -> float:
    m = want.shape[0] // 2
    got = torch.cat([out[:m], out[-m:]]).double().cpu()
    return float((got - want).abs().max())


# --- what is timed ---------------------------------------------------------------------------


def _measure_all(case, want, shape, device, matmul_rate, bandwidth, args) -> list[dict]:
    ctx, n = int(case.context_lens[0]), case.query.shape[0]
    pairs = n * ctx + n * (n + 1) // 2  # (query, key) pairs attended
    flops = 4.0 * shape["num_heads"] * shape["head_size"] * pairs
    base = {
        "context": ctx,
        "chunk": n,
        "flops": flops,
        "floor_ms": 1e3 * flops / matmul_rate,
        "floor_elem_ms": 1e3 * 16 * shape["num_heads"] * pairs / bandwidth,
    }
    out = torch.empty_like(case.query)
    rows = []
    for name in ("torch", *BACKENDS):
        fn, note = _attn_core_fn(case, name, device, out)
        rows.append(_measure(f"attn-core {name}", fn, out, want, base, device, args, note))
    k_all, v_all = _contiguous_kv(case)
    loop = _baseline_loop(case, k_all, v_all)
    rows.append(_measure("baseline loop", loop, None, want, base, device, args, ""))
    fn, note = _baseline_sdpa(case, k_all, v_all)
    rows.append(_measure("baseline sdpa", fn, None, want, base, device, args, note))
    if args.sweep and (ctx, n) == args.sweep_at:
        rows += _sweep(case, want, base, device, args, out)
    for r in rows:
        if r.get("ms"):
            r["tflops"] = flops / (r["ms"] / 1e3) / 1e12
            r["pct_matmul"] = 100 * r["tflops"] * 1e12 / matmul_rate
            r["x_floor"] = r["ms"] / base["floor_ms"]
    return rows


def _attn_core_fn(case, name, device, out) -> tuple[Optional[Callable], str]:
    q = case.query
    try:
        if name != "torch":
            ensure_verified(name, device, q.dtype, q.shape[2])
        plan = plan_prefill(
            q.shape[1], case.key.shape[1], q.shape[2], q.dtype, case.max_query_len,
            max_context_len=int(case.context_lens[0]), device=device, backend=name,
        )  # fmt: skip
    except (RuntimeError, ValueError) as exc:
        return None, str(exc)[:120]
    note = f"tiles q{plan.query_tile}/k{plan.key_tile} stream{plan.stream_chunk}"
    return (lambda: paged_prefix_prefill(*case.args(), out=out, plan=plan)), note


def _measure(impl, fn, out, want, base, device, args, note) -> dict:
    row = {"impl": impl, **base, "note": note}
    if fn is None:
        return row
    try:
        result = fn()
        synchronize(device)
        row["max_err"] = _max_err(result if out is None else out, want)
        row["ms"] = 1e3 * median_time_s(fn, device, warmup=1, iters=args.iters)
        peak = transient_peak_bytes(fn, device)
        row["transient_gb"] = None if peak is None else peak / 1e9
        row["launches"] = kernel_launches(fn, device)
    except torch.cuda.OutOfMemoryError as exc:  # the baselines may not fit at 100K
        row["note"] = f"out of memory: {str(exc)[:80]}"
    return row


def _contiguous_kv(case: PrefillCase) -> tuple[torch.Tensor, torch.Tensor]:
    """[kvh, ctx + n, hs] context + chunk K/V, gathered outside any timing."""
    from attn_core.testing import tokens_from_cache

    ctx = int(case.context_lens[0])
    k, v = tokens_from_cache(case.key_cache, case.value_cache, case.block_tables[0], ctx)
    dev, dt = case.query.device, case.query.dtype
    k = torch.cat([k.to(dev, dt), case.key]).transpose(0, 1).contiguous()
    v = torch.cat([v.to(dev, dt), case.value]).transpose(0, 1).contiguous()
    return k, v


def _baseline_loop(case, k_all, v_all) -> Callable:
    """Online softmax over 4096-key tiles, whole chunk at once, allocating per tile."""
    q = case.query
    n, heads, hs = q.shape
    kvh = k_all.shape[0]
    ctx = k_all.shape[1] - n
    scale = hs**-0.5

    def run():
        qg = q.view(n, kvh, heads // kvh, hs).permute(1, 2, 0, 3).reshape(kvh, -1, hs)
        m = torch.full((kvh, qg.shape[1], 1), -math.inf, device=q.device)
        l = torch.zeros_like(m)  # noqa: E741
        acc = torch.zeros(kvh, qg.shape[1], hs, device=q.device)
        q_pos = (ctx + torch.arange(n, device=q.device)).repeat(heads // kvh)[:, None]
        for k0 in range(0, k_all.shape[1], BASELINE_KEY_TILE):
            k1 = min(k0 + BASELINE_KEY_TILE, k_all.shape[1])
            s = (qg @ k_all[:, k0:k1].transpose(1, 2)).float() * scale
            s = s.masked_fill(torch.arange(k0, k1, device=q.device)[None] > q_pos, -math.inf)
            m_new = torch.maximum(m, s.amax(-1, keepdim=True))
            p = torch.exp(s - m_new)
            alpha = torch.exp(m - m_new)
            l = l * alpha + p.sum(-1, keepdim=True)  # noqa: E741
            acc = acc * alpha + (p.to(q.dtype) @ v_all[:, k0:k1]).float()
            m = m_new
        res = (acc / l).view(kvh, heads // kvh, n, hs).permute(2, 0, 1, 3).reshape(n, heads, hs)
        return res.to(q.dtype)

    return run


def _baseline_sdpa(case, k_all, v_all) -> tuple[Optional[Callable], str]:
    try:
        from torch.nn.attention.bias import causal_lower_right
    except ImportError:
        return None, f"torch {torch.__version__} has no causal_lower_right"
    q = case.query
    n, heads, hs = q.shape
    group = heads // k_all.shape[0]
    kh = k_all.repeat_interleave(group, 0).unsqueeze(0)  # contiguous per-head K/V, untimed
    vh = v_all.repeat_interleave(group, 0).unsqueeze(0)
    mask = causal_lower_right(n, k_all.shape[1])

    def run():
        qh = q.transpose(0, 1).unsqueeze(0)
        o = torch.nn.functional.scaled_dot_product_attention(qh, kh, vh, attn_mask=mask)
        return o[0].transpose(0, 1)

    return run, "K/V expanded to every head before timing"


def _sweep(case, want, base, device, args, out) -> list[dict]:
    q = case.query
    rows = []
    small = case.max_query_len < 1024  # --quick sizes
    # Small tiles (q256/k1024: a 12.6 MB score tile at the Qwen shape) keep the elementwise
    # passes in the H200's 50 MB L2 but issue ~14 launches per 12.6 M scores; large ones stream
    # through HBM with few launches. Which wins is what the sweep measures.
    for tq in (16, 64) if small else (256, 512, 1024, 2048, 4096, 8192):
        for tk in (32, 256) if small else (512, 1024, 2048, 4096, 8192):
            if tq > case.max_query_len:
                continue
            plan = plan_prefill(
                q.shape[1], case.key.shape[1], q.shape[2], q.dtype, case.max_query_len,
                device=device, backend="torch", query_tile=tq, key_tile=tk,
                budget_bytes=1 << 40,
            )  # fmt: skip
            fn = lambda plan=plan: paged_prefix_prefill(*case.args(), out=out, plan=plan)  # noqa: E731
            note = f"workspace {plan.workspace_bytes / 1e9:.2f} GB"
            rows.append(_measure(f"sweep q{tq}/k{tk}", fn, out, want, base, device, args, note))
    return rows


if __name__ == "__main__":
    main()
