"""Paged decode benchmark: attn_core.paged_decode beside the old way and SDPA, one device run.

Shape: Qwen3.6's full-attention layer (24 query heads, 4 KV heads, head 256, fp16, block 16) at
8K / 32K / 100K context with batch 1 and 8, and batch 64 x 8K. Per row: median time, achieved
K+V bandwidth and its ratio to the measured device-to-device copy bandwidth, transient peak
memory (fresh workspace), kernel launches per step (torch.profiler), max error against a
reference (float64 on the CPU for small rows, fp32 on the device for large).

Each shape times the default plan eagerly (host dispatch included: ~30 us per launch on the
H200 of GPU run 1) and replayed from a CUDA graph (device time, how vLLM runs decode), plus
graph replays of the other tier (one_pass vs partitioned) and of 8-byte instead of 16-byte
gather elements, and the gathers alone, so one GPU run shows where the remaining time goes.

    python3 bench/decode_bench.py [--out results] [--quick] [--device cuda] [--shapes 1x100000]

``--quick`` runs tiny sizes (works on a CPU in seconds). Prints each row as it is measured and
a table plus the summary against the H200 targets last; full results go to
``OUT/decode_bench.json`` (rewritten after every shape).
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from collections.abc import Callable
from typing import Any, Optional, Union

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _args  # noqa: E402
import _timing  # noqa: E402

from attn_core import (  # noqa: E402
    AttentionShape,
    DecodeLengths,
    DecodePlan,
    NativeDecodePlan,
    decode_plan_for,
    paged_decode,  # noqa: E402
)
from attn_core.core.cache_layout import validate_caches  # noqa: E402
from attn_core.core.settings import DecodeOverrides  # noqa: E402
from attn_core.core.workspace import Workspace  # noqa: E402
from attn_core.decode.gather import block_ids, gather_keys, gather_values  # noqa: E402
from attn_core.reference import reference_decode  # noqa: E402

HEADS, KV_HEADS, HEAD, BLOCK = 24, 4, 256, 16
# the target shapes first, so a run cut short still answers the targets
FULL_SHAPES = [(1, 100_000), (8, 100_000), (64, 8192), (1, 8192), (8, 8192), (1, 32768), (8, 32768)]
QUICK_SHAPES = [(1, 256), (2, 1000), (4, 300)]
# float64 reference on the CPU costs ~0.4 s per 1M (token x head) pairs; above this the row is
# checked against an fp32 reference on the device instead.
FLOAT64_MAX_TOKENS = 70_000


class Case:
    """Contiguous K/V ``[B, KVH, T, D]`` and the same tokens scattered into a paged cache."""

    def __init__(self, batch: int, tokens: int, device: torch.device, seed: int = 0) -> None:
        # generated on the device: 8 x 100K x 4 heads x 256 is 820M values per tensor
        g = torch.Generator(device=device).manual_seed(seed)
        dtype = torch.float16
        x = 16 // 2
        nblk = -(-tokens // BLOCK)
        padded = nblk * BLOCK
        self.batch, self.tokens = batch, tokens
        self._reference: Optional[tuple[torch.Tensor, str]] = None

        def randn(*shape: int) -> torch.Tensor:
            return torch.randn(*shape, generator=g, device=device, dtype=dtype)

        self.query = randn(batch, HEADS, HEAD)
        self.overrides = DecodeOverrides()  # the plan variant being timed
        self._plans: dict[DecodeOverrides, DecodePlan] = {}
        self.k = randn(batch, KV_HEADS, padded, HEAD)
        self.v = randn(batch, KV_HEADS, padded, HEAD)
        num_blocks = batch * nblk + 7
        cpu_g = torch.Generator().manual_seed(seed)
        perm = torch.randperm(num_blocks, generator=cpu_g)[: batch * nblk]
        self.block_tables = perm.view(batch, nblk).to(torch.int32).to(device)
        self.key_cache = torch.empty(
            num_blocks, KV_HEADS, HEAD // x, BLOCK, x, dtype=dtype, device=device
        )
        self.value_cache = torch.empty(
            num_blocks, KV_HEADS, HEAD, BLOCK, dtype=dtype, device=device
        )
        ids = self.block_tables.flatten().long()
        kb = self.k.view(batch, KV_HEADS, nblk, BLOCK, HEAD // x, x).permute(0, 2, 1, 4, 3, 5)
        self.key_cache[ids] = kb.reshape(batch * nblk, KV_HEADS, HEAD // x, BLOCK, x)
        vb = self.v.view(batch, KV_HEADS, nblk, BLOCK, HEAD).permute(0, 2, 1, 4, 3)
        self.value_cache[ids] = vb.reshape(batch * nblk, KV_HEADS, HEAD, BLOCK)
        self.seq_lens = torch.full((batch,), tokens, dtype=torch.int32, device=device)
        self.k, self.v = self.k[:, :, :tokens], self.v[:, :, :tokens]

    @property
    def kv_bytes(self) -> int:
        return 2 * self.batch * KV_HEADS * self.tokens * HEAD * 2

    def plan(self) -> Union[DecodePlan, NativeDecodePlan]:
        """attn-core's plan for this case under ``self.overrides`` (the variant being timed),
        made once per variant so timed calls do not plan."""
        if self.overrides not in self._plans:
            shape = AttentionShape(HEADS, KV_HEADS, HEAD, BLOCK, self.query.dtype)
            lengths = DecodeLengths(self.batch, self.tokens, self.block_tables.shape[1])
            self._plans[self.overrides] = decode_plan_for(
                shape, lengths, self.query.device, overrides=self.overrides
            )
        return self._plans[self.overrides]

    def decode(self, ws: Workspace, out: torch.Tensor) -> torch.Tensor:
        return paged_decode(
            self.query,
            self.key_cache,
            self.value_cache,
            self.block_tables,
            self.seq_lens,
            self.tokens,
            out=out,
            workspace=ws,
            plan=self.plan(),
        )


# ------------------------------------------------------------------------------- baselines
def old_way(c: Case) -> torch.Tensor:
    """Gather whole blocks, repeat K/V to every query head, matmul (the torch path replaced it)."""
    kg = c.key_cache[c.block_tables.long()]  # [B, nblk, KVH, D/x, BS, x]
    k = kg.permute(0, 2, 1, 4, 3, 5).reshape(c.batch, KV_HEADS, -1, HEAD)[:, :, : c.tokens]
    vg = c.value_cache[c.block_tables.long()]  # [B, nblk, KVH, D, BS]
    v = vg.permute(0, 2, 1, 4, 3).reshape(c.batch, KV_HEADS, -1, HEAD)[:, :, : c.tokens]
    k = k.repeat_interleave(HEADS // KV_HEADS, dim=1)
    v = v.repeat_interleave(HEADS // KV_HEADS, dim=1)
    s = torch.matmul(c.query.unsqueeze(2), k.transpose(-1, -2)).float() * HEAD**-0.5
    p = torch.softmax(s, dim=-1).to(v.dtype)
    return torch.matmul(p, v).squeeze(2)


def sdpa_fn(c: Case) -> tuple[Callable[[], torch.Tensor], str]:
    """torch SDPA on already-contiguous K/V (no paging): the floor a fused kernel reaches."""
    sdpa = torch.nn.functional.scaled_dot_product_attention
    q = c.query.unsqueeze(2)
    try:
        sdpa(q[:1, :, :, :], c.k[:1, :, :16], c.v[:1, :, :16], enable_gqa=True)
        return (lambda: sdpa(q, c.k, c.v, enable_gqa=True).squeeze(2)), "sdpa gqa"
    except (TypeError, RuntimeError):
        k = c.k.repeat_interleave(HEADS // KV_HEADS, 1)  # prepared outside the timed call
        v = c.v.repeat_interleave(HEADS // KV_HEADS, 1)
        return (lambda: sdpa(q, k, v).squeeze(2)), "sdpa (K/V pre-expanded)"


def gather_fn(c: Case, width: int) -> Callable[[], object]:
    """Only the K and V block gathers decode does (``width``-byte elements), whole context."""
    layout = validate_caches(
        c.key_cache, c.value_cache, "auto", compute_dtype=c.query.dtype, device=c.query.device
    )
    ws = Workspace()
    nblk = c.block_tables.shape[1]
    pos = torch.arange(nblk * BLOCK, device=c.query.device)
    past_end = (pos[None, :] >= c.seq_lens[:, None])[:, ::BLOCK]
    ids = block_ids(c.block_tables, past_end, 0, nblk, ws)
    return lambda: (
        gather_keys(ws, c.key_cache, ids, layout, width),
        gather_values(ws, c.value_cache, ids, layout, width),
    )


def graph_replay_fn(c: Case) -> Optional[Callable[[], object]]:
    """One decode step (under the current env) captured in a CUDA graph: device time."""
    if c.query.device.type != "cuda":
        return None
    ws, out = Workspace(), torch.empty_like(c.query)
    graph = _timing.capture_graph(lambda: c.decode(ws, out), warmup=2)

    def replay() -> torch.Tensor:
        graph.replay()
        return out

    return replay


# ------------------------------------------------------------------------------ references
def reference_fp32(c: Case) -> torch.Tensor:
    """Dense fp32 attention on the contiguous K/V, on the device: ``[B, H, D]``."""
    group = HEADS // KV_HEADS
    q = c.query.float().view(c.batch, KV_HEADS, group, HEAD)
    s = torch.matmul(q, c.k.float().transpose(-1, -2)) * HEAD**-0.5
    out = torch.matmul(torch.softmax(s, -1), c.v.float())
    return out.reshape(c.batch, HEADS, HEAD)


def max_error(c: Case, got: torch.Tensor) -> tuple[float, str]:
    """Largest absolute error of ``got`` against the case's reference (computed once)."""
    if c._reference is None:
        if c.batch * c.tokens <= FLOAT64_MAX_TOKENS:
            ref = reference_decode(c.query, c.key_cache, c.value_cache, c.block_tables, c.seq_lens)
            c._reference = (ref, "float64")
        else:
            c._reference = (reference_fp32(c), "fp32 device")
    ref, kind = c._reference
    return float((got.to(ref.dtype).to(ref.device) - ref).abs().max()), kind


