"""One Gated DeltaNet layer (the hybrid model's linear attention): prefill and decode timings.

    python bench/linear_attn_bench.py [--out results/] [--quick] [--prefill 32768,131072,262144]
        [--varlen 8x16384] [--decode-batches 1,8,64] [--iters 3] [--budget-s 300]
        [--matrix-tflops F] [--no-launches]

Shape: 16 key / 32 value heads, K = V = 128, bf16 q/k/v, fp32 g and the state, l2-normalised
q/k (as the model calls it). Implementations, each where it can run here:

- ``attn-core torch``: :func:`attn_core.chunk_gated_delta_rule` (prefill) and
  :func:`attn_core.gated_delta_decode` on a state pool of 2 x batch slots (decode);
- ``attn-core native`` (decode): the same call with ``backend="native"`` (csrc/gated_delta.cu,
  built through the loader on first use; a row with a note where it cannot run), and again on
  a key-last ``[.., V, K]`` pool read through its strides (vLLM's later layout);
- ``transformers``: ``torch_chunk_gated_delta_rule`` / ``torch_recurrent_gated_delta_rule`` from
  ``transformers.models.qwen3_next`` (q/k repeated to the value heads as the model does; the
  varlen case runs as a batch of equal rows, which it is); skipped with a note when transformers
  is not importable;
- ``fla triton``: ``fla.ops.gated_delta_rule`` where importable (never on BI-V100);
- ``attn-core native chunked`` / ``attn-core native recurrent`` (prefill):
  :func:`attn_core.chunk_gated_delta_rule` / :func:`attn_core.fused_recurrent_gated_delta_rule`
  with ``backend="native"``: the chunked call runs the kernel the library picks
  (:func:`attn_core.native.split.native_prefill_kernel`), the recurrent one a block per (32 value
  columns, value head, sequence) walking its sequence token by token with its state slice on
  chip. ``attn-core native fused`` / ``attn-core native chunk-parallel`` / ``attn-core native
  16-bit pair`` launch each chunked kernel directly, whatever the choice: the fused 16-token
  kernel, the chunk-parallel pair (64-token chunks, a 64 MiB workspace, fp32 operands) and the
  same pair with 16-bit operands on the matrix unit (csrc/gated_delta_pair16.cuh; NVIDIA). The
  ``attn-core torch`` rows pass ``backend="torch"`` (the default is native where verified).

Columns: median ms (CUDA events); ``mode`` eager or ``graph`` (decode: one step captured in a
CUDA graph and replayed back to back, :func:`_timing.graph_ms`); ``transient_mib``: peak
allocated above the inputs, outputs and final states excluded; ``launches``: device kernels per
call (torch.profiler), and ``kernels``: the three that took the most device time in that call
(ms summed over their launches: the chunk-parallel pair's split); ``floor_ms`` and ``x_floor``:
decode moves each sequence's 2 MiB fp32 state in and out at least once (``2 x 2 MiB x batch`` at
the copy rate measured here), prefill's floor is its matrix FLOPs (``6 K V + 4 C (K + V)`` per
token and value head, C = 64) at ``--matrix-tflops`` (default: the bf16 matmul rate measured
here); ``max_err``: attn-core's prefill against the float64 reference on the first 128 tokens,
other rows against attn-core (``diff``).

Each row is printed when measured and ``<out>/linear_attn_bench.json`` is rewritten after every
row; ``--budget-s`` starts no new row after that many seconds. ``--quick``: tiny sizes that
finish on a CPU in seconds.
"""

from __future__ import annotations

import argparse
import functools
import inspect
import os
import sys
from collections.abc import Callable
from typing import Any, Optional

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _run  # noqa: E402
from _run import say  # noqa: E402
from _timing import (  # noqa: E402
    copy_bandwidth,
    device_info,
    graph_ms,
    kernel_profile,
    matmul_flops,
    median_time_s,
    print_table,
    synchronize,
    transient_peak_bytes,
)

from attn_core import (  # noqa: E402
    chunk_gated_delta_rule,
    fused_recurrent_gated_delta_rule,
    gated_delta_decode,
)
from attn_core.linear.backend import native_library  # noqa: E402
from attn_core.native.gated_delta import (  # noqa: E402
    LinearShape,
    launch_chunk_parallel_prefill,
    launch_recurrent_prefill,
)
from attn_core.reference import reference_gated_delta  # noqa: E402

