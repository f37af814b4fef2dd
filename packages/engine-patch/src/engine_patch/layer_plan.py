"""Which layers of the hybrid model are linear attention and which full, from its config.

The config is the checkpoint's ``config.json`` as attn-core's bounded JSON reader returns it
(``text_config`` nested, or flat), or :data:`engine_patch.qwen3_5_moe.TEXT_DEFAULTS`. The
pattern is ``layer_types`` when given, else a full-attention layer every
``full_attention_interval`` (a config with neither is not hybrid: every layer full); sizes
are bounded before a list is built
(:func:`engine_patch.qwen3_5_moe.layer_pattern`).
"""

from __future__ import annotations

from typing import Any, Optional

from engine_patch.qwen3_5_moe import LAYER_KINDS, MAX_LAYERS, TEXT_DEFAULTS, layer_pattern


def layer_plan(config: Optional[dict[str, Any]] = None, source: str = "") -> dict[str, Any]:
    """``{"source", "num_layers", "linear", "full"}`` (layer indices); a bad config raises a
    ``ValueError`` naming the field, the expected and the actual value."""
    if config is None:
        config, source = {}, source or "defaults (Qwen3.5 MoE)"
    text = config.get("text_config", config)
    if not isinstance(text, dict):
        raise ValueError(f"text_config must be an object, got {type(text).__name__}")
    fields = {
        k: text.get(k, TEXT_DEFAULTS[k])
        for k in ("num_hidden_layers", "full_attention_interval", "layer_types")
    }
    if config and "layer_types" not in text and "full_attention_interval" not in text:
        fields["full_attention_interval"] = 1  # no hybrid pattern given: every layer is full
    kinds = fields["layer_types"]
    if kinds is not None:
        if not isinstance(kinds, list) or len(kinds) > MAX_LAYERS:
            raise ValueError(
                f"layer_types must be a list of at most {MAX_LAYERS} entries, got "
                f"{type(kinds).__name__} of {len(kinds) if isinstance(kinds, list) else '?'}"
            )
        bad = sorted({str(k) for k in kinds if k not in LAYER_KINDS})
        if bad:
            raise ValueError(f"layer_types entries must be one of {LAYER_KINDS}, got {bad}")
        if "num_hidden_layers" not in text:
            fields["num_hidden_layers"] = len(kinds)
    pattern = layer_pattern(fields["num_hidden_layers"], fields["full_attention_interval"], kinds)
    if len(pattern) != fields["num_hidden_layers"]:
        raise ValueError(
            f"layer_types must have num_hidden_layers ({fields['num_hidden_layers']}) "
            f"entries, got {len(pattern)}"
        )
    return {
        "source": source or "config",
        "num_layers": len(pattern),
        "linear": [i for i, k in enumerate(pattern) if k == "linear_attention"],
        "full": [i for i, k in enumerate(pattern) if k == "full_attention"],
    }


def ranges(indices: list[int]) -> str:
    """``[0, 1, 2, 4]`` -> ``"0-2,4"`` (status's table), ``"-"`` when empty."""
    spans: list[list[int]] = []
    for i in indices:
        if spans and spans[-1][1] == i - 1:
            spans[-1][1] = i
        else:
            spans.append([i, i])
    return ",".join(f"{a}-{b}" if a != b else str(a) for a, b in spans) or "-"