# -------------------------------------------------------------------------------------- run
def measure(
    name: str,
    c: Case,
    fn: Callable[[], Any],
    device: torch.device,
    copy_bw: float,
    iters: int,
    *,
    check: Optional[Callable[[], Any]] = None,
    fresh: Optional[Callable[[], Any]] = None,
) -> dict[str, Any]:
    """Time ``fn``; ``fresh`` is the same call on an empty workspace, for the transient peak."""
    peak = _timing.transient_peak_bytes(fresh or fn, device)
    t = _timing.median_time_s(fn, device, warmup=3, iters=iters)
    steady = _timing.transient_peak_bytes(fn, device)
    row: dict[str, Any] = {
        "variant": name,
        "batch": c.batch,
        "context": c.tokens,
        "ms": t * 1e3,
        "kv_GBps": c.kv_bytes / t / 1e9,
        "vs_copy": c.kv_bytes / t / copy_bw,
        "peak_MB": None if peak is None else peak / 1e6,
        "steady_MB": None if steady is None else steady / 1e6,
        "peak_vs_kv": None if peak is None else peak / c.kv_bytes,
        "launches": _timing.kernel_launches(fn, device),
    }
    if check is not None:
        row["max_err"], row["reference"] = max_error(c, check())
    return row


def safe_measure(name: str, c: Case, *args: Any, **kwargs: Any) -> dict[str, Any]:
    """:func:`measure`, or a row saying why it failed (one variant must not end the run)."""
    try:
        return measure(name, c, *args, **kwargs)
    except (RuntimeError, TypeError, ValueError) as exc:
        return {"variant": name, "batch": c.batch, "context": c.tokens, "ms": math.nan,
                "error": f"{type(exc).__name__}: {str(exc)[:160]}"}  # fmt: skip


