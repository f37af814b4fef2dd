"""Host work around one eager ``paged_decode`` call, the way vLLM runs decode without graphs.

    python bench/eager_overhead.py [--out DIR]

Three numbers per row (Qwen3.6 shape: 24 q / 4 KV heads, head 256, fp16, block 16, permuted
block tables):

- ``eager``: CUDA events around one ``attn_core.paged_decode`` call on an idle stream, median
  of 20 after warm-up. The GPU waits for the host to launch, so this is host work plus kernel
  (0.32 ms at 1 x 8K at commit 9b96aa2, before the steady-state call);
- ``host``: ``time.perf_counter`` around the same call with the stream kept busy by a long
  kernel in front, so the call only enqueues: the Python cost alone;
- ``graph``: the same call captured once in a CUDA graph and replayed back to back (the kernel
  alone; ``_timing.graph_ms``).

The first call of a shape resolves its plan (device, capabilities, verification): that cost is
left out by the warm-up, since vLLM pays it once per process. Prints a table, writes
``eager_overhead.json`` under ``--out``. Measures; asserts nothing.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Optional

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _timing import device_info, event_ms, graph_ms, print_table, write_results  # noqa: E402

HEADS, KV_HEADS, HEAD, BLOCK = 24, 4, 256, 16
ROWS = ((1, 8192), (1, 100_000), (8, 100_000))


def _case(batch: int, tokens: int, backend: Optional[str]):
    import attn_core

    x = 16 // 2
    blocks_per_seq = -(-tokens // BLOCK)
    num_blocks = batch * blocks_per_seq
    dev = torch.device("cuda")
    key_cache = torch.randn(
        num_blocks, KV_HEADS, HEAD // x, BLOCK, x, dtype=torch.float16, device=dev
    )
    value_cache = torch.randn(num_blocks, KV_HEADS, HEAD, BLOCK, dtype=torch.float16, device=dev)
    table = torch.randperm(num_blocks, device=dev).to(torch.int32).view(batch, blocks_per_seq)
    seq_lens = torch.full((batch,), tokens, dtype=torch.int32, device=dev)
    query = torch.randn(batch, HEADS, HEAD, dtype=torch.float16, device=dev)
    out = torch.empty_like(query)

    def call() -> torch.Tensor:
        return attn_core.paged_decode(
            query, key_cache, value_cache, table, seq_lens, tokens, out=out, backend=backend
        )

    return call


def _events_ms(fn, reps: int = 20) -> float:
    times = []
    for _ in range(reps):
        torch.cuda.synchronize()  # an idle stream: the GPU waits for the host's launch
        times.append(event_ms(fn))
    return statistics.median(times)


def _host_ms(fn, reps: int = 20) -> float:
    busy = torch.empty(1 << 26, device="cuda")
    times = []
    for _ in range(reps):
        torch.cuda.synchronize()
        for _ in range(20):  # keep the stream busy well past the call's enqueue
            busy.mul_(1.0)
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    torch.cuda.synchronize()
    return statistics.median(times)


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="bench/eager_overhead.py", description=__doc__)
    parser.add_argument("--out", default="results", help="directory for eager_overhead.json")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("eager_overhead: needs a CUDA device; nothing measured")
        return 0
    rows = []
    for backend in ("native", "torch"):
        for batch, tokens in ROWS:
            try:
                call = _case(batch, tokens, backend)
                for _ in range(3):  # the first call resolves and verifies: vLLM pays it once
                    call()
                torch.cuda.synchronize()
            except (ValueError, RuntimeError) as exc:  # native not built/verified here
                rows.append({"backend": backend, "batch x ctx": f"{batch} x {tokens}",
                             "eager ms": None, "host ms": None, "graph ms": None,
                             "note": str(exc)[:60]})  # fmt: skip
                continue
            rows.append({
                "backend": backend,
                "batch x ctx": f"{batch} x {tokens}",
                "eager ms": _events_ms(call),
                "host ms": _host_ms(call),
                "graph ms": graph_ms([call])[0],
                "note": "",
            })  # fmt: skip
    columns = ["backend", "batch x ctx", "eager ms", "host ms", "graph ms", "note"]
    path = write_results(
        args.out, "eager_overhead.json", {"device": device_info(torch.device("cuda")), "rows": rows}
    )
    print_table(rows, columns)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