SHAPE = {"heads": 16, "value_heads": 32, "head_k": 128, "head_v": 128}
QUICK_SHAPE = {"heads": 2, "value_heads": 4, "head_k": 32, "head_v": 32}
CHUNK = 64
CHECK_TOKENS = 128
COLUMNS = (
    "kind", "case", "impl", "mode", "ms", "floor_ms", "x_floor", "transient_mib", "launches",
    "kernels", "max_err", "note",
)  # fmt: skip


def main(argv: Optional[list[str]] = None) -> int:
    args = _parse(argv)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    shape = QUICK_SHAPE if args.quick else SHAPE
    rate = args.matrix_tflops * 1e12 if args.matrix_tflops else _bf16_rate(device, args.quick)
    copy = copy_bandwidth(device, nbytes=(1 << 24) if args.quick else (1 << 30))
    run = Run(args, {"device": device_info(device), "shape": shape, "matrix_flops": rate,
                     "copy_bandwidth_bytes_s": copy})  # fmt: skip
    say(f"matrix {rate / 1e12:.1f} TFLOP/s, copy {copy / 1e9:.0f} GB/s")
    impls = _baselines()
    # attn-core's native prefill kernels: 16-token chunks, and token by token (varlen)
    native_chunked = functools.partial(chunk_gated_delta_rule, backend="native")
    impls["attn-core native chunked"] = (native_chunked, None, "")
    native_recurrent = functools.partial(fused_recurrent_gated_delta_rule, backend="native")
    impls["attn-core native recurrent"] = (native_recurrent, None, "")
    impls["attn-core native fused"] = (functools.partial(_native_kernel, False), None, "")
    impls["attn-core native chunk-parallel"] = (functools.partial(_native_kernel, True), None, "")
    impls["attn-core native 16-bit pair"] = (functools.partial(_native_kernel, "pair16"), None, "")
    for name, (_, _, note) in impls.items():
        if note:
            say(f"{name}: {note}")
            run.payload.setdefault("skipped_impls", {})[name] = note
    # decode first: its rows take seconds, and a long prefill row must not spend their budget
    for batch in args.decode_batches:
        _decode_rows(run, batch, shape, device, impls)
    for lens in [[n] for n in args.prefill] + ([args.varlen] if args.varlen else []):
        _prefill_rows(run, lens, shape, device, impls)
    run.payload["complete"] = not run.payload["skipped"]
    path = run.save()
    say(f"done in {run.elapsed():.0f} s; {len(run.payload['skipped'])} skipped; {path}")
    for name, note in run.payload.get("skipped_impls", {}).items():
        say(f"not measured: {name} ({note})")
    print_table(run.payload["rows"], COLUMNS)
    return 0


def _parse(argv: Optional[list[str]]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="results")
    p.add_argument("--quick", action="store_true", help="tiny sizes (CPU smoke run)")
    p.add_argument("--prefill", default="", help="comma-separated prefill lengths")
    p.add_argument("--varlen", default=None, help="NxL: N sequences of L tokens in one varlen call")
    p.add_argument("--decode-batches", default="", help="comma-separated decode batch sizes")
    p.add_argument("--iters", type=int, default=3, help="timed calls per row")
    p.add_argument("--budget-s", type=float, default=300.0, help="start no row after this")
    p.add_argument("--matrix-tflops", type=float, default=None, help="prefill floor's rate")
    p.add_argument("--no-launches", action="store_true", help="skip the profiled calls")
    args = p.parse_args(argv)
    try:
        args.prefill = _ints(args.prefill) or ([256, 1024] if args.quick else
                                               [32768, 131072, 262144])  # fmt: skip
        args.decode_batches = _ints(args.decode_batches) or ([1, 4] if args.quick else [1, 8, 64])
        varlen = args.varlen or ("2x128" if args.quick else "8x16384")
        count, sep, length = varlen.lower().partition("x")
        if not sep:
            raise ValueError(f"--varlen must be NxL (N sequences of L tokens), got {varlen!r}")
        args.varlen = [_positive(length)] * _positive(count)
    except ValueError as exc:
        p.error(str(exc))  # exits 2
    if args.iters < 1:
        p.error(f"--iters must be >= 1, got {args.iters}")
    if args.matrix_tflops is not None and not args.matrix_tflops > 0:
        p.error(f"--matrix-tflops must be > 0, got {args.matrix_tflops}")
    return args


def _ints(text: str) -> list[int]:
    return [_positive(t) for t in text.split(",") if t.strip()]


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise ValueError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise ValueError(f"expected a positive integer, got {value}")
    return value