def measure_plan(
    name: str, c: Case, device: torch.device, copy_bw: float, iters: int
) -> dict[str, Any]:
    """The case's eager decode under ``c.overrides``, timed on one workspace, checked on a
    NaN-filled output (a row it does not write shows), its first-call peak on a fresh workspace;
    the plan's fields added."""
    ws, out = Workspace(), torch.empty_like(c.query)
    row = safe_measure(
        name,
        c,
        lambda: c.decode(ws, out),
        device,
        copy_bw,
        iters,
        check=lambda: c.decode(ws, torch.full_like(c.query, math.nan)),
        fresh=lambda: c.decode(Workspace(), out),
    )
    row.update(plan_row(c))
    return row


def plan_row(c: Case) -> dict[str, Any]:
    plan = c.plan()
    return {
        "backend": plan.backend,
        "backend_reason": plan.backend_reason,
        "tier": plan.tier,
        "partition_size": plan.partition_size,
        "num_partitions": plan.num_partitions,
        # the torch plan's own fields (a NativeDecodePlan has none of them)
        "num_chunks": getattr(plan, "num_chunks", 1),
        "gather_bytes": getattr(plan, "gather_bytes", None),
        "workspace_MB": plan.workspace_bytes / 1e6,
        "scores_fp32_from_bmm": getattr(plan, "scores_fp32_from_bmm", None),
        "device_spec": plan.device_spec.name,
        "steps": [
            {
                "name": s.name,
                "grid": s.grid,
                "threads": s.threads_per_block,
                "smem": s.shared_mem_bytes,
            }
            for s in plan.steps[:3]
        ],
    }


