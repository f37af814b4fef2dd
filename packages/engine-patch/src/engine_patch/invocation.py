"""``engine-patch status``'s inputs, validated before plugins load or kernels run.

The shape is layered: attn-core's Qwen3.6 default < ``ENGINE_PATCH_*`` < ``--model`` < the shape
flags; every value keeps its origin, so :class:`~attn_core.core.shapes.AttentionShape`'s complaint
(unsupported head size, block size, a GQA ratio that does not divide) names the argument or
variable it came from. Every problem is a :class:`ConfigurationError` (exit 2) naming the
argument or variable, the expected and the actual value.
"""

from __future__ import annotations

import argparse
import os
import re
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Optional

import torch

import attn_core.core.settings
from attn_core import detect_device_spec
from attn_core.core.settings import Overrides
from attn_core.core.shapes import QWEN36, AttentionShape, dtype_from_name
from attn_core.device.profile_file import parse_json_text
from engine_patch import settings
from engine_patch.exit_codes import ConfigurationError
from engine_patch.layer_plan import layer_plan

# AttentionShape field -> the flag that sets it (kv_cache_dtype: status plans the "auto" cache).
SHAPE_FLAGS = {
    "num_heads": "--heads",
    "num_kv_heads": "--kv-heads",
    "head_size": "--head-size",
    "block_size": "--block-size",
    "dtype": "--dtype",
}
Layer = dict[str, tuple[Any, str]]  # field -> (value, origin in words)


@dataclass(frozen=True)
class Invocation:
    """What ``status`` runs with; every field already checked."""

    shape: AttentionShape
    device: torch.device
    num_seqs: int
    contexts: tuple[int, ...]
    self_test: bool
    layer_plan: Optional[dict[str, Any]] = None  # engine_patch.layer_plan.layer_plan's


def from_args(args: argparse.Namespace) -> Invocation:
    """The checked inputs of one ``status`` run (``args`` from :func:`engine_patch.cli.parser`)."""
    overrides = check_environment()
    if args.tp is not None and not args.model:
        raise ConfigurationError(
            f"--tp applies only with --model (the shape flags give one rank's shape directly), "
            f"got --tp {args.tp} without --model"
        )
    device = resolve_device(args.device)
    check_device_profile(device, overrides)
    layers = [settings.shape_env()]
    plan = layer_plan()
    if args.model:
        layers.append(checkpoint_shape(args.model, args.tp or 1))
        plan = model_layer_plan(args.model)
    layers.append(_flag_layer(args))
    shape = resolve_shape(layers)
    return Invocation(
        shape, device, args.num_seqs, tuple(args.contexts), not args.no_self_test, plan
    )


def model_layer_plan(path: str) -> dict[str, Any]:
    """The linear / full layers of ``--model``'s ``config.json`` (read with the bounded reader
    after :func:`checkpoint_shape` has checked the file)."""
    config_file = Path(os.path.expanduser(path)) / "config.json"
    try:
        where = f"--model: {config_file}"
        config = parse_json_text(config_file.read_text(encoding="utf-8"), where)
        if not isinstance(config, dict):
            raise ValueError(f"{where} must hold a JSON object, got {type(config).__name__}")
        return layer_plan(config, str(config_file))
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigurationError(f"--model: {config_file} cannot be read: {exc}") from None
    except ValueError as exc:
        raise ConfigurationError(f"--model: {config_file}: {exc}") from None


def check_environment() -> Overrides:
    """Every ``ENGINE_PATCH_*`` and ``ATTN_CORE_*`` variable parsed (their errors name them);
    attn-core's settings snapshot is taken again here, as the command starts."""
    try:
        settings.check_environment()
        return attn_core.core.settings.reload()
    except ValueError as exc:
        raise ConfigurationError(str(exc)) from None


def resolve_device(requested: Optional[torch.device]) -> torch.device:
    """``--device`` (parsed as cpu / cuda[:N]) checked against this machine; default cuda if
    there is one, else cpu."""
    if requested is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if requested.type != "cuda":
        return requested
    if not torch.cuda.is_available():
        raise ConfigurationError(
            f"--device {requested} needs a CUDA device, but torch {torch.__version__} sees none "
            f"(torch.cuda.is_available() is False); use --device cpu"
        )
    count = torch.cuda.device_count()
    if requested.index is not None and requested.index >= count:
        raise ConfigurationError(
            f"--device must be cuda:0 .. cuda:{count - 1} on this machine, got {requested}"
        )
    return requested