def _bf16_rate(device: torch.device, quick: bool) -> float:
    rate = matmul_flops(device, torch.bfloat16, n=512 if quick else 8192)
    return rate if rate == rate else matmul_flops(device, torch.float32, n=512)  # NaN: no bf16 mm


class Run(_run.Run):
    filename = "linear_attn_bench.json"

    def line(self, row: dict[str, Any]) -> str:
        ms = f"{row['ms']:10.3f} ms" if row.get("ms") else "         - ms"
        return (
            f"[{self.elapsed():6.1f} s] {row['kind']:<7} {row['case']:<10} {row['impl']:<16} "
            f"{row['mode']:<5} {ms} mem {row.get('transient_mib')} launches "
            f"{row.get('launches')} err {row.get('max_err')} {row.get('note', '')}"
        )


# --- baselines: imported where present, a note where not ---------------------------------------


def _baselines() -> dict[str, tuple[Optional[Callable], Optional[Callable], str]]:
    """``name -> (prefill fn, decode fn, note)``; the note says why a baseline is missing."""
    found: dict[str, tuple[Optional[Callable], Optional[Callable], str]] = {}
    try:
        from transformers.models.qwen3_next import modeling_qwen3_next as tf

        # newer transformers wrap these in a hub-kernel switch that calls FLA when it is
        # importable (found on an H200 with fla-core carried): unwrap to time the torch fallback
        chunk, recurrent = tf.torch_chunk_gated_delta_rule, tf.torch_recurrent_gated_delta_rule
        found["transformers"] = (inspect.unwrap(chunk), inspect.unwrap(recurrent), "")
    except Exception as exc:  # ImportError, or a transformers without this model
        found["transformers"] = (None, None, f"not importable: {type(exc).__name__}: {exc}"[:160])
    try:
        from fla.ops.gated_delta_rule import (
            chunk_gated_delta_rule as fla_chunk,
        )
        from fla.ops.gated_delta_rule import (
            fused_recurrent_gated_delta_rule as fla_recurrent,
        )

        found["fla triton"] = (fla_chunk, fla_recurrent, "")
    except Exception as exc:
        found["fla triton"] = (None, None, f"not importable: {type(exc).__name__}: {exc}"[:160])
    return found


