"""Host cost of resolving a prefill plan, against the call that runs it.

    python bench/prefill_resolve.py [--device cpu|cuda] [--iters N]

vLLM calls ``paged_prefix_prefill`` once per layer per chunk (64 layers for the lab model), so
whatever a call spends resolving its plan repeats 64 times per chunk unless it is cached.
Per row (small GQA chunks over a paged context, permuted block tables):

- ``resolve_us``: :func:`attn_core.prefill_plan_for` alone (profile, capabilities, verified
  backends, native variants priced, the pure planner), the work a cache miss does;
- ``auto_us``: one call with no ``plan=`` (what vLLM runs);
- ``plan_us``: the same call given the resolved plan (no resolution at all);
- ``auto - plan``: what the call's plan lookup still costs (~0 once plans are cached).

Medians (``perf_counter`` on the CPU, CUDA events on a GPU) after warm-up, one thread on the
CPU. Prints a table; asserts nothing.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Optional

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _args  # noqa: E402
from _timing import device_info, median_time_s, print_table  # noqa: E402

# (context, chunk) per sequence, heads, KV heads, head size, dtype
ROWS = (
    ([(40, 9), (5, 4)], 8, 2, 64, torch.float32),
    ([(100, 1)], 8, 2, 64, torch.float16),
    ([(1000, 64)], 24, 4, 256, torch.float16),
)


def _row(seqs, heads, kv_heads, head_size, dtype, device, iters) -> dict:
    import attn_core
    from attn_core.core.workspace import Workspace
    from attn_core.reference import make_prefill_case

    case = make_prefill_case(seqs, heads, kv_heads, head_size, 16, dtype, device, seed=1)
    shape = attn_core.AttentionShape(heads, kv_heads, head_size, 16, dtype)
    lengths = attn_core.PrefillLengths(
        case.max_query_len, int(case.context_lens.max()), num_seqs=len(seqs),
        num_tokens=case.query.shape[0],
    )  # fmt: skip
    plan = attn_core.prefill_plan_for(shape, lengths, device)
    ws, out = Workspace(), torch.empty_like(case.query)

    def call(**kw) -> None:
        attn_core.paged_prefix_prefill(*case.args(), **case.kwargs(), out=out, workspace=ws, **kw)

    resolve = median_time_s(lambda: attn_core.prefill_plan_for(shape, lengths, device), device,
                            iters=iters)  # fmt: skip
    auto = median_time_s(call, device, iters=iters)
    planned = median_time_s(lambda: call(plan=plan), device, iters=iters)
    return {
        "case": f"{seqs} {heads}/{kv_heads}x{head_size} {str(dtype).replace('torch.', '')}",
        "backend": plan.backend,
        "resolve_us": resolve * 1e6,
        "auto_us": auto * 1e6,
        "plan_us": planned * 1e6,
        "auto - plan": (auto - planned) * 1e6,
    }


def main(argv: Optional[list[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", type=_args.device, default="cpu")
    parser.add_argument("--iters", type=_args.positive_int, default=200)
    args = parser.parse_args(argv)
    device = args.device
    if device.type == "cpu":
        torch.set_num_threads(1)
    print(device_info(device))
    rows = [_row(*r, device, args.iters) for r in ROWS]
    print_table(rows, ("case", "backend", "resolve_us", "auto_us", "plan_us", "auto - plan"))


if __name__ == "__main__":
    main()
