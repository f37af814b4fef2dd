"""The ``qwen3_5_moe`` config type (Qwen3.5 / Qwen3.6 hybrid MoE) for transformers < 5.

Only the configuration: enough for ``AutoConfig.from_pretrained(dir)`` (and so vLLM's
``ModelConfig``) to read a checkpoint's ``config.json``. It does not implement the model; whether
vLLM has a class for the architecture is reported by ``engine-patch status``.

The checkpoints nest the language model under ``text_config`` (model type
``qwen3_5_moe_text``) beside a ``vision_config``; earlier text-only notes used a flat file. Both
are read. Every layer is either ``linear_attention`` (GatedDeltaNet) or ``full_attention``;
with no ``layer_types`` the pattern is a full-attention layer every ``full_attention_interval``
(4) layers, the rest linear.
"""

from __future__ import annotations

from typing import Any, Optional

MODEL_TYPE = "qwen3_5_moe"
TEXT_MODEL_TYPE = "qwen3_5_moe_text"
LAYER_KINDS = ("linear_attention", "full_attention")
# The architectures Qwen3.5/3.6 MoE checkpoints name; status checks vLLM's registry for them.
ARCHITECTURES = ("Qwen3_5MoeForConditionalGeneration", "Qwen3_5MoeForCausalLM")

try:
    from transformers import PretrainedConfig
except ImportError:  # transformers is optional: vLLM brings it, attn-core does not need it
    PretrainedConfig = None  # type: ignore[assignment,misc]

# Text fields and their defaults (Qwen3.5-35B-A3B's published config).
TEXT_DEFAULTS = {
    "vocab_size": 248320,
    "hidden_size": 2048,
    "num_hidden_layers": 40,
    "num_attention_heads": 16,
    "num_key_value_heads": 2,
    "head_dim": 256,
    "hidden_act": "silu",
    "max_position_embeddings": 262144,
    "rms_norm_eps": 1e-6,
    "rope_theta": 10000000.0,
    "partial_rotary_factor": 0.25,
    "attention_bias": False,
    "full_attention_interval": 4,
    "layer_types": None,
    "linear_conv_kernel_dim": 4,
    "linear_key_head_dim": 128,
    "linear_value_head_dim": 128,
    "linear_num_key_heads": 16,
    "linear_num_value_heads": 32,
    "num_experts": 256,
    "num_experts_per_tok": 8,
    "moe_intermediate_size": 512,
    "shared_expert_intermediate_size": 512,
    "norm_topk_prob": True,
}


# The largest published models have a few hundred layers; the bound is checked before the list
# of layer kinds is built (10**10 layers was a MemoryError).
MAX_LAYERS = 4096