def _native_kernel(
    parallel: bool | str,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    cu_seqlens: Optional[torch.Tensor] = None,
    output_final_state: bool = True,
    use_qk_l2norm_in_kernel: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One of the native chunked kernels launched directly on ``[1, T, ...]`` inputs:
    ``(o, final states)``: the fused kernel, the fp32 pair (``parallel``) or the 16-bit pair
    (``"pair16"``)."""
    t, h, dk = q.shape[1:]
    hv, dv = v.shape[2:]
    shape = LinearShape(h, hv, dk, dv, q.dtype)
    lib = native_library("native", "the bench's native kernels", q.device, shape, None)
    assert lib is not None  # backend="native" raises instead
    bounds = [0, t] if cu_seqlens is None else cu_seqlens.tolist()
    lengths = [b - a for a, b in zip(bounds, bounds[1:], strict=False)]
    out = torch.empty(t, hv, dv, dtype=v.dtype, device=v.device)
    final = torch.empty(len(lengths), hv, dk, dv, device=v.device)
    x = {"q": q[0], "k": k[0], "v": v[0], "g": g[0], "beta": beta[0]}
    common = {"scale": dk**-0.5, "l2norm": use_qk_l2norm_in_kernel, "final_state": final}
    if parallel:
        launch_chunk_parallel_prefill(lib, **x, lengths=lengths, out=out,
                                      operands16=parallel == "pair16", **common)  # fmt: skip
    else:
        offsets = torch.tensor(bounds, dtype=torch.int32, device=q.device)
        launch_recurrent_prefill(lib, **x, cu_seqlens=offsets, out=out, chunked=True, **common)
    return out[None], final


# --- inputs -------------------------------------------------------------------------------------


def _inputs(
    b: int, t: int, shape: dict, device: torch.device, seed: int
) -> dict[str, torch.Tensor]:
    """Model-like inputs ``[b, t, ...]``: bf16 q/k/v, fp32 g in about [-5, 0], bf16 beta."""
    gen = torch.Generator(device=device).manual_seed(seed)
    h, hv, dk, dv = shape["heads"], shape["value_heads"], shape["head_k"], shape["head_v"]

    def randn(*s: int) -> torch.Tensor:
        return torch.randn(*s, generator=gen, device=device, dtype=torch.bfloat16)

    g = -torch.rand(b, t, hv, generator=gen, device=device).mul_(5.0).square_().div_(5.0)
    beta = torch.rand(b, t, hv, generator=gen, device=device).to(torch.bfloat16)
    return {"q": randn(b, t, h, dk), "k": randn(b, t, h, dk), "v": randn(b, t, hv, dv),
            "g": g, "beta": beta}  # fmt: skip


def _prefill_flops(tokens: int, shape: dict) -> float:
    dk, dv, hv = shape["head_k"], shape["head_v"], shape["value_heads"]
    return float(tokens * hv * (6 * dk * dv + 4 * CHUNK * (dk + dv)))


# --- prefill -------------------------------------------------------------------------------------


def _prefill_call(fn: Callable, name: str, x: dict, cu: Optional[torch.Tensor], lens: list[int],
                  group: int) -> Callable:  # fmt: skip
    """One prefill call of ``fn`` in its own convention (attn-core and fla: varlen;
    transformers: a batch of equal rows with q/k repeated to the value heads)."""
    if name != "transformers":
        return lambda: fn(**x, cu_seqlens=cu, output_final_state=True,
                          use_qk_l2norm_in_kernel=True)  # fmt: skip
    rows = {k: v.view(len(lens), lens[0], *v.shape[2:]) for k, v in x.items()}
    q, k = (rows[n].repeat_interleave(group, dim=2) for n in ("q", "k"))
    return lambda: fn(q, k, rows["v"], rows["g"], rows["beta"], output_final_state=True,
                      use_qk_l2norm_in_kernel=True)  # fmt: skip


def _prefill_rows(run: Run, lens: list[int], shape: dict, device: torch.device, impls) -> None:
    label = str(lens[0]) if len(lens) == 1 else f"{len(lens)}x{lens[0]}"
    if not run.has_time(f"prefill {label}: every impl"):
        return
    total = sum(lens)
    x = _inputs(1, total, shape, device, seed=total)
    cu = None
    if len(lens) > 1:
        cu = torch.tensor([0, *[sum(lens[: i + 1]) for i in range(len(lens))]], device=device)
    hv, dk, dv = shape["value_heads"], shape["head_k"], shape["head_v"]
    out_bytes = total * hv * dv * 2 + len(lens) * hv * dk * dv * 4  # o (bf16) and final states
    floor = 1e3 * _prefill_flops(total, shape) / run.payload["matrix_flops"]
    base = {"kind": "prefill", "case": label, "mode": "eager", "floor_ms": floor}
    group = shape["value_heads"] // shape["heads"]
    torch_chunked = functools.partial(chunk_gated_delta_rule, backend="torch")
    ours = _prefill_call(torch_chunked, "attn-core torch", x, cu, lens, group)
    first = _measure(run, {**base, "impl": "attn-core torch"}, ours, device, out_bytes)
    ours_out = first[0] if first is not None else None
    del first
    if ours_out is not None:
        n = min(CHECK_TOKENS, lens[0])
        cut = [x[k][:, :n] for k in ("q", "k", "v", "g", "beta")]
        want, _ = reference_gated_delta(*cut, use_qk_l2norm=True)
        err = (ours_out[:, :n].double().cpu() - want).abs().max()
        run.payload["rows"][-1]["max_err"] = float(err)
        run.save()
    for name, (prefill, _, _) in impls.items():
        row = {**base, "impl": name}
        if prefill is None:
            continue
        if not run.has_time(f"prefill {label}: {name}"):
            continue
        got = _measure(run, row, _prefill_call(prefill, name, x, cu, lens, group), device,
                       out_bytes)  # fmt: skip
        if got is not None and ours_out is not None:
            diff = (got[0].reshape(ours_out.shape).float() - ours_out.float()).abs().max()
            run.payload["rows"][-1]["max_err"] = float(diff)
            run.payload["rows"][-1]["note"] = "max_err: diff to attn-core"
            run.save()
        del got


def _measure(run: Run, row: dict, fn: Callable, device, out_bytes: int) -> Optional[Any]:
    """Time ``fn`` (one warm call first), its transient peak, launches and kernels; returns the
    warm call's result (None when it failed, with the failure in the row's note)."""
    result = None
    try:
        result = fn()
        synchronize(device)
        row["ms"] = 1e3 * median_time_s(fn, device, warmup=0, iters=run.args.iters)
        peak = transient_peak_bytes(fn, device)
        row["transient_mib"] = None if peak is None else round((peak - out_bytes) / 2**20, 1)
        first_prefill = row["case"] == str(run.args.prefill[0])
        if not run.args.no_launches and (row["kind"] == "decode" or first_prefill):
            profiled = kernel_profile(fn, device)
            if profiled is not None:
                row["launches"] = profiled.launches
                row["kernels"] = profiled.top() or None
    except torch.cuda.OutOfMemoryError as exc:
        row["note"] = f"out of memory: {str(exc)[:60]}"
    except (RuntimeError, TypeError, ValueError) as exc:
        row["note"] = f"failed: {type(exc).__name__}: {str(exc)[:80]}"
    if row.get("ms") and row.get("floor_ms"):
        row["x_floor"] = row["ms"] / row["floor_ms"]
    run.add(row)
    return result


# --- decode --------------------------------------------------------------------------------------


def _decode_rows(run: Run, batch: int, shape: dict, device: torch.device, impls) -> None:
    label = f"batch {batch}"
    if not run.has_time(f"decode {label}: every impl"):
        return
    hv, dk, dv = shape["value_heads"], shape["head_k"], shape["head_v"]
    x = {k: v[0] for k, v in _inputs(1, batch, shape, device, seed=batch).items()}  # [N, ...]
    pool = torch.randn(2 * batch, hv, dk, dv, device=device) * 0.1
    idx = torch.arange(batch, device=device, dtype=torch.int32) * 2
    out = torch.empty(batch, hv, dv, dtype=torch.bfloat16, device=device)
    state_bytes = hv * dk * dv * 4
    floor = 1e3 * 2 * state_bytes * batch / run.payload["copy_bandwidth_bytes_s"]
    base = {"kind": "decode", "case": label, "floor_ms": floor}

    def step(backend: str, states: torch.Tensor) -> Callable:
        kw = dict(state_pool=states, state_indices=idx, out=out, backend=backend)
        return lambda: gated_delta_decode(**x, **kw, use_qk_l2norm_in_kernel=True)

    def copy_of_pool(key_last: bool) -> torch.Tensor:
        """The pool, or a key-last ``[.., V, K]`` copy of it seen as ``[.., K, V]`` (vLLM's
        later layout: the kernel reads it through its strides)."""
        return pool.transpose(-1, -2).contiguous().transpose(-1, -2) if key_last else pool.clone()

    first = None
    for impl, backend, key_last in (
        ("attn-core torch", "torch", False),
        ("attn-core native", "native", False),
        ("attn-core native, key-last pool", "native", True),
    ):
        row = {**base, "impl": impl, "mode": "eager"}
        try:  # one step from the same pool: the native row's max_err is its diff to torch's
            got = step(backend, copy_of_pool(key_last))().float().clone()
        except ValueError as exc:  # no native library here: the row says why
            run.add({**row, "note": str(exc)[:120]})
            continue
        if first is None:
            first = got
        else:
            row["max_err"] = float((got - first).abs().max())
            row["note"] = "max_err: diff to attn-core torch"
        ours = step(backend, copy_of_pool(key_last))
        _measure(run, row, ours, device, 0)
        _graph_row(run, {**row, "mode": "graph"}, ours, device)
    group = hv // shape["heads"]
    states = pool[:batch].clone()
    for name, (_, recurrent, _) in impls.items():
        row = {**base, "impl": name, "mode": "eager"}
        if recurrent is None:
            continue
        fn = _decode_call(recurrent, name, x, states, group)
        _measure(run, row, fn, device, 0)
        _graph_row(run, {**row, "mode": "graph"}, fn, device)


def _decode_call(fn: Callable, name: str, x: dict, states: torch.Tensor, group: int) -> Callable:
    """One token per sequence through a baseline's recurrent function (states: ``[N, HV, K,
    V]``, no pool: the baselines keep no pool)."""
    one = {k: v[:, None] for k, v in x.items()}  # [N, 1, ...]
    if name != "transformers":
        return lambda: fn(**one, initial_state=states, output_final_state=True,
                          use_qk_l2norm_in_kernel=True)  # fmt: skip
    q, k = (one[n].repeat_interleave(group, dim=2) for n in ("q", "k"))
    return lambda: fn(q, k, one["v"], one["g"], one["beta"], states, True, True)


def _graph_row(run: Run, row: dict, fn: Callable, device: torch.device) -> None:
    if device.type != "cuda":
        return
    try:
        back_to_back, _ = graph_ms([fn])
        row["ms"] = back_to_back
        row["x_floor"] = back_to_back / row["floor_ms"]
    except Exception as exc:  # a step that cannot be captured says so in its row
        row["note"] = f"capture failed: {type(exc).__name__}: {str(exc)[:70]}"
    run.add(row)


if __name__ == "__main__":
    sys.exit(main())
