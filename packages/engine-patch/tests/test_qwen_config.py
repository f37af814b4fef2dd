"""``qwen3_5_moe`` config registration with transformers' AutoConfig."""

import json

import pytest
from ep_helpers import DATA, require


@pytest.fixture
def autoconfig():
    require("transformers", "the config registration is tested with transformers < 5")
    from transformers import AutoConfig

    from engine_patch.qwen3_5_moe import register_qwen3_5_moe

    first = register_qwen3_5_moe()
    assert first == "registered by engine-patch" or first.startswith("transformers has it")
    assert register_qwen3_5_moe() == first  # idempotent
    if first.startswith("transformers has it"):
        pytest.skip(f"this transformers already knows qwen3_5_moe: {first}")
    return AutoConfig


def test_nested_checkpoint_config(autoconfig):
    config = autoconfig.from_pretrained(str(DATA / "qwen3_5_moe"))
    assert config.model_type == "qwen3_5_moe"
    text = config.get_text_config()
    assert (text.num_attention_heads, text.num_key_value_heads, text.head_dim) == (16, 2, 256)
    assert (text.num_experts, text.num_experts_per_tok) == (256, 8)
    assert (text.linear_num_key_heads, text.linear_num_value_heads) == (16, 32)
    assert (text.linear_key_head_dim, text.linear_value_head_dim) == (128, 128)
    # No layer_types in the file: a full-attention layer every 4th (indices 3, 7, ..., 39).
    assert text.full_attention_layers == list(range(3, 40, 4))
    assert config.vision_config["depth"] == 27
    assert config.architectures == ["Qwen3_5MoeForConditionalGeneration"]


def test_flat_config_with_layer_types(autoconfig):
    config = autoconfig.from_pretrained(str(DATA / "qwen3_6_flat"))
    text = config.get_text_config()
    assert (text.num_attention_heads, text.num_key_value_heads, text.head_dim) == (24, 4, 256)
    assert text.layer_types[3] == "full_attention" and text.full_attention_layers == [3, 7]
    assert text.num_experts == 64


def test_round_trip_through_save_pretrained(autoconfig, tmp_path):
    config = autoconfig.from_pretrained(str(DATA / "qwen3_5_moe"))
    config.save_pretrained(tmp_path)
    again = autoconfig.from_pretrained(str(tmp_path))
    assert again.get_text_config().layer_types == config.get_text_config().layer_types


@pytest.mark.parametrize(
    "change, message",
    [
        ({"layer_types": ["full_attention"] * 3}, "layer_types must have num_hidden_layers"),
        ({"layer_types": ["mamba"] * 8}, "layer_types entries must be one of"),
        ({"num_attention_heads": 10}, "num_attention_heads must be a multiple"),
    ],
)
def test_bad_fields_are_named(autoconfig, tmp_path, change, message):
    cfg = json.loads((DATA / "qwen3_6_flat" / "config.json").read_text())
    cfg.update(change)
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match=message):
        autoconfig.from_pretrained(str(tmp_path))
