"""Attention time to first token: a whole long prompt prefilled chunk by chunk, per layer.

For each profile, prompt and chunk size, the prompt's chunks are planned one after another
(chunk ``i`` has ``i * chunk`` tokens of context) by attn-core's own planners and priced by its
own cost function (:mod:`attn_core.prefill.cost`), the function the plan chooses with: the
torch path (``plan_prefill`` forced to ``torch``), each native MMA variant
(:func:`attn_core.prefill.plan_native.plan_native_prefill`), and what ``plan_prefill`` picks
when the fused backend the simulator can trace and every native variant are taken as verified.
Seconds per full-attention layer; the matrix and FMA rates behind them are the profile's, with
their provenance (bi-v100's fp16 matrix rate is a datasheet figure until the lab measures it).
"""

from __future__ import annotations

import dataclasses

import torch

from attn_core.core.settings import PrefillOverrides
from attn_core.core.shapes import AttentionShape
from attn_core.device.spec import DeviceSpec
from attn_core.prefill.cost import EFFICIENCY
from attn_core.prefill.plan import PrefillLengths, plan_prefill
from attn_core.prefill.plan_native import VARIANTS, plan_native_prefill
from attn_sim.workloads import sim_capabilities

K = 1024
PROMPTS = (32 * K, 128 * K, 256 * K)
CHUNKS = (2 * K, 8 * K)
PROFILES = ("bi-v100", "h200")
# The matrix variant each vendor's toolkit would build (NVIDIA wmma; CoreX's own wmma), and so
# the variants a profile is priced with: nvcc's wmma does not run on CoreX, nor CoreX's on NVIDIA.
MATRIX_VARIANT = {"bi-v100": "corex_wmma"}


def runnable_variants(spec: DeviceSpec) -> tuple[str, ...]:
    """The native prefill variants ``spec``'s vendor can build and run: its matrix variant and
    the portable fma."""
    matrix = MATRIX_VARIANT.get(spec.name.split("+")[0], "wmma")
    return tuple(v for v in VARIANTS if v in (matrix, "fma"))


def prompt_seconds(shape: AttentionShape, spec: DeviceSpec, prompt: int, chunk: int) -> dict:
    """Seconds of attention for one layer to prefill ``prompt`` tokens in ``chunk``-token
    chunks: ``torch``, ``native:<variant>`` for each variant the vendor runs
    (:func:`runnable_variants`) and ``plan`` (the plan's pick among those) with its backends."""
    caps = sim_capabilities(spec, shape.dtype)
    variants = runnable_variants(spec)
    verified = dataclasses.replace(caps, native_prefill=variants)
    totals = {"torch": 0.0, **{f"native:{v}": 0.0 for v in variants}, "plan": 0.0}
    picked: dict[str, int] = {}
    for start in range(0, prompt, chunk):
        q = min(chunk, prompt - start)
        lengths = PrefillLengths(q, start)
        torch_plan = plan_prefill(shape, lengths, spec, caps, PrefillOverrides(backend="torch"))
        totals["torch"] += torch_plan.cost.seconds  # type: ignore[union-attr]
        for v in variants:
            native = plan_native_prefill(
                shape, spec, v, num_seqs=1, num_tokens=q, max_query_len=q, max_context_len=start
            )
            totals[f"native:{v}"] += native.cost.seconds
        pick = plan_prefill(shape, lengths, spec, verified)
        totals["plan"] += pick.cost.seconds  # type: ignore[union-attr]
        name = pick.backend + (f":{pick.variant}" if pick.backend == "native" else "")  # type: ignore[union-attr]
        picked[name] = picked.get(name, 0) + 1
    return {**totals, "picked": picked}


def ttft_rows(shape: AttentionShape, specs: list[DeviceSpec]) -> list[dict]:
    """One row per (profile, prompt, chunk), seconds per full-attention layer."""
    shape = dataclasses.replace(shape, dtype=torch.float16)
    rows = []
    for spec in specs:
        matrix = MATRIX_VARIANT.get(spec.name.split("+")[0], "wmma")
        for prompt in PROMPTS:
            for chunk in CHUNKS:
                s = prompt_seconds(shape, spec, prompt, chunk)
                rows.append(
                    {
                        "profile": spec.name,
                        "prompt": f"{prompt // K}K",
                        "chunk": f"{chunk // K}K",
                        "torch_s": round(s["torch"], 3),
                        "native_matrix_s": round(s[f"native:{matrix}"], 3),
                        "matrix_variant": matrix,
                        "native_fma_s": round(s["native:fma"], 3),
                        "plan_s": round(s["plan"], 3),
                        "plan_picks": ", ".join(
                            f"{k} x{n}" for k, n in sorted(s["picked"].items())
                        ),
                    }
                )
    return rows


def rate_rows(specs: list[DeviceSpec]) -> list[dict]:
    """The rates behind the table, with provenance, and each backend's efficiency."""
    rows = [
        {"what": f"{spec.name} {field}", "value": f"{getattr(spec, field):.3g}",
         "provenance": spec.provenance.get(field, "")}
        for spec in specs for field in ("fp16_flops", "fp32_flops", "hbm_bandwidth")
    ]  # fmt: skip
    rows += [
        {"what": f"efficiency {name} ({e.rate})", "value": f"{e.compute:g} / {e.memory:g} HBM",
         "provenance": e.provenance}
        for name, e in EFFICIENCY.items()
    ]  # fmt: skip
    return rows
