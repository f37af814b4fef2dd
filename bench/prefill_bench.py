"""Chunked-prefill benchmark: attn-core's backends beside two baselines, in one run.

    python bench/prefill_bench.py [--out results/] [--quick] [--contexts 100000,32768]
        [--chunks 8192,2048] [--iters 5] [--slow-iters 2] [--budget-s 120]
        [--sweep] [--sweep-budget-s 60] [--dtype float16|bfloat16]

Shape: Qwen3.6 (24 query / 4 KV heads, head 256, fp16), batch 1, block size 16. For each
(context, chunk) it times, on pre-built inputs with a preallocated output:

- ``attn-core torch``: the portable path (paged; gathers the context inside the timed call);
- ``attn-core sdpa`` / ``attn-core vendor_flash``: the fused backends where they pass their
  reference check here (paged, gather included);
- ``baseline loop``: a plain torch online-softmax loop over 4096-token key tiles on pre-gathered,
  contiguous K/V, whole chunk at once (what the issue measured at 327 ms / 13 GB); timed with
  ``--slow-iters`` iterations and no warm-up beyond the correctness call;
- ``baseline sdpa``: torch SDPA on contiguous K/V expanded to every head with a
  ``causal_lower_right`` mask (torch >= 2.3; skipped with the reason elsewhere).

The ``attn-core`` rows call ``attn_core.paged_prefix_prefill`` with the plan that
``attn_core.prefill_plan_for`` makes for the row's backend (``PrefillOverrides(backend=...)``).

Columns: median ms, TFLOP/s and its share of the measured fp16 matmul rate, the time over the
compute floor (FLOPs / measured matmul rate), peak transient memory above the inputs and output
(CUDA), device launches per call, and the max |error| against the shared float64 reference on the
chunk's first and last ``CHECK_ROWS`` rows, for the first and last query head of the first and
last KV head (the CPU reference's cost grows with heads x keys; see ``_CheckCase``).
``floor_elem_ms`` is the torch path's own floor: ``ELEMENTWISE_BYTES_PER_SCORE`` (14) bytes of
elementwise traffic per score (derived in the module docstring of ``attn_core.prefill.plan``, the
home of ``plan_prefill``) at the measured copy bandwidth.

Running order and time: each row is printed (flushed) as soon as it is measured and
``<out>/prefill_bench.json`` is rewritten after every row, so a killed run keeps what it measured.
The largest context and chunk run first (the issue's target case), the table at the end is sorted.
One case is built per context with the largest chunk; smaller chunks are its prefixes, so the
float64 reference of the chunk's first rows is computed once per context. ``--budget-s`` stops
starting new rows (and references) once that many seconds have passed since start, and lists
what it skipped; ``--sweep`` then times the torch path over (query_tile, key_tile) pairs at the
largest case within its own ``--sweep-budget-s``. ``--quick`` uses tiny sizes that finish on a
CPU in seconds.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import sys
import time
from collections.abc import Callable
from typing import Any, Optional

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _args  # noqa: E402
import _run  # noqa: E402
from _run import say  # noqa: E402
from _timing import (  # noqa: E402
    copy_bandwidth,
    device_info,
    kernel_launches,
    matmul_flops,
    median_time_s,
    print_table,
    synchronize,
    transient_peak_bytes,
)

from attn_core import (  # noqa: E402  # noqa: E402
    AttentionShape,
    PrefillLengths,
    paged_prefix_prefill,
    prefill_plan_for,
    write_to_paged_cache,
)
from attn_core.core.settings import PrefillOverrides  # noqa: E402
from attn_core.device.capabilities import FUSED_ORDER, probe_capabilities  # noqa: E402
from attn_core.prefill.plan import ELEMENTWISE_BYTES_PER_SCORE  # noqa: E402
from attn_core.reference import (  # noqa: E402  # noqa: E402
    PrefillCase,
    make_prefill_case,
    reference_prefix_prefill,
    tokens_from_cache,
)
from attn_core.runtime.prefill import verify_prefill_backend  # noqa: E402

SHAPE = {"num_heads": 24, "num_kv_heads": 4, "head_size": 256}
QUICK_SHAPE = {"num_heads": 4, "num_kv_heads": 2, "head_size": 64}
BLOCK_SIZE = 16
CHECK_ROWS = 16
BASELINE_KEY_TILE = 4096
IMPL_ORDER = ("attn-core torch", *(f"attn-core {b}" for b in FUSED_ORDER), "baseline loop")
COLUMNS = (
    "impl", "context", "chunk", "ms", "tflops", "pct_matmul", "x_floor", "floor_ms",
    "floor_elem_ms", "transient_gb", "launches", "max_err", "note",
)  # fmt: skip


@dataclasses.dataclass(frozen=True)
class Timing:
    """How one row is measured: warm-up calls and timed iterations after the correctness call;
    ``launches`` off skips the profiled calls (the sweep)."""

    warmup: int
    iters: int
    launches: bool = True


class Run(_run.Run):
    filename = "prefill_bench.json"

    def __init__(self, args: argparse.Namespace, payload: dict[str, Any]) -> None:
        super().__init__(args, payload)
        self.sweep_inputs: Optional[tuple] = None  # (case, want, heads) kept for --sweep

    def line(self, row: dict[str, Any]) -> str:
        return _row_line(row, self.elapsed())


def main(argv: Optional[list[str]] = None) -> None:
    args = _parse(argv)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    shape = QUICK_SHAPE if args.quick else SHAPE
    contexts = args.contexts or ([300, 120] if args.quick else [100_000, 32768])
    chunks = sorted(args.chunks or ([200, 64] if args.quick else [8192, 2048]))[::-1]
    matmul_rate = matmul_flops(device, torch.float16, n=1024 if args.quick else 8192)
    bandwidth = copy_bandwidth(device, nbytes=(1 << 24) if args.quick else (1 << 30))
    run = Run(
        args,
        {
            "device": device_info(device),
            "shape": shape,
            "dtype": args.dtype,
            "matmul_fp16_flops": matmul_rate,
            "copy_bandwidth_bytes_s": bandwidth,
            "budget_s": args.budget_s,
        },
    )
    say(f"matmul fp16 {matmul_rate / 1e12:.1f} TFLOP/s, copy {bandwidth / 1e9:.0f} GB/s")
    sweep_at = (max(contexts), max(chunks)) if args.sweep else None
    for ctx in contexts:
        _bench_context(run, ctx, chunks, shape, device, sweep_at)
    if run.sweep_inputs is not None:  # after every main row: the sweep has its own budget
        _sweep(run, *run.sweep_inputs, device)
        run.sweep_inputs = None
    run.payload["complete"] = not run.payload["skipped"]
    path = run.save()
    rank = {name: i for i, name in enumerate(IMPL_ORDER)}
    rows = sorted(
        run.payload["rows"],
        key=lambda r: (r["context"], r["chunk"], rank.get(r["impl"], len(rank)), r["impl"]),
    )
    say(f"done in {run.elapsed():.0f} s; {len(run.payload['skipped'])} skipped; {path}")
    print_table(rows, COLUMNS)


def _parse(argv: Optional[list[str]]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=_args.writable_dir, default="results")
    p.add_argument("--quick", action="store_true", help="tiny sizes (CPU smoke run)")
    ints = _args.positive_ints
    p.add_argument("--contexts", type=ints, default=[], help="comma-separated, in this order")
    p.add_argument("--chunks", type=ints, default=[], help="comma-separated, run largest first")
    count = _args.positive_int
    p.add_argument("--iters", type=count, default=5, help="timed calls per attn-core/SDPA row")
    p.add_argument("--slow-iters", type=count, default=2, help="timed calls of the baseline loop")
    p.add_argument(
        "--budget-s",
        type=_args.non_negative_float,
        default=120.0,
        help="start no new row after this many seconds (the default run takes ~60-90 s on an "
        "H200; 120 leaves the table printed before a 150 s kill)",
    )
    p.add_argument("--sweep", action="store_true", help="also sweep the torch path's tiles")
    p.add_argument(
        "--sweep-budget-s", type=_args.non_negative_float, default=60.0, help="seconds for --sweep"
    )
    p.add_argument("--dtype", choices=("float16", "bfloat16"), default="float16")
    return p.parse_args(argv)


def _bench_context(run, ctx, chunks, shape, device, sweep_at) -> None:
    """Every chunk at one context: one case (largest chunk), its references, then the rows."""
    label = f"context {ctx}"
    if not run.has_time(f"{label}: all chunks {chunks}", run.args.budget_s):
        return
    t = time.monotonic()
    full = _case(ctx, max(chunks), shape, device, getattr(torch, run.args.dtype))
    check = _CheckCase(full)
    head = check.rows(0, min(CHECK_ROWS, min(chunks)))
    ctx_k, ctx_v = _context_kv(full)
    say(f"{label}: inputs and first-row reference in {time.monotonic() - t:.1f} s")
    for n in chunks:
        what = f"context {ctx} chunk {n}"
        if not run.has_time(f"{what}: reference and every row", run.args.budget_s):
            continue
        case = _prefix(full, n)
        m = min(CHECK_ROWS, n)
        want = torch.cat([head[:m], check.rows(n - m, n)])
        _measure_case(run, case, want, check.query_heads, (ctx_k, ctx_v), shape, device)
        if (ctx, n) == sweep_at:
            run.sweep_inputs = (case, want, check.query_heads)


def _case(
    ctx: int, chunk: int, shape: dict, device: torch.device, dtype: torch.dtype
) -> PrefillCase:
    return make_prefill_case(
        [(ctx, chunk)], shape["num_heads"], shape["num_kv_heads"], shape["head_size"],
        BLOCK_SIZE, dtype, device, seed=ctx + chunk,
    )  # fmt: skip


def _prefix(case: PrefillCase, n: int) -> PrefillCase:
    """The first ``n`` new tokens of a one-sequence case, as a case of its own."""
    ctx = int(case.context_lens[0])
    dev = case.query.device
    return dataclasses.replace(
        case,
        query=case.query[:n],
        key=case.key[:n],
        value=case.value[:n],
        query_start_loc=torch.tensor([0, n], dtype=torch.int32, device=dev),
        seq_lens=torch.tensor([ctx + n], dtype=torch.int32, device=dev),
        max_query_len=n,
    )


# --- correctness: the shared float64 reference on the chunk's first and last rows ------------


class _CheckCase:
    """The case cut to the first and last KV head and, of each, its first and last query head
    (4 of 24 heads at the Qwen shape: the CPU reference's cost is keys x heads, ~6 s per call
    at 32K context with 12 heads on this project's 2-core runner), with the chunk's K/V written
    into (copies of) those heads' caches, as vLLM does before attention.

    Rows ``[r0, r1)`` of any prefix chunk are then their own one-sequence problem: context
    ``ctx + r0`` read from the written cache, new tokens ``r0 .. r1``.
    """

    def __init__(self, case: PrefillCase) -> None:
        kvh = case.key.shape[1]
        group = case.query.shape[1] // kvh
        kv = sorted({0, kvh - 1})
        self.query_heads = [h for j in kv for h in sorted({j * group, (j + 1) * group - 1})]
        dev = case.query.device
        kv_idx = torch.tensor(kv, device=dev)
        sub = dataclasses.replace(
            case,
            query=case.query[:, self.query_heads],
            key=case.key[:, kv_idx],
            value=case.value[:, kv_idx],
            key_cache=case.key_cache.index_select(1, kv_idx),
            value_cache=case.value_cache.index_select(1, kv_idx),
        )
        self.ctx = int(case.context_lens[0])
        pos = torch.arange(self.ctx, self.ctx + case.query.shape[0], device=dev)
        table = case.block_tables[0].long()
        slots = table[pos // BLOCK_SIZE] * BLOCK_SIZE + pos % BLOCK_SIZE
        write_to_paged_cache(
            sub.key, sub.value, sub.key_cache, sub.value_cache, slots,
            kv_cache_dtype=case.kv_cache_dtype, k_scale=case.k_scale, v_scale=case.v_scale,
        )  # fmt: skip
        self.sub = sub

    def rows(self, r0: int, r1: int) -> torch.Tensor:
        """float64 ``[r1 - r0, len(query_heads), hs]`` on the CPU."""
        kw = self.sub.reference_kwargs()
        kw.update(
            query=self.sub.query[r0:r1], key=self.sub.key[r0:r1], value=self.sub.value[r0:r1],
            query_start_loc=torch.tensor([0, r1 - r0]), context_lens=torch.tensor([self.ctx + r0]),
        )  # fmt: skip
        return reference_prefix_prefill(**kw)


def _max_err(out: torch.Tensor, want: torch.Tensor, heads: list) -> float:
    m = want.shape[0] // 2
    got = torch.cat([out[:m], out[out.shape[0] - m :]])[:, heads].double().cpu()
    return float((got - want).abs().max())


# --- what is timed ---------------------------------------------------------------------------


def _measure_case(run, case, want, heads, ctx_kv, shape, device) -> None:
    ctx, n = int(case.context_lens[0]), case.query.shape[0]
    pairs = n * ctx + n * (n + 1) // 2  # (query, key) pairs attended
    flops = 4.0 * shape["num_heads"] * shape["head_size"] * pairs
    base = {"context": ctx, "chunk": n, "flops": flops, "pairs": pairs}
    fast = Timing(warmup=1, iters=run.args.iters)
    out = torch.empty_like(case.query)

    def row(impl: str, make: Callable[[], tuple], timing: Timing, out_arg=None) -> None:
        if not run.has_time(f"context {ctx} chunk {n}: {impl}", run.args.budget_s):
            return
        fn, note = make()
        _measure(run, impl, fn, out_arg, want, heads, base, device, timing, note)

    for name in ("torch", *FUSED_ORDER):
        make = lambda name=name: _attn_core_fn(case, name, device, out)  # noqa: E731
        row(f"attn-core {name}", make, fast, out)
    k_all, v_all = _contiguous_kv(case, *ctx_kv)
    row("baseline loop", lambda: (_baseline_loop(case, k_all, v_all), ""), _slow(run))
    row("baseline sdpa", lambda: _baseline_sdpa(case, k_all, v_all), fast)


def _slow(run) -> Timing:
    return Timing(warmup=0, iters=run.args.slow_iters)


def _add_rates(r: dict, matmul_rate: float, bandwidth: float, heads: int) -> None:
    """Derived columns of one row, in place."""
    r["floor_ms"] = 1e3 * r["flops"] / matmul_rate
    r["floor_elem_ms"] = 1e3 * ELEMENTWISE_BYTES_PER_SCORE * heads * r["pairs"] / bandwidth
    if r.get("ms"):
        r["tflops"] = r["flops"] / (r["ms"] / 1e3) / 1e12
        r["pct_matmul"] = 100 * r["tflops"] * 1e12 / matmul_rate
        r["x_floor"] = r["ms"] / r["floor_ms"]


def _attn_core_fn(case, name, device, out) -> tuple[Optional[Callable], str]:
    q = case.query
    try:
        if name != "torch":
            verify_prefill_backend(name, device, q.dtype, q.shape[2])
        plan = prefill_plan_for(
            AttentionShape(q.shape[1], case.key.shape[1], q.shape[2], BLOCK_SIZE, q.dtype),
            PrefillLengths(case.max_query_len, int(case.context_lens[0])),
            device,
            overrides=PrefillOverrides(backend=name),
        )
    except (RuntimeError, ValueError) as exc:
        return None, str(exc)[:120]
    note = f"tiles q{plan.query_tile}/k{plan.key_tile} stream{plan.stream_chunk}"
    return (lambda: paged_prefix_prefill(*case.args(), out=out, plan=plan)), note


def _measure(run, impl, fn, out, want, heads, base, device, timing: Timing, note) -> dict:
    row = {"impl": impl, **base, "note": note}
    if fn is not None:
        try:
            result = fn()
            synchronize(device)
            row["max_err"] = _max_err(result if out is None else out, want, heads)
            row["ms"] = 1e3 * median_time_s(fn, device, warmup=timing.warmup, iters=timing.iters)
            peak = transient_peak_bytes(fn, device)
            row["transient_gb"] = None if peak is None else peak / 1e9
            if timing.launches:
                row["launches"] = kernel_launches(fn, device)
        except torch.cuda.OutOfMemoryError as exc:  # the baselines may not fit at 100K
            row["note"] = f"out of memory: {str(exc)[:80]}"
        except RuntimeError as exc:  # one broken row must not cost the rest of the run
            row["note"] = f"failed: {str(exc)[:100]}"
    p = run.payload
    _add_rates(row, p["matmul_fp16_flops"], p["copy_bandwidth_bytes_s"], p["shape"]["num_heads"])
    run.add(row)
    return row


def _row_line(row: dict, elapsed: float) -> str:
    ms = f"{row['ms']:9.2f} ms" if row.get("ms") else "        - ms"
    err = f"err {row['max_err']:.2e}" if row.get("max_err") is not None else "err -"
    gb = row.get("transient_gb")
    mem = f"{gb:6.2f} GB" if gb is not None else "     - GB"
    return (
        f"[{elapsed:6.1f} s] {row['impl']:<22} ctx {row['context']:>6} chunk {row['chunk']:>5} "
        f"{ms} x_floor {row.get('x_floor') or 0:5.2f} {mem} launches {row.get('launches')} "
        f"{err} {row['note']}"
    )


def _context_kv(case: PrefillCase) -> tuple[torch.Tensor, torch.Tensor]:
    """``[ctx, kvh, hs]`` context K/V in the compute dtype on the device (once per context)."""
    ctx = int(case.context_lens[0])
    k, v = tokens_from_cache(case.key_cache, case.value_cache, case.block_tables[0], ctx)
    dev, dt = case.query.device, case.query.dtype
    return k.to(dev, dt), v.to(dev, dt)


def _contiguous_kv(case: PrefillCase, ctx_k, ctx_v) -> tuple[torch.Tensor, torch.Tensor]:
    """[kvh, ctx + n, hs] context + chunk K/V, gathered outside any timing."""
    k = torch.cat([ctx_k, case.key]).transpose(0, 1).contiguous()
    v = torch.cat([ctx_v, case.value]).transpose(0, 1).contiguous()
    return k, v


def _baseline_loop(case, k_all, v_all) -> Callable:
    """Online softmax over 4096-key tiles, whole chunk at once, allocating per tile."""
    q = case.query
    n, heads, hs = q.shape
    kvh = k_all.shape[0]
    ctx = k_all.shape[1] - n
    scale = hs**-0.5
    # torch 2.1 has no half matmul on the CPU: the baseline then multiplies in fp32 there.
    mm = q.dtype if probe_capabilities(q.device, q.dtype).half_matmul else torch.float32

    def run():
        qg = q.view(n, kvh, heads // kvh, hs).permute(1, 2, 0, 3).reshape(kvh, -1, hs)
        m = torch.full((kvh, qg.shape[1], 1), -math.inf, device=q.device)
        l = torch.zeros_like(m)  # noqa: E741
        acc = torch.zeros(kvh, qg.shape[1], hs, device=q.device)
        q_pos = (ctx + torch.arange(n, device=q.device)).repeat(heads // kvh)[:, None]
        for k0 in range(0, k_all.shape[1], BASELINE_KEY_TILE):
            k1 = min(k0 + BASELINE_KEY_TILE, k_all.shape[1])
            s = (qg.to(mm) @ k_all[:, k0:k1].transpose(1, 2).to(mm)).float() * scale
            s = s.masked_fill(torch.arange(k0, k1, device=q.device)[None] > q_pos, -math.inf)
            m_new = torch.maximum(m, s.amax(-1, keepdim=True))
            p = torch.exp(s - m_new)
            alpha = torch.exp(m - m_new)
            l = l * alpha + p.sum(-1, keepdim=True)  # noqa: E741
            acc = acc * alpha + (p.to(mm) @ v_all[:, k0:k1].to(mm)).float()
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


def _sweep(run, case, want, heads, device) -> None:
    """The torch path over tile pairs, within ``--sweep-budget-s`` from the sweep's start;
    pairs nearest the default (q4096/k4096 at the 8K chunk) first, so a cut keeps those."""
    q = case.query
    small = case.max_query_len < 1024  # --quick sizes
    tqs = (16, 64) if small else (4096, 2048, 1024, 8192, 512, 256)
    tks = (32, 256) if small else (4096, 2048, 8192, 1024, 512)
    pairs = sorted(
        ((tq, tk) for tq in tqs for tk in tks if tq <= case.max_query_len),
        key=lambda p: tqs.index(p[0]) + tks.index(p[1]),
    )
    out = torch.empty_like(q)
    deadline = run.elapsed() + run.args.sweep_budget_s
    base = {"context": int(case.context_lens[0]), "chunk": q.shape[0]}
    base["pairs"] = base["chunk"] * base["context"] + base["chunk"] * (base["chunk"] + 1) // 2
    base["flops"] = 4.0 * q.shape[1] * q.shape[2] * base["pairs"]
    for tq, tk in pairs:
        impl = f"sweep q{tq}/k{tk}"
        if not run.has_time(f"context {base['context']} chunk {base['chunk']}: {impl}", deadline):
            continue
        plan = prefill_plan_for(
            AttentionShape(q.shape[1], case.key.shape[1], q.shape[2], BLOCK_SIZE, q.dtype),
            PrefillLengths(case.max_query_len),
            device,
            overrides=PrefillOverrides(
                backend="torch", query_tile=tq, key_tile=tk, budget_bytes=1 << 40
            ),
        )
        fn = lambda plan=plan: paged_prefix_prefill(*case.args(), out=out, plan=plan)  # noqa: E731
        note = f"workspace {plan.workspace_bytes / 1e9:.2f} GB"
        timing = Timing(warmup=0, iters=2, launches=False)
        _measure(run, impl, fn, out, want, heads, base, device, timing, note)


if __name__ == "__main__":
    main()
