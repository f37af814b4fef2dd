"""Rates as the simulator's profile defines them (attn_core.device.spec.DeviceSpec):

- ``hbm_bandwidth``: bytes/s of a streaming read (a sum over N bytes of fp16: reads N, writes
  nothing of note); ``copy_bandwidth``: a device-to-device copy, read + write counted (2N);
- ``fp16_flops`` / ``bf16_flops``: a dense square matmul, 2 n^3 per product; ``fp32_flops``:
  the same in fp32 with TF32 off (the profile's plain fp32 rate, which prices softmax and the
  elementwise work, not tensor cores);
- ``launch_overhead_s``: host time per eager launch of a 1-element add (the host issues
  ``launches`` of them back to back; no sync inside, so device time is not counted);
- ``launch_gap_s``: device time per launch when the host is ahead: the same adds captured in
  one CUDA graph, replay time (CUDA events) over ``launches``.

Every time is a median over ``repeats`` after warm-up; CUDA events around each call.
"""

from __future__ import annotations

import statistics
import time

import torch
from device_facts_record import absent, measured

GiB = 1024**3


def event_median_s(fn, repeats: int, warmup: int = 3) -> float:
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    return statistics.median(times)


def _size_text(nbytes: int) -> str:
    return f"{nbytes / GiB:g} GiB" if nbytes >= GiB else f"{nbytes / 2**20:g} MiB"


def bandwidths(nbytes: int, repeats: int) -> dict:
    src = torch.empty(nbytes // 2, dtype=torch.float16, device="cuda").uniform_()
    dst = torch.empty_like(src)
    size = _size_text(nbytes)
    t_read = event_median_s(lambda: src.sum(dtype=torch.float32), repeats)
    t_copy = event_median_s(lambda: dst.copy_(src), repeats)
    return {
        "hbm_bandwidth": measured(
            nbytes / t_read,
            "bytes/s",
            f"streaming read: torch.sum of {size} fp16 into fp32, bytes read / median of "
            f"{repeats} CUDA-event timings",
        ),
        "copy_bandwidth": measured(
            2 * nbytes / t_copy,
            "bytes/s",
            f"device-to-device copy_ of {size} (read + write counted), median of {repeats}",
        ),
    }


def matmul_rate(dtype: torch.dtype, n: int, repeats: int) -> float:
    a = torch.randn(n, n, device="cuda").to(dtype)
    b = torch.randn(n, n, device="cuda").to(dtype)
    c = torch.empty(n, n, device="cuda", dtype=dtype)
    t = event_median_s(lambda: torch.matmul(a, b, out=c), repeats)
    return 2 * n**3 / t


def matmul_rates(n: int, repeats: int) -> dict:
    out = {}
    tf32 = torch.backends.cuda.matmul.allow_tf32
    for name, dtype, note in (
        ("fp16_flops", torch.float16, ""),
        ("bf16_flops", torch.bfloat16, ""),
        ("fp32_flops", torch.float32, ", TF32 off (plain fp32)"),
    ):
        try:
            torch.backends.cuda.matmul.allow_tf32 = False
            rate = matmul_rate(dtype, n, repeats)
            method = f"{n}^3 {str(dtype)[6:]} torch.matmul{note}, 2n^3 / median of {repeats}"
            out[name] = measured(rate, "FLOP/s", method)
        except RuntimeError as exc:  # e.g. no bf16 GEMM on this platform: data, not a crash
            out[name] = absent("FLOP/s", f"{str(dtype)[6:]} matmul raised: {exc}"[:300])
        finally:
            torch.backends.cuda.matmul.allow_tf32 = tf32
            torch.cuda.empty_cache()
    return out


def launch_overhead(launches: int, repeats: int) -> dict:
    x = torch.zeros(1, device="cuda")
    y = torch.empty_like(x)
    for _ in range(launches):  # warm: allocator, dispatcher caches
        torch.add(x, 1.0, out=y)
    torch.cuda.synchronize()
    per = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(launches):
            torch.add(x, 1.0, out=y)
        per.append((time.perf_counter() - t0) / launches)
        torch.cuda.synchronize()
    return {
        "launch_overhead_s": measured(
            statistics.median(per),
            "s",
            f"host time per eager torch.add of 1 element, {launches} back-to-back launches "
            f"(no sync inside), median of {repeats}",
        )
    }


def graph_gap(launches: int, repeats: int) -> dict:
    x = torch.zeros(1, device="cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        x.add_(1.0)
    torch.cuda.current_stream().wait_stream(side)
    try:
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for _ in range(launches):
                x.add_(1.0)
        t = event_median_s(graph.replay, repeats, warmup=2)
    except RuntimeError as exc:  # no graph support on the platform: data
        return {"launch_gap_s": absent("s", f"CUDA graph capture or replay raised: {exc}"[:300])}
    return {
        "launch_gap_s": measured(
            t / launches,
            "s",
            f"CUDA-graph replay of {launches} 1-element in-place adds, device time (CUDA "
            f"events) / {launches}, median of {repeats}",
        )
    }


RATE_UNITS = {
    "hbm_bandwidth": "bytes/s",
    "copy_bandwidth": "bytes/s",
    "fp16_flops": "FLOP/s",
    "bf16_flops": "FLOP/s",
    "fp32_flops": "FLOP/s",
    "launch_overhead_s": "s",
    "launch_gap_s": "s",
}