def _bounded(name: str, value: Any, high: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= high:
        raise ValueError(f"{name} must be an integer in [1, {high}], got {value!r}")


def layer_pattern(num_layers: Any, interval: Any, layer_types: Optional[Any]) -> list[str]:
    """``layer_types`` as a list, or the default pattern (:func:`default_layer_types`); the
    sizes are checked first: ``num_hidden_layers`` in [1, :data:`MAX_LAYERS`] and, when the
    pattern is derived, ``full_attention_interval`` in [1, ``num_hidden_layers``]."""
    _bounded("num_hidden_layers", num_layers, MAX_LAYERS)
    if layer_types is not None:
        return list(layer_types)
    _bounded("full_attention_interval", interval, num_layers)
    return default_layer_types(num_layers, interval)


def default_layer_types(num_layers: int, interval: int) -> list[str]:
    """Layer ``i`` is full attention when ``(i + 1) % interval == 0``."""
    return [
        "full_attention" if (i + 1) % interval == 0 else "linear_attention"
        for i in range(num_layers)
    ]


def _check_text_fields(cfg: Any) -> None:
    for name in ("num_attention_heads", "num_key_value_heads", "head_dim", "num_hidden_layers"):
        value = getattr(cfg, name)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive int, got {value!r}")
    if cfg.num_attention_heads % cfg.num_key_value_heads:
        raise ValueError(
            f"num_attention_heads must be a multiple of num_key_value_heads "
            f"({cfg.num_key_value_heads}), got {cfg.num_attention_heads}"
        )
    if len(cfg.layer_types) != cfg.num_hidden_layers:
        raise ValueError(
            f"layer_types must have num_hidden_layers ({cfg.num_hidden_layers}) entries, "
            f"got {len(cfg.layer_types)}"
        )
    bad = sorted(set(cfg.layer_types) - set(LAYER_KINDS))
    if bad:
        raise ValueError(f"layer_types entries must be one of {LAYER_KINDS}, got {bad}")


if PretrainedConfig is not None:

    class Qwen3_5MoeTextConfig(PretrainedConfig):
        """The language model's fields: attention shape, layer pattern, experts, linear attn."""

        model_type = TEXT_MODEL_TYPE
        # set from TEXT_DEFAULTS below; declared for the type checker
        num_hidden_layers: int
        full_attention_interval: int
        layer_types: list

        def __init__(self, **kwargs: Any) -> None:
            for name, default in TEXT_DEFAULTS.items():
                setattr(self, name, kwargs.pop(name, default))
            self.layer_types = layer_pattern(
                self.num_hidden_layers, self.full_attention_interval, self.layer_types
            )
            _check_text_fields(self)
            super().__init__(**kwargs)

        @property
        def full_attention_layers(self) -> list[int]:
            """Indices of the paged-attention layers (the ones attn-core serves)."""
            return [i for i, kind in enumerate(self.layer_types) if kind == "full_attention"]

    class Qwen3_5MoeConfig(PretrainedConfig):
        """Top level: ``text_config`` (nested or flat in the file) and the untouched
        ``vision_config``."""

        model_type = MODEL_TYPE
        sub_configs = {"text_config": Qwen3_5MoeTextConfig}

        def __init__(
            self,
            text_config: Optional[Any] = None,
            vision_config: Optional[dict] = None,
            **kwargs: Any,
        ) -> None:
            if text_config is None:  # a flat file: the text fields sit at the top level
                text_config = {k: kwargs.pop(k) for k in list(kwargs) if k in TEXT_DEFAULTS}
            if isinstance(text_config, dict):
                text_config = Qwen3_5MoeTextConfig(**text_config)
            self.text_config = text_config
            self.vision_config = vision_config
            super().__init__(**kwargs)

        def get_text_config(self, decoder: bool = False) -> Any:
            return self.text_config


def register_qwen3_5_moe() -> str:
    """Register the config types with ``AutoConfig`` where transformers lacks them.

    Returns what happened, in words (``status`` prints it).
    """
    if PretrainedConfig is None:
        return "skipped: transformers is not installed"
    from transformers import AutoConfig
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    if MODEL_TYPE in CONFIG_MAPPING:
        owner = CONFIG_MAPPING[MODEL_TYPE]
        if owner is Qwen3_5MoeConfig:
            return "registered by engine-patch"
        return f"transformers has it ({owner.__module__}.{owner.__name__})"
    if TEXT_MODEL_TYPE not in CONFIG_MAPPING:
        AutoConfig.register(TEXT_MODEL_TYPE, Qwen3_5MoeTextConfig)
    AutoConfig.register(MODEL_TYPE, Qwen3_5MoeConfig)
    return "registered by engine-patch"


def vllm_architecture_support(architectures: Optional[list[str]] = None) -> str:
    """Whether vLLM's model registry has a class for the Qwen3.5 MoE architectures."""
    archs = list(architectures or ARCHITECTURES)
    try:
        from vllm.model_executor.models import ModelRegistry
    except ImportError as exc:
        return f"unknown: vLLM's model registry is not importable ({exc})"
    supported = set(ModelRegistry.get_supported_archs())
    have = [a for a in archs if a in supported]
    if have:
        return f"vLLM has {', '.join(have)}"
    return (
        f"vLLM's model registry has no class for {' / '.join(archs)}: engine-patch registers "
        "only the config, it does not implement the model"
    )
