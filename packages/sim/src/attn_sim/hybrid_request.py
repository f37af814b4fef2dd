"""Attention time of one request on a hybrid model: full-attention and linear-attention layers.

The model's layers come from its config (``layer_types``, or a full-attention layer every
``full_attention_interval``; default the Qwen3.5-MoE class: 40 layers, 30 Gated DeltaNet + 10
full attention, 16/2 heads of 256 for full attention, 16 key / 32 value heads of 128 for the
linear layers). Per profile, prompt (32K / 128K / 256K, prefilled in 8192-token chunks) and path:

- ``fallback``: linear layers on transformers' torch fallback, full attention on attn-core's
  plan (its pick with the native kernels taken as verified): the situation the hybrid issue
  measured;
- ``torch``: both on attn-core's torch paths;
- ``native``: linear layers on attn-core's kernels, full attention on attn-core's plan.

Prefill: :func:`attn_sim.prefill_ttft.prompt_seconds` per full-attention layer and
:func:`attn_sim.linear_layer.prefill` per linear layer. One decode step at the prompt's length:
full attention as :mod:`attn_sim.native_design` replays attn-core's native decode (graph) or as
the traced torch path (eager); linear layers per :func:`attn_sim.linear_layer.decode`.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Optional

import torch

from attn_core.core.shapes import AttentionShape
from attn_core.device.spec import DeviceSpec
from attn_sim import linear_layer
from attn_sim.linear_layer import LinearShape
from attn_sim.native_design import native_designs, native_split_for, native_step_s
from attn_sim.prefill_ttft import prompt_seconds
from attn_sim.simulate import simulate
from attn_sim.workloads import Case

K = 1024
PROMPTS = (32 * K, 128 * K, 256 * K)
CHUNK = 8 * K
DEFAULT_CONFIG: dict[str, Any] = {
    "num_hidden_layers": 40,
    "full_attention_interval": 4,
    "num_attention_heads": 16,
    "num_key_value_heads": 2,
    "head_dim": 256,
    "linear_num_key_heads": 16,
    "linear_num_value_heads": 32,
    "linear_key_head_dim": 128,
    "linear_value_head_dim": 128,
    "linear_conv_kernel_dim": 4,
}


@dataclasses.dataclass(frozen=True)
class HybridModel:
    """``full_layers`` full-attention layers of ``attention``, ``linear_layers`` of ``linear``."""

    full_layers: int
    linear_layers: int
    attention: AttentionShape
    linear: LinearShape

    @classmethod
    def from_config(cls, config: Optional[dict[str, Any]] = None) -> HybridModel:
        """A transformers config dict (flat or with ``text_config``); None: the default."""
        cfg = dict(DEFAULT_CONFIG)
        cfg.update((config or {}).get("text_config", config or {}))
        kinds = cfg.get("layer_types")
        if kinds is None:
            n, every = int(cfg["num_hidden_layers"]), int(cfg["full_attention_interval"])
            kinds = [
                "full_attention" if (i + 1) % every == 0 else "linear_attention" for i in range(n)
            ]
        bad = sorted(set(kinds) - {"full_attention", "linear_attention"})
        if bad:
            raise ValueError(
                f"layer_types entries must be full_attention or linear_attention, got {bad}"
            )
        heads = int(cfg["num_attention_heads"])
        head = int(cfg.get("head_dim") or cfg["hidden_size"] // heads)
        attention = AttentionShape(heads, int(cfg["num_key_value_heads"]), head, 16, torch.float16)
        return cls(
            kinds.count("full_attention"),
            kinds.count("linear_attention"),
            attention,
            LinearShape.from_config(cfg),
        )


def _full_decode_s(spec: DeviceSpec, shape: AttentionShape, ctx: int, path: str) -> float:
    if path == "torch":
        return simulate(spec, Case("decode", 1, ctx, shape)).time_s
    return native_step_s(
        spec, native_designs(spec, shape, 1, ctx, native_split_for(spec, shape, 1, ctx))
    )


def request_rows(spec: DeviceSpec, model: HybridModel) -> list[dict]:
    """One row per (prompt, path): seconds of prefill and milliseconds of one decode step,
    all layers of each kind together, and the linear layers' share of the prefill."""
    rows = []
    for prompt in PROMPTS:
        full = prompt_seconds(model.attention, spec, prompt, CHUNK)
        for path in linear_layer.PATHS:
            full_key = "torch" if path == "torch" else "plan"
            full_s = full[full_key] * model.full_layers
            lin_s = (
                linear_layer.prefill(spec, model.linear, path, prompt, CHUNK) * model.linear_layers
            )
            full_ms = _full_decode_s(spec, model.attention, prompt, path) * model.full_layers * 1e3
            lin_ms = (
                linear_layer.decode(spec, model.linear, path).seconds * model.linear_layers * 1e3
            )
            rows.append(
                {
                    "profile": spec.name,
                    "prompt": f"{prompt // K}K",
                    "path": path,
                    "prefill_full_s": round(full_s, 3),
                    "prefill_linear_s": round(lin_s, 3),
                    "prefill_s": round(full_s + lin_s, 3),
                    "linear_share": round(lin_s / (full_s + lin_s), 3),
                    "decode_full_ms": round(full_ms, 3),
                    "decode_linear_ms": round(lin_ms, 3),
                    "layers": f"{model.full_layers} full + {model.linear_layers} linear",
                }
            )
    return rows


def provenance_rows() -> list[dict]:
    """Every constant of :mod:`attn_sim.linear_layer` with its provenance."""
    return [
        {"constant": name, "value": getattr(linear_layer, name), "provenance": why}
        for name, why in linear_layer.PROVENANCE.items()
    ]


def linear_layer_rows(spec: DeviceSpec, shape: LinearShape) -> list[dict]:
    """Per path, one linear layer's 128K prefill call of 8192 tokens: launches, bytes, FLOPs,
    the chunk pass and (native) occupancy."""
    rows = []
    for path, price in (
        ("fallback", linear_layer.fallback_prefill),
        ("torch", linear_layer.torch_prefill),
        ("native", linear_layer.native_prefill),
    ):
        c = price(spec, shape, CHUNK)
        rows.append(
            {
                "profile": spec.name,
                "path": path,
                "launches": round(c.launches),
                "GB": round(c.bytes / 1e9, 3),
                "GFLOP": round(c.flops / 1e9, 1),
                "chunks": c.chunks,
                "chunk_latency_us": round(c.chunk_latency_s * 1e6, 2),
                "waves": c.waves,
                "blocks_per_sm": c.blocks_per_sm,
                "ms_per_8K_call": round(c.seconds * 1e3, 2),
            }
        )
    return rows
