"""device-facts ``linear`` section: one Gated DeltaNet layer of the hybrid model timed in both
of its forms, and which backend serves it.

The layer is :data:`hybrid_layer.HYBRID_LAYER` (16 key / 32 value heads, heads of 128), bf16,
keys and queries l2-normalised in the kernel, as the model runs it:

- ``linear_backend``: for the prefill and the decode entry point, whether the native Gated
  DeltaNet library serves (loaded and matched the float64 reference here,
  ``attn_core.native.loader.native_ready``) or the torch path does, and why;
- ``linear_prefill_native_s`` / ``linear_prefill_torch_s``: ``attn_core.chunk_gated_delta_rule``
  over one prompt (zero initial state, final state out) with ``backend="native"`` (absent,
  saying why, where the library does not serve) and ``backend="torch"``;
- ``linear_decode``: rows ``{backend, batch, eager_s, graph_s}`` of ``attn_core.
  gated_delta_decode`` (one token per sequence against a state pool, rows at random slots),
  eager and as a CUDA-graph replay (``graph_error`` says why a replay is missing).

Times are medians: CUDA events on a GPU, the host's clock elsewhere (the suite itself runs this
section only on CUDA; the host clock serves the CPU tests).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from device_facts_record import absent, measured
from device_facts_tiers import time_eager, time_graph
from hybrid_layer import HYBRID_LAYER, LayerInputs, LinearLayerShape, layer_inputs, served

LINEAR_UNITS = {
    "linear_backend": "",
    "linear_prefill_native_s": "s",
    "linear_prefill_torch_s": "s",
    "linear_decode": "s",
}


def clock(device: torch.device) -> str:
    return "CUDA events" if device.type == "cuda" else "host clock (perf_counter)"


def prefill_call(x: LayerInputs, backend: str) -> Callable[[], object]:
    """One prompt, ``[1, T, ...]``, through the chunked form, its final state returned."""
    import attn_core

    return lambda: attn_core.chunk_gated_delta_rule(
        x.q, x.k, x.v, x.g, x.beta, output_final_state=True, use_qk_l2norm_in_kernel=True,
        backend=backend,
    )  # fmt: skip


def prefill_facts(x: LayerInputs, native: dict, repeats: int, what: str) -> dict:
    device = x.q.device
    facts = {}
    for backend in ("native", "torch"):
        name = f"linear_prefill_{backend}_s"
        if backend == "native" and native["backend"] != "native":
            facts[name] = absent("s", f"the native Gated DeltaNet library does not serve here: "
                                      f"{native['detail']}")  # fmt: skip
            continue
        method = (f"attn_core.chunk_gated_delta_rule(backend={backend!r}), {what}, one sequence "
                  f"of {x.q.shape[1]} tokens from a zero state, final state out, "
                  f"{clock(device)}, median of {repeats}")  # fmt: skip
        facts[name] = measured(time_eager(prefill_call(x, backend), device, repeats), "s", method)
    return facts


def decode_step(batch: int, shape: LinearLayerShape, dtype: torch.dtype, device: torch.device,
                backend: str) -> Callable[[], object]:  # fmt: skip
    """One decode token for ``batch`` sequences whose states sit at random slots of a pool
    ``[2 * batch, HV, K, V]`` (fp32), updated in place, ``out`` preallocated (capturable)."""
    import attn_core

    x = layer_inputs(batch, 1, shape, dtype, device, seed=batch).token(0)
    gen = torch.Generator().manual_seed(batch)
    pool = torch.randn(2 * batch, shape.num_value_heads, shape.head_k, shape.head_v,
                       generator=gen).mul_(0.1).to(device)  # fmt: skip
    slots = torch.randperm(2 * batch, generator=gen)[:batch].to(device)
    out = torch.empty(batch, shape.num_value_heads, shape.head_v, dtype=dtype, device=device)
    return lambda: attn_core.gated_delta_decode(
        x.q, x.k, x.v, x.g, x.beta, pool, slots, use_qk_l2norm_in_kernel=True, out=out,
        backend=backend,
    )  # fmt: skip


def decode_row(backend: str, batch: int, shape: LinearLayerShape, dtype: torch.dtype,
               device: torch.device, repeats: int) -> dict:  # fmt: skip
    step = decode_step(batch, shape, dtype, device, backend)
    row = {"backend": backend, "batch": batch, "eager_s": time_eager(step, device, repeats),
           "graph_s": None}  # fmt: skip
    if device.type != "cuda":
        row["graph_error"] = f"CUDA-graph replay needs a CUDA device, got {device.type}"
        return row
    # no capture on this platform is data, not a failed section: the row says why
    row["graph_s"], why = time_graph(step, device, repeats)
    if why is not None:
        row["graph_error"] = why
    return row


def decode_facts(batches: tuple, native: dict, shape: LinearLayerShape, dtype: torch.dtype,
                 device: torch.device, repeats: int, what: str) -> dict:  # fmt: skip
    backends = ("native", "torch") if native["backend"] == "native" else ("torch",)
    rows = [decode_row(b, n, shape, dtype, device, repeats) for b in backends for n in batches]
    method = (f"attn_core.gated_delta_decode, {what}, one token per sequence against a state "
              f"pool of 2 x batch slots, eager and CUDA-graph replay, {clock(device)}, median of "
              f"{repeats}; native rows only where the library serves")  # fmt: skip
    return {"linear_decode": measured(rows, "s", method)}


def linear_facts(
    prompt_len: int,
    batches: tuple,
    repeats: int,
    device: torch.device,
    shape: LinearLayerShape = HYBRID_LAYER,
    dtype: torch.dtype = torch.bfloat16,
) -> dict:
    """The section's facts (:data:`LINEAR_UNITS`) for a prompt of ``prompt_len`` tokens and
    decode batches ``batches``."""
    from attn_core.native.gated_delta import decode_supported, prefill_supported

    what = f"{shape.describe()}, {str(dtype)[6:].replace('bfloat', 'bf')}, l2norm in kernel"
    x = layer_inputs(1, prompt_len, shape, dtype, device, seed=0)
    step = x.token(0)
    pool = torch.empty(1, shape.num_value_heads, shape.head_k, shape.head_v, device=device)
    native = {
        "prefill": served(device, shape, dtype, prefill_supported(x.q[0], x.k[0], x.v[0], 1)),
        "decode": served(
            device, shape, dtype, decode_supported(step.q, step.k, step.v, pool, step.v)
        ),
    }
    method = ("attn_core.native.loader.native_ready (load + verify against the float64 "
              f"reference) for the prefill and decode entry points, {what}")  # fmt: skip
    facts = {"linear_backend": measured(native, "", method)}
    facts.update(prefill_facts(x, native["prefill"], repeats, what))
    del x
    facts.update(decode_facts(batches, native["decode"], shape, dtype, device, repeats, what))
    return facts