def check_device_profile(device: torch.device, overrides: Overrides) -> None:
    """``ATTN_CORE_DEVICE`` must name a known profile or a readable profile file."""
    if overrides.device is None:
        return
    try:
        detect_device_spec(device, overrides.device)
    except (ValueError, OSError) as exc:
        raise ConfigurationError(f"ATTN_CORE_DEVICE={overrides.device!r}: {exc}") from None


def checkpoint_shape(path: str, tp: int) -> Layer:
    """One tensor-parallel rank's heads and head size from a checkpoint's ``config.json``."""
    path = os.path.expanduser(path)  # the shell leaves ~ as is after "=" (--model=~/ckpt)
    config_file = Path(path) / "config.json"
    if not config_file.is_file():  # checked here: transformers would try the Hub with a bare name
        raise ConfigurationError(
            f"--model must be a checkpoint directory containing config.json, got {path!r} "
            f"({config_file} is not a file)"
        )
    try:  # bounded first: transformers' json.load meets no depth or digit limit
        parse_json_text(config_file.read_text(encoding="utf-8"), f"--model: {config_file}")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigurationError(f"--model: {config_file} cannot be read: {exc}") from None
    except ValueError as exc:
        raise ConfigurationError(str(exc)) from None
    try:
        from transformers import AutoConfig
    except ImportError as exc:
        raise ConfigurationError(
            f"--model needs transformers to read {config_file}, but it is not importable "
            f"({exc}); install transformers, or give --heads / --kv-heads / --head-size"
        ) from None
    from engine_patch.qwen3_5_moe import register_qwen3_5_moe

    register_qwen3_5_moe()
    try:
        config = AutoConfig.from_pretrained(path, local_files_only=True)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ConfigurationError(f"--model {path}: transformers cannot read it: {exc}") from None
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    heads = _config_int(config_file, text, "num_attention_heads")
    kv = _config_int(config_file, text, "num_key_value_heads", heads)
    head = getattr(text, "head_dim", None) or _config_int(config_file, text, "hidden_size") // heads
    if heads % tp:
        raise ConfigurationError(
            f"--tp must divide num_attention_heads ({heads}) of --model {path}, got {tp}"
        )
    origin = f"--model {path} (config.json, --tp {tp})"
    return {
        "num_heads": (heads // tp, origin),
        "num_kv_heads": (max(1, kv // tp), origin),  # fewer KV heads than ranks: replicated
        "head_size": (head, origin),
    }


def _config_int(config_file: Path, config: Any, key: str, default: Optional[int] = None) -> int:
    value = getattr(config, key, default)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigurationError(
            f"--model: {config_file} must give {key} as an integer >= 1, got {value!r}"
        )
    return value


def _flag_layer(args: argparse.Namespace) -> Layer:
    layer: Layer = {}
    for field, flag in SHAPE_FLAGS.items():
        value = getattr(args, flag[2:].replace("-", "_"))
        if value is not None:
            layer[field] = (
                dtype_from_name(value) if field == "dtype" else value,
                f"{flag} {value}",
            )
    return layer


def resolve_shape(layers: list[Layer]) -> AttentionShape:
    """The shape from the layers (later ones win); an invalid one names the origins of the
    fields the complaint is about."""
    merged: Layer = {
        f.name: (getattr(QWEN36, f.name), f"{f.name} default {getattr(QWEN36, f.name)}")
        for f in fields(AttentionShape)
    }
    for layer in layers:
        merged.update(layer)
    for field in ("num_heads", "num_kv_heads"):  # before AttentionShape or any tensor sees them
        value, origin = merged[field]
        if value > settings.MAX_HEADS:
            raise ConfigurationError(
                f"{origin}: {field} must be <= {settings.MAX_HEADS} (heads per rank), got {value}"
            )
    try:
        return AttentionShape(**{name: value for name, (value, _) in merged.items()})
    except ValueError as exc:
        named = [o for f, (_, o) in merged.items() if re.search(rf"\b{f}\b", str(exc))]
        if not named:  # a complaint about no one field: name everything that was set
            named = [o for layer in layers for _, o in layer.values()]
        origins = ", ".join(dict.fromkeys(named)) or "the defaults"
        raise ConfigurationError(f"{origins}: {exc}") from None
