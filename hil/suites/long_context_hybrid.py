"""Long-context suite, hybrid case: one Gated DeltaNet layer of the hybrid model prefills a
long prompt, then takes one decode step from the state the prompt left.

At context T: random inputs of T + 1 tokens (:func:`hybrid_layer.layer_inputs`, l2norm in the
kernel); ``attn_core.chunk_gated_delta_rule`` (default backend: native where verified) over the
first T tokens with its final state out, then ``attn_core.gated_delta_decode`` for token T with
that state as a one-slot pool. Checked in float64:

- ``prefix_rel_error``: the first ``min(T, prefix)`` outputs against
  ``attn_core.reference.reference_gated_delta``, the independent reference. It runs on the CPU
  token by token (about 1.5 ms a token at the model's shape), so a whole 256K prompt would take
  minutes per context: the prefix ties each run to it, the whole sequence is checked below;
- ``prompt_rel_error``, ``decode_rel_error``, ``state_rel_error``: every prompt output, the
  decode output and the state after the decode step against :func:`float64_recurrence`, the
  same rule in float64 on the run's device (a few launches a token: seconds at 256K on a GPU),
  one segment at a time so its memory stays bounded. That it is the reference's rule is a CPU
  test (hil/tests/test_long_context_hybrid.py);
- ``rel_error``: the worst of the four (what the tolerance judges).

Timed after the check: the prefill's and the decode step's medians (``median_s`` is their sum)
and the peak device memory over the timed calls.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Iterator
from typing import Optional

import torch
from hybrid_layer import HYBRID_LAYER, LayerInputs, LinearLayerShape, layer_inputs, served

QUICK_LAYER = LinearLayerShape(2, 4, 64, 64)
FULL_PREFIX, QUICK_PREFIX = 512, 128  # tokens checked against the CPU reference
SEGMENT = 4096  # tokens of the float64 recurrence held at once (5 x 128 MiB at the full shape)
TORCH_WORKSPACE = 512 * 1024**2  # the chunked torch path's default plan budget


def float64_recurrence(x: LayerInputs, segment: int = SEGMENT) -> Iterator[tuple]:
    """The gated delta rule in float64 on ``x``'s device, row 0, from a zero state.

    Yields ``(start, outputs [S, HV, V], state [HV, K, V])`` per segment of ``S <= segment``
    tokens; the state is the live tensor (the state after that segment until the next yield).
    """
    from attn_core.reference.gated_delta import l2_normalise

    _, tokens, heads, dk = x.q.shape
    hv, dv = x.v.shape[2], x.v.shape[3]
    group, scale = hv // heads, dk**-0.5
    state = torch.zeros(hv, dk, dv, dtype=torch.float64, device=x.q.device)
    for start in range(0, tokens, segment):
        span = slice(start, min(start + segment, tokens))
        q = l2_normalise(x.q[0, span].double()).repeat_interleave(group, 1) * scale
        k = l2_normalise(x.k[0, span].double()).repeat_interleave(group, 1)
        v, beta = x.v[0, span].double(), x.beta[0, span].double()
        decay = x.g[0, span].double().exp()
        out = torch.empty(v.shape, dtype=torch.float64, device=v.device)
        for i in range(v.shape[0]):
            state.mul_(decay[i, :, None, None])
            recalled = torch.bmm(k[i, :, None, :], state)[:, 0]
            state.baddbmm_(k[i, :, :, None], (beta[i, :, None] * (v[i] - recalled))[:, None, :])
            out[i] = torch.bmm(q[i, :, None, :], state)[:, 0]
        yield start, out, state


def relative(diff_sq: float, ref_sq: float) -> float:
    return (diff_sq / max(ref_sq, 1e-300)) ** 0.5


def squared_errors(got: torch.Tensor, want: torch.Tensor) -> tuple:
    """``(sum of squared differences, sum of squared reference, max abs difference)``; a
    non-finite element (unwritten) gives inf."""
    got = got.double()
    if not bool(torch.isfinite(got).all()):
        return float("inf"), float(want.pow(2).sum()), float("inf")
    diff = got - want
    return float(diff.pow(2).sum()), float(want.pow(2).sum()), float(diff.abs().max())


def whole_sequence_errors(x: LayerInputs, prompt_out: torch.Tensor, decode_out: torch.Tensor,
                          state: torch.Tensor) -> dict:  # fmt: skip
    """Errors of attn-core's ``prompt_out [1, T, HV, V]``, ``decode_out [1, HV, V]`` and the
    state after the decode step ``[HV, K, V]`` against :func:`float64_recurrence` over the
    T + 1 tokens of ``x``."""
    prompt_len = prompt_out.shape[1]
    diff_sq = ref_sq = max_abs = 0.0
    last = None
    for start, want, live_state in float64_recurrence(x):
        last = (want[-1], live_state)
        end = min(start + want.shape[0], prompt_len)
        if end > start:
            d, r, m = squared_errors(prompt_out[0, start:end], want[: end - start])
            diff_sq, ref_sq, max_abs = diff_sq + d, ref_sq + r, max(max_abs, m)
    want_decode, want_state = last
    d, r, m = squared_errors(decode_out[0], want_decode)
    ds, rs, _ = squared_errors(state, want_state)
    return {
        "prompt_rel_error": relative(diff_sq, ref_sq),
        "decode_rel_error": relative(d, r),
        "state_rel_error": relative(ds, rs),
        "max_abs_error": max(max_abs, m),
    }


def prefix_error(x: LayerInputs, prompt_out: torch.Tensor, prefix: int) -> float:
    """Relative error of the first ``prefix`` outputs against the CPU float64 reference."""
    from attn_core.reference import reference_gated_delta

    head = LayerInputs(*(t[:, :prefix] for t in (x.q, x.k, x.v, x.g, x.beta)))
    want, _ = reference_gated_delta(head.q, head.k, head.v, head.g, head.beta, use_qk_l2norm=True)
    d, r, _ = squared_errors(prompt_out[0, :prefix].cpu(), want[0])
    return relative(d, r)


def hybrid_fits(tokens: int, shape: LinearLayerShape, elem: int, device: str,
                margin: int) -> Optional[str]:  # fmt: skip
    """None when the case fits in free device memory, else why not."""
    if device != "cuda":
        return None
    free, _ = torch.cuda.mem_get_info()
    per_token = 2 * shape.num_heads * shape.head_k + 2 * shape.num_value_heads * shape.head_v
    recurrence = 5 * SEGMENT * shape.num_value_heads * max(shape.head_k, shape.head_v) * 8
    need = tokens * per_token * elem + TORCH_WORKSPACE + recurrence  # inputs + out, workspace
    if need + margin > free:
        return f"needs about {need / 1e9:.1f} GB + margin, {free / 1e9:.1f} GB free"
    return None


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def median_seconds(fn: Callable[[], object], device: str, warmup: int, repeats: int) -> tuple:
    """``(median, min)`` seconds of ``fn`` on the host clock, the device synced around each."""
    for _ in range(warmup):
        fn()
    sync(device)
    times = []
    for _ in range(max(repeats, 1)):
        t0 = time.perf_counter()
        fn()
        sync(device)
        times.append(time.perf_counter() - t0)
    return statistics.median(times), min(times)


def record_head(context: int, shape: LinearLayerShape, dtype: torch.dtype, device: str) -> dict:
    elem = torch.empty((), dtype=dtype).element_size()
    per_token = 2 * shape.num_heads * shape.head_k + shape.num_value_heads * shape.head_v
    return {
        "kind": "hybrid",
        "backend": None,
        "num_seqs": 1,
        "context_len": context,
        "query_len": 1,  # the decode step after the prompt
        "num_heads": shape.num_heads,
        "num_value_heads": shape.num_value_heads,
        "head_size": shape.head_k,
        "head_v": shape.head_v,
        "dtype": str(dtype).replace("torch.", ""),
        "device": torch.cuda.get_device_name(0) if device == "cuda" else "cpu",
        "kv_bytes": context * per_token * elem,  # the prompt's q, k, v the prefill reads
    }


def hybrid_record(context: int, quick: bool, dtype: torch.dtype, device: str, args,
                  margin: int) -> dict:  # fmt: skip
    """One measured hybrid case at ``context`` prompt tokens (see the module doc)."""
    import attn_core

    shape = QUICK_LAYER if quick else HYBRID_LAYER
    rec = record_head(context, shape, dtype, device)
    elem = torch.empty((), dtype=dtype).element_size()
    why_not = hybrid_fits(context + 1, shape, elem, device, margin)
    if why_not:
        rec["skipped"] = why_not
        return rec
    x = layer_inputs(1, context + 1, shape, dtype, device, args.seed)
    prompt = LayerInputs(*(t[:, :context] for t in (x.q, x.k, x.v, x.g, x.beta)))
    step = x.token(context)
    native = served(device, shape, dtype, None)
    rec.update(backend=native["backend"], decode_backend=native["backend"],
               backend_detail=native["detail"])  # fmt: skip

    def prefill():
        return attn_core.chunk_gated_delta_rule(
            prompt.q, prompt.k, prompt.v, prompt.g, prompt.beta, output_final_state=True,
            use_qk_l2norm_in_kernel=True,
        )  # fmt: skip

    prompt_out, final = prefill()
    pool, slot = final.clone(), torch.zeros(1, dtype=torch.int32, device=device)
    decode_out = torch.full(step.v.shape, float("nan"), dtype=dtype, device=device)

    def decode():
        return attn_core.gated_delta_decode(
            step.q, step.k, step.v, step.g, step.beta, pool, slot, use_qk_l2norm_in_kernel=True,
            out=decode_out,
        )  # fmt: skip

    decode()
    sync(device)
    t0 = time.monotonic()
    prefix = min(context, QUICK_PREFIX if quick else FULL_PREFIX)
    rec["reference_prefix"] = prefix
    rec["prefix_rel_error"] = prefix_error(x, prompt_out, prefix)
    rec.update(whole_sequence_errors(x, prompt_out, decode_out, pool[0]))
    rec["reference_s"] = round(time.monotonic() - t0, 3)
    parts = ("prefix", "prompt", "decode", "state")
    rec["rel_error"] = max(rec[f"{p}_rel_error"] for p in parts)
    del prompt_out, final
    rec.update(timings(prefill, decode, device, args))
    rec["bandwidth_bytes_per_s"] = rec["kv_bytes"] / rec["median_s"]
    return rec


def timings(prefill: Callable[[], object], decode: Callable[[], object], device: str,
            args) -> dict:  # fmt: skip
    """Medians of both forms and the peak device memory over them (None off CUDA)."""
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
    prefill_s, prefill_min = median_seconds(prefill, device, args.warmup, args.repeats)
    decode_s, decode_min = median_seconds(decode, device, args.warmup, args.repeats)
    out = {
        "prefill_s": prefill_s,
        "decode_s": decode_s,
        "median_s": prefill_s + decode_s,
        "min_s": prefill_min + decode_min,
        "repeats": max(args.repeats, 1),
        "peak_bytes": None,  # not tracked for CPU tensors
    }
    if device == "cuda":
        out["peak_bytes"] = torch.cuda.max_memory_allocated()
        out["transient_peak_bytes"] = out["peak_bytes"] - base
    return out