def variants(c: Case) -> list[tuple[str, DecodeOverrides]]:
    """Graph-replayed alternatives to the default plan at this shape: the torch path where the
    default is the native kernel, the torch path's other tier, the other gather width. (GPU
    run 1's partition-size sweep and token gathers are gone: the one-pass rewrite leaves one
    gather and a tier choice.)"""
    row = plan_row(c)
    torch_tier = row["tier"]
    out = []
    if row["backend"] == "native":  # the torch path beside the native kernel it stands in for
        out.append(("graph, torch path", DecodeOverrides(backend="torch")))
        c.overrides = DecodeOverrides(backend="torch")
        torch_tier = plan_row(c)["tier"]
        c.overrides = DecodeOverrides()
    other = "one_pass" if torch_tier == "partitioned" else "partitioned"
    return out + [
        (f"graph, tier={other}", DecodeOverrides(tier=other)),
        ("graph, gather 8-byte", DecodeOverrides(gather_bytes=8)),
    ]


def bench_shape(
    batch: int, tokens: int, device: torch.device, copy_bw: float, iters: int, quick: bool
) -> list[dict[str, Any]]:
    c = Case(batch, tokens, device)
    rows: list[dict[str, Any]] = []

    def emit(row: dict[str, Any]) -> None:
        rows.append(row)
        if "error" in row:
            print(f"  {row['variant']:<28} {batch:>3} x {tokens:<7} failed: {row['error']}")
            return
        print(
            f"  {row['variant']:<28} {batch:>3} x {tokens:<7} {row['ms']:8.3f} ms  "
            f"launches {row.get('launches')}  err {row.get('max_err', '-')}",
            flush=True,
        )

    emit(measure_plan("attn_core plan", c, device, copy_bw, iters))
    graphs = [("attn_core plan, CUDA graph", DecodeOverrides())] + variants(c)
    for name, overrides in graphs:
        c.overrides = overrides
        try:
            replay = graph_replay_fn(c)
        except RuntimeError as exc:
            emit({"variant": name, "batch": batch, "context": tokens, "ms": math.nan,
                  "error": f"capture: {str(exc)[:160]}"})  # fmt: skip
            continue
        if replay is None:
            continue
        row = safe_measure(name, c, replay, device, copy_bw, iters, check=replay)
        row.update(plan_row(c))
        emit(row)
        del replay
        _release(device)
    c.overrides = DecodeOverrides()
    if not quick and tokens >= 32768 and batch == 1:
        c.overrides = DecodeOverrides(stream_tokens=8192)
        emit(measure_plan("attn_core stream=8192", c, device, copy_bw, max(3, iters // 4)))
        _release(device)
    fn, label = sdpa_fn(c)
    emit(safe_measure(label + " (contiguous)", c, fn, device, copy_bw, iters, check=fn))
    for width in (16, 8):
        emit(
            safe_measure(
                f"gather only: {width}-byte", c, gather_fn(c, width), device, copy_bw, iters
            )
        )
    _release(device)
    if batch * tokens <= 8 * 32768 or not quick:  # the old way needs 7.5x K+V of memory
        emit(
            safe_measure(
                "old: gather+repeat+matmul",
                c,
                lambda: old_way(c),
                device,
                copy_bw,
                max(3, iters // 4),
                check=lambda: old_way(c),
            )
        )
    _release(device)
    return rows


def _release(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.empty_cache()


COLUMNS = [
    "variant",
    "batch",
    "context",
    "ms",
    "kv_GBps",
    "vs_copy",
    "peak_MB",
    "peak_vs_kv",
    "launches",
    "max_err",
    "backend",
    "tier",
    "partition_size",
    "num_partitions",
]


def _shapes(text: str) -> list[tuple[int, int]]:
    """``--shapes``: comma-separated ``BATCHxCONTEXT``, each part an integer >= 1."""
    shapes = []
    for item in text.split(","):
        parts = item.split("x")
        try:
            pair = tuple(int(v) for v in parts)
        except ValueError:
            pair = ()
        if len(pair) != 2 or min(pair) < 1:
            raise argparse.ArgumentTypeError(
                f"must be comma-separated BATCHxCONTEXT (integers >= 1), got {text!r} "
                f"({item!r} is not)"
            )
        shapes.append(pair)
    return shapes


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument(
        "--out", type=_args.writable_dir, default="results", help="directory for decode_bench.json"
    )
    ap.add_argument("--quick", action="store_true", help="tiny sizes (CPU-friendly)")
    ap.add_argument(
        "--device", type=_args.device, default="cuda" if torch.cuda.is_available() else "cpu"
    )
    ap.add_argument(
        "--iters", type=_args.positive_int, default=None, help="timed iterations per variant"
    )
    ap.add_argument(
        "--shapes",
        type=_shapes,
        default=None,
        help="comma-separated BATCHxCONTEXT to run instead of the defaults, e.g. 1x100000,8x8192",
    )
    args = ap.parse_args(argv)
    device = args.device
    shapes = args.shapes or (QUICK_SHAPES if args.quick else FULL_SHAPES)
    iters = args.iters or (3 if args.quick else 20)
    copy_bw = _timing.copy_bandwidth(device, (1 << 24) if args.quick else (1 << 30))
    info = _timing.device_info(device)
    info["copy_GBps"] = copy_bw / 1e9
    info["fp16_TFLOPs"] = (
        _timing.matmul_flops(device, torch.float16, 256 if args.quick else 8192, iters=3) / 1e12
    )
    rows: list[dict[str, Any]] = []
    meta = {
        "device": info,
        "shape": {
            "heads": HEADS,
            "kv_heads": KV_HEADS,
            "head_size": HEAD,
            "block_size": BLOCK,
            "dtype": "float16",
        },
        "targets_ms_h200": TARGETS,
    }
    print(
        f"device: {info.get('name')}  copy {copy_bw / 1e9:.0f} GB/s (read+write)  "
        f"fp16 matmul {info['fp16_TFLOPs']:.0f} TFLOP/s  torch {torch.__version__}",
        flush=True,
    )
    path = ""
    for batch, tokens in shapes:
        rows += bench_shape(batch, tokens, device, copy_bw, iters, args.quick)
        _release(device)  # the shape's caches are garbage now
        summary = target_summary(rows, TARGETS)
        path = _timing.write_results(
            args.out, "decode_bench.json", {**meta, "target_summary": summary, "rows": rows}
        )
    print(f"results: {path}")
    _timing.print_table(rows, COLUMNS)
    summary = target_summary(rows, TARGETS)
    if summary:
        print(
            "\nAgainst the H200 targets (eager: host dispatch included; graph: CUDA-graph replay)"
        )
        _timing.print_table(summary, list(summary[0]))
    return 0


TARGETS = {"1x100000": 0.35, "8x100000": 2.8, "64x8192": 2.5}


def target_summary(rows: list[dict[str, Any]], targets: dict[str, float]) -> list[dict[str, Any]]:
    """Per measured shape: the default plan eager and graph-replayed, the best graph variant,
    the target where the issue sets one, and whether each meets it."""
    out = []
    shapes = dict.fromkeys((r["batch"], r["context"]) for r in rows)
    for batch, context in shapes:
        key = f"{batch}x{context}"
        mine = [r for r in rows if (r["batch"], r["context"]) == (batch, context)]
        by_name = {r["variant"]: r["ms"] for r in mine}
        graphs = [r for r in mine if "graph" in r["variant"]]
        best = min(graphs, key=lambda r: r["ms"]) if graphs else None
        target = targets.get(key)
        eager, graph = by_name.get("attn_core plan"), by_name.get("attn_core plan, CUDA graph")
        out.append(
            {
                "shape": key,
                "target_ms": target,
                "eager_ms": eager,
                "graph_ms": graph,
                "best_graph_ms": best["ms"] if best else None,
                "best_graph_variant": best["variant"] if best else None,
                "eager_meets": None if target is None or eager is None else eager <= target,
                "graph_meets": None if target is None or graph is None else graph <= target,
                "gather_only_ms": by_name.get("gather only: 16-byte"),
            }
        )
    return out


if __name__ == "__main__":
    sys.exit(main())
