"""The native chunked-prefill kernel beside the torch path, SDPA and the compute floor.

    python bench/native_prefill_bench.py [--out results/] [--contexts 100000,250000]
        [--chunks 8192,2048] [--iters 5] [--fma-rows 100000/8192] [--budget-s 400]
        [--libs DIR] [--vllm-sdist vllm-0.6.3.tar.gz] [--quick]

Shape: Qwen3.6 (24 query / 4 KV heads, head 256, fp16), batch 1, block size 16. Per
(context, chunk): the compute floor (attention FLOPs / the fp16 matmul rate measured in this
run), ``native wmma`` and ``native fma`` (the latter only at ``--fma-rows``: it is ~10x slower),
``vllm triton`` (vLLM 0.6.3's ``context_attention_fwd`` from its sdist, ``--vllm-sdist``),
``attn-core torch`` / ``attn-core sdpa`` (``paged_prefix_prefill`` with the torch backend, and
with the sdpa backend, which gathers the context and then runs SDPA), ``sdpa contiguous``
(torch SDPA on pre-gathered K/V expanded to every head, lower-right causal mask). Columns: median
ms, TFLOP/s, share of the matmul rate, time over the floor, transient memory above inputs and
output (``max_memory_allocated`` delta), split count, and the max |error| against the float64
reference on the chunk's first and last rows of 4 query heads (prefill_bench's check). Rows are
printed as measured and ``<out>/native_prefill_bench.json`` is rewritten after each.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable
from typing import Any, Optional

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _args  # noqa: E402
import prefill_bench as pb  # noqa: E402
from _timing import (  # noqa: E402
    device_info,
    matmul_flops,
    median_time_s,
    print_table,
    synchronize,
    transient_peak_bytes,
    write_results,
)
from vllm_prefix_prefill import load_context_attention_fwd, vllm_prefill_fn  # noqa: E402

from attn_core.core.settings import current_overrides  # noqa: E402
from attn_core.native import abi  # noqa: E402
from attn_core.native.loader import load_library  # noqa: E402
from attn_core.native.prefill import PrefillLibrary, device_launch, launch_prefill  # noqa: E402

COLUMNS = ("impl", "context", "chunk", "ms", "tflops", "pct_matmul", "x_floor", "floor_ms",
           "transient_mb", "splits", "max_err", "note")  # fmt: skip


def main(argv: Optional[list[str]] = None) -> None:
    args = _parse(argv)
    device = torch.device("cuda")
    shape = pb.QUICK_SHAPE if args.quick else pb.SHAPE
    t0 = time.monotonic()
    rate = matmul_flops(device, torch.float16, n=8192)
    payload: dict[str, Any] = {
        "device": device_info(device),
        "utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "command": " ".join(sys.argv),
        "shape": {**shape, "block_size": pb.BLOCK_SIZE, "dtype": "float16"},
        "matmul_fp16_flops": rate,
        "rows": [],
    }
    print(f"fp16 matmul rate {rate / 1e12:.1f} TFLOP/s", flush=True)
    libs = {}
    for mma in ("wmma", "fma"):
        settings = current_overrides().native
        lib, status = load_library(PrefillLibrary, mma, settings, device, library_dir=args.libs)
        print(f"native {mma}: {status.detail} {status.path or ''}", flush=True)
        libs[mma] = lib
    vllm_fwd, vllm_why = (None, "no --vllm-sdist")
    if args.vllm_sdist:
        from pathlib import Path

        vllm_fwd, vllm_why = load_context_attention_fwd(Path(args.vllm_sdist))
    print(f"vllm triton: {vllm_why or 'loaded'}", flush=True)
    fma_rows = {tuple(int(x) for x in r.split("/")) for r in args.fma_rows.split(",") if r}
    for ctx in sorted(args.contexts, reverse=True):
        full = pb._case(ctx, max(args.chunks), shape, device, torch.float16)
        check = pb._CheckCase(full)
        ctx_k, ctx_v = pb._context_kv(full)
        for n in sorted(args.chunks, reverse=True):
            if time.monotonic() - t0 > args.budget_s:
                print(f"skipped (budget): context {ctx} chunk {n}", flush=True)
                continue
            case = pb._prefix(full, n)
            m = min(pb.CHECK_ROWS, n)
            want = torch.cat([check.rows(0, m), check.rows(n - m, n)])
            pairs = n * ctx + n * (n + 1) // 2
            base = {"context": ctx, "chunk": n, "flops": 4.0 * shape["num_heads"]
                    * shape["head_size"] * pairs}  # fmt: skip
            out = torch.empty_like(case.query)
            for mma, lib in libs.items():
                if lib is None or (mma == "fma" and (ctx, n) not in fma_rows):
                    continue
                iters = args.iters if mma == "wmma" else 2
                fn, note, splits = _native(lib, case, out)
                _row(
                    payload, args, f"native {mma}", fn, out, want, check, base, iters, note, splits
                )
            if vllm_fwd is not None:
                fn = vllm_prefill_fn(vllm_fwd, case, out)
                _row(payload, args, "vllm triton", fn, out, want, check, base, 3, "0.6.3", None)
            for backend in ("torch", "sdpa"):
                fn, note = pb._attn_core_fn(case, backend, device, out)
                _row(payload, args, f"attn-core {backend}", fn, out, want, check, base, 3, note,
                     None)  # fmt: skip
            k_all, v_all = pb._contiguous_kv(case, ctx_k, ctx_v)
            fn, note = pb._baseline_sdpa(case, k_all, v_all)
            _row(payload, args, "sdpa contiguous", fn, None, want, check, base, 3, note, None)
            del k_all, v_all
        del full, check, ctx_k, ctx_v
        torch.cuda.empty_cache()
    print_table(payload["rows"], COLUMNS)


def _native(lib, case, out) -> tuple[Callable, str, int]:
    q = case.query
    launch = device_launch(
        lib, q.device, query_dtype=q.dtype, kv_cache_dtype="auto", num_seqs=1,
        num_tokens=q.shape[0], num_heads=q.shape[1], num_kv_heads=case.key.shape[1],
        head_size=q.shape[2], max_query_len=case.max_query_len,
        max_context_len=int(case.context_lens[0]),
    )  # fmt: skip
    part_out = part_lse = None
    if launch.num_splits > 1:
        shapes = abi.partials_shapes(q.shape[0], q.shape[1], launch.num_splits, q.shape[2])
        part_out, part_lse = (torch.empty(s, dtype=torch.float32, device=q.device) for s in shapes)
    starts = case.query_start_loc.to(torch.int32).contiguous()
    contexts = case.context_lens.to(torch.int32).contiguous()

    def fn():
        launch_prefill(
            lib, launch, q, case.key, case.value, case.key_cache, case.value_cache,
            case.block_tables, starts, contexts, out, max_query_len=case.max_query_len,
            scale=q.shape[2] ** -0.5, alibi_slopes=None, sliding_window=0, kv_cache_dtype="auto",
            k_scale=1.0, v_scale=1.0, part_out=part_out, part_lse=part_lse,
        )  # fmt: skip
        return out

    note = (
        f"config {launch.config}, {launch.tokens_per_tile} tokens/tile, "
        f"{launch.query_tiles} q tiles"
    )
    return fn, note, launch.num_splits


def _row(payload, args, impl, fn, out, want, check, base, iters, note, splits) -> None:
    row: dict[str, Any] = {"impl": impl, **base, "note": note, "splits": splits}
    device = torch.device("cuda")
    if fn is not None:
        try:
            result = fn()
            synchronize(device)
            row["max_err"] = pb._max_err(result if out is None else out, want, check.query_heads)
            row["ms"] = 1e3 * median_time_s(fn, device, warmup=1, iters=iters)
            peak = transient_peak_bytes(fn, device)
            row["transient_mb"] = None if peak is None else peak / 2**20
        except (RuntimeError, torch.cuda.OutOfMemoryError) as exc:
            row["note"] = f"failed: {str(exc)[:100]}"
    rate = payload["matmul_fp16_flops"]
    row["floor_ms"] = 1e3 * base["flops"] / rate
    if row.get("ms"):
        row["tflops"] = base["flops"] / (row["ms"] / 1e3) / 1e12
        row["pct_matmul"] = 100 * row["tflops"] * 1e12 / rate
        row["x_floor"] = row["ms"] / row["floor_ms"]
    payload["rows"].append(row)
    print(
        f"{impl:<16} ctx {base['context']:>6} chunk {base['chunk']:>5} "
        f"{row.get('ms') or float('nan'):9.2f} ms  {row.get('tflops') or 0:6.1f} TF/s  "
        f"x_floor {row.get('x_floor') or 0:5.2f}  mem {row.get('transient_mb')} MiB  "
        f"err {row.get('max_err')}  {row['note']}",
        flush=True,
    )
    write_results(args.out, "native_prefill_bench.json", payload)


def _parse(argv: Optional[list[str]]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="results")
    p.add_argument("--contexts", type=_args.positive_ints, default=[100000, 250000])
    p.add_argument("--chunks", type=_args.positive_ints, default=[8192, 2048])
    p.add_argument("--fma-rows", default="100000/8192,100000/2048")
    p.add_argument("--iters", type=int, default=5)
    p.add_argument("--budget-s", type=float, default=400.0)
    p.add_argument("--libs", default=None, help="directory of prebuilt prefill libraries")
    p.add_argument("--vllm-sdist", default=None, help="vllm-0.6.3.tar.gz for the Triton peer")
    p.add_argument("--quick", action="store_true", help="tiny shape and lengths")
    args = p.parse_args(argv)
    if args.quick:
        args.contexts, args.chunks, args.fma_rows = [1000], [64], "1000/64"
    return args


if __name__ == "__main__":
    main()
