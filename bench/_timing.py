"""Shared measurement helpers for the benchmark scripts (decode_bench.py, prefill_bench.py).

Everything here measures; nothing asserts. On CUDA, times come from CUDA events around each
call (median over ``iters`` after ``warmup``); on the CPU from ``time.perf_counter``. Bandwidth
numbers count bytes *moved*: a device-to-device copy of N bytes moves 2N (read + write), and an
attention step's "K+V bandwidth" counts the K and V bytes it must read once.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple, Optional

import torch


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def median_time_s(
    fn: Callable[[], object], device: torch.device, *, warmup: int = 3, iters: int = 20
) -> float:
    """Median wall time of ``fn()`` in seconds (CUDA events on CUDA, perf_counter elsewhere)."""
    for _ in range(warmup):
        fn()
    synchronize(device)
    if device.type == "cuda":
        return statistics.median(event_ms(fn) / 1e3 for _ in range(iters))
    times: list[float] = []
    for _ in range(iters):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def event_ms(fn: Callable[[], object], *, calls: int = 1) -> float:
    """Milliseconds a call of ``fn``: ``calls`` calls back to back between two CUDA events
    (the device's time for them as queued), divided by ``calls``."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(calls):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / calls


def capture_graph(step: Callable[[], object], *, warmup: int = 1) -> torch.cuda.CUDAGraph:
    """``step`` captured in a CUDA graph, after ``warmup`` calls on a side stream (the pattern
    PyTorch documents: the allocator and lazy state settle outside the capture)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(warmup):
            step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    return graph


def graph_ms(
    steps: Sequence[Callable[[], object]], *, replays: int = 10, rounds: int = 15
) -> tuple[float, float]:
    """``(back_to_back, single)`` ms per step of ``steps`` captured in one CUDA graph.

    *back_to_back*: ``replays`` replays between two events, the median over ``rounds``, per
    replay and step: the kernels' own time, as inside vLLM's whole-model decode graph, where the
    next kernel is already queued. *single*: the median of one replay between two events, which
    also counts the graph launch's latency while the GPU waits: 2-7 % more on the H200's native
    decode rows (1 x 100K 0.182 against 0.177, 64 x 8K 0.818 against 0.762).
    """

    def every_step() -> None:
        for fn in steps:
            fn()

    graph = capture_graph(every_step)
    graph.replay()
    torch.cuda.synchronize()

    def timed(n: int) -> float:
        return event_ms(graph.replay, calls=n) / len(steps)

    single = statistics.median(timed(1) for _ in range(rounds))
    back_to_back = statistics.median(timed(replays) for _ in range(rounds))
    return back_to_back, single


def copy_bandwidth(device: torch.device, nbytes: int = 1 << 30, iters: int = 10) -> float:
    """Device-to-device copy rate in bytes/s, counting read + write (2 x nbytes per copy)."""
    src = torch.empty(nbytes // 2, dtype=torch.float16, device=device).fill_(1.0)
    dst = torch.empty_like(src)
    t = median_time_s(lambda: dst.copy_(src), device, warmup=2, iters=iters)
    return 2 * nbytes / t


def matmul_flops(
    device: torch.device, dtype: torch.dtype = torch.float16, n: int = 8192, iters: int = 10
) -> float:
    """Dense square matmul rate in FLOP/s for ``dtype`` (2 n^3 per product); NaN where this
    torch has no such matmul (torch 2.1's CPU has no fp16 mm)."""
    a = torch.randn(n, n, device=device).to(dtype)
    b = torch.randn(n, n, device=device).to(dtype)
    try:
        t = median_time_s(lambda: torch.mm(a, b), device, warmup=2, iters=iters)
    except RuntimeError:
        return float("nan")
    return 2 * n**3 / t


def transient_peak_bytes(fn: Callable[[], object], device: torch.device) -> Optional[int]:
    """Peak bytes allocated above the level before ``fn()`` (CUDA only; None elsewhere).

    Includes whatever ``fn`` allocates and keeps (its output, a workspace it grows), so call it
    on a fresh workspace to see the first-call cost or after a warm call to see steady state.
    """
    if device.type != "cuda":
        return None
    synchronize(device)
    base = torch.cuda.memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    fn()
    synchronize(device)
    return torch.cuda.max_memory_allocated(device) - base


class KernelProfile(NamedTuple):
    """One profiled call: ``launches`` device kernels (and memcpy/memset; on the CPU the
    top-level aten ops instead) and ``device_ms``, each kernel's device time by
    :func:`short_kernel_name`, summed over its launches (empty on the CPU)."""

    launches: int
    device_ms: dict[str, float]

    def top(self, n: int = 3) -> str:
        """The ``n`` kernels that took the most device time, as ``"name ms, ..."`` ("" if none)."""
        ranked = sorted(self.device_ms.items(), key=lambda kv: -kv[1])[:n]
        return ", ".join(f"{name} {ms:.3g}" for name, ms in ranked)


# Template arguments longer than this are elided: torch's elementwise kernels carry whole
# lambda signatures there (400+ characters a name), which drowned the table's other columns.
TEMPLATE_ARGS_SHOWN = 64


def short_kernel_name(name: str) -> str:
    """A profiler's kernel name without its return type, namespaces and parameters:
    ``"void attn::gdn::chunk_pass<128>(AttnGdnPrefillArgs, ...)"`` -> ``"chunk_pass<128>"``
    (short template arguments stay: they tell cuBLAS's and CUTLASS's kernels apart; longer
    ones become ``<...>``, and kernels that differ only there share one entry). Names that are
    not C++ signatures (Triton's, "Memcpy DtoD (Device -> Device)") keep all but the
    parenthesised tail."""
    text = name.replace("(anonymous namespace)", "").strip()
    if text.startswith("void "):
        text = text[len("void ") :]
    depth, end, last_scope, opened = 0, len(text), 0, -1
    for i, ch in enumerate(text):
        if depth == 0 and ch == "<":
            opened = i
        depth += (ch == "<") - (ch == ">")
        if depth == 0 and ch == "(":
            end = i
            break
        if depth == 0 and text.startswith("::", i):
            last_scope, opened = i + 2, -1
    short = text[last_scope:end].strip()
    if opened >= last_scope and end - opened - 2 > TEMPLATE_ARGS_SHOWN:
        short = text[last_scope:opened].strip() + "<...>"
    return short or name


def kernel_profile(fn: Callable[[], object], device: torch.device) -> Optional[KernelProfile]:
    """Profile one call of ``fn`` (after one warm call) with torch.profiler; None if the
    profiler is unavailable."""
    try:
        from torch.profiler import ProfilerActivity, profile
    except ImportError:  # pragma: no cover - very old torch
        return None
    fn()  # warm: first calls may autotune or allocate
    synchronize(device)
    activities = [ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(ProfilerActivity.CUDA)
    with profile(activities=activities) as prof:
        fn()
        synchronize(device)
    events = prof.events()
    if device.type != "cuda":
        launches = sum(1 for e in events if e.name.startswith("aten::") and e.cpu_parent is None)
        return KernelProfile(launches, {})
    kernels = [e for e in events if "CUDA" in str(getattr(e, "device_type", ""))]
    times: dict[str, float] = {}
    for e in kernels:
        # device_time_total on current torch, cuda_time_total on torch 2.1 (microseconds)
        us = getattr(e, "device_time_total", None)
        if us is None:
            us = getattr(e, "cuda_time_total", 0.0)
        key = short_kernel_name(e.name)
        times[key] = times.get(key, 0.0) + us / 1e3
    return KernelProfile(len(kernels), times)


def kernel_launches(fn: Callable[[], object], device: torch.device) -> Optional[int]:
    """Device kernels (and memcpy/memset) one call of ``fn`` issues, via torch.profiler.

    On the CPU returns the number of aten ops instead (no device kernels exist there);
    None if the profiler is unavailable.
    """
    profiled = kernel_profile(fn, device)
    return None if profiled is None else profiled.launches


def device_info(device: torch.device) -> dict[str, Any]:
    info: dict[str, Any] = {
        "device": str(device),
        "torch": torch.__version__,
        "python": platform.python_version(),
    }
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        info.update(
            name=props.name, sm_count=props.multi_processor_count, memory_bytes=props.total_memory
        )
    else:
        info.update(name=platform.processor() or "cpu", threads=torch.get_num_threads())
    return info


def write_results(out_dir: str, filename: str, payload: dict[str, Any]) -> str:
    """Write ``payload`` as JSON to ``out_dir/filename``; returns the path."""
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, filename)
    with open(path, "w") as f:
        json.dump(payload, f, indent=2, default=str)
    return path


def print_table(rows: Sequence[dict[str, Any]], columns: Sequence[str]) -> None:
    """Print ``rows`` as a table of ``columns`` (tabulate, floats to 3 significant digits)."""
    from tabulate import tabulate

    body = [[_fmt(r.get(c)) for c in columns] for r in rows]
    print(tabulate(body, headers=list(columns), tablefmt="github"))


def _fmt(value: Any) -> Any:
    if isinstance(value, float):
        return f"{value:.3g}"
    return "-" if value is None else value
