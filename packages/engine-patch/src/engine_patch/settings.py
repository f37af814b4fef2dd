"""engine-patch's environment variables, read here and nowhere else in engine-patch.

- ``ENGINE_PATCH_FORCE``: a boolean (:func:`attn_core.core.settings.parse_bool`: 1/true/yes/on,
  0/false/no/off, empty = off); on replaces the ``_custom_ops`` attention ops and routes all
  decode to attn-core even where the platform's native op exists and works.
- ``ENGINE_PATCH_V1_MAX_SEQ_LEN=<tokens>``: longest ``max_seq_len`` decode keeps on the
  platform's compiled V1 kernel (default: derived from its shared-memory need, see
  :mod:`engine_patch.native`); ``0`` sends every decode to attn-core.
- ``ENGINE_PATCH_PLATFORM=iluvatar|generic``: override platform detection
  (:mod:`engine_patch.platform`).
- ``ENGINE_PATCH_LINEAR_OPS=module:attr=convention,...``: linear-attention functions attn-core
  serves besides :data:`engine_patch.linear_ops.TARGETS`.
- ``ENGINE_PATCH_LINEAR_STATE_LAYOUT=kv|vk``: the serving stack keeps recurrent states
  ``[.., K, V]`` or ``[.., V, K]`` (default: read from the stack, :mod:`engine_patch.state_layout`).
- ``ENGINE_PATCH_HEADS`` / ``ENGINE_PATCH_KV_HEADS`` / ``ENGINE_PATCH_HEAD_SIZE`` /
  ``ENGINE_PATCH_DTYPE`` / ``ENGINE_PATCH_BLOCK_SIZE``: the model shape ``status`` plans for
  (default :data:`attn_core.core.shapes.QWEN36`: 24 / 4 / 256, float16, block 16).

Every reader takes an optional ``environ`` (default ``os.environ``) and raises a ``ValueError``
naming the variable, the expected and the actual value. vLLM's own variables are read where
vLLM's meaning is mirrored (:mod:`engine_patch.triton_guard`).
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from typing import Any, Optional

from attn_core.core.settings import ENV_VARS as ATTN_CORE_ENV_VARS
from attn_core.core.settings import parse_bool, parse_choice, parse_int
from attn_core.core.shapes import DTYPE_NAMES

FORCE_ENV = "ENGINE_PATCH_FORCE"
V1_LIMIT_ENV = "ENGINE_PATCH_V1_MAX_SEQ_LEN"
PLATFORM_ENV = "ENGINE_PATCH_PLATFORM"
PLATFORMS = ("iluvatar", "generic")
LINEAR_OPS_ENV = "ENGINE_PATCH_LINEAR_OPS"
STATE_LAYOUT_ENV = "ENGINE_PATCH_LINEAR_STATE_LAYOUT"
STATE_LAYOUTS = ("kv", "vk")
# Bounds a typo'd or hostile value: a handful of serving stacks, a few ops each.
LINEAR_OPS_MAX = 64
_DOTTED = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# V1 keeps every score of a sequence in shared memory as fp32 (4 bytes a token): 65536 tokens
# are 256 KiB, more than any GPU's shared memory per block (H100 / H200: 227 KiB), so a larger
# limit cannot describe V1; it would only grow status's self-test (524288: a 5.5 GB case).
V1_LIMIT_MAX = 65536
# Heads per rank: the largest published models have 128 query heads; 1024 leaves room and keeps
# status's self-test small (1048576 heads asked for a 14.7 GB cache).
MAX_HEADS = 1024
# attn_core.core.shapes.AttentionShape field -> the variable that sets it for `status`.
SHAPE_ENV = {
    "num_heads": "ENGINE_PATCH_HEADS",
    "num_kv_heads": "ENGINE_PATCH_KV_HEADS",
    "head_size": "ENGINE_PATCH_HEAD_SIZE",
    "block_size": "ENGINE_PATCH_BLOCK_SIZE",
    "dtype": "ENGINE_PATCH_DTYPE",
}


def _env(environ: Optional[Mapping[str, str]]) -> Mapping[str, str]:
    return os.environ if environ is None else environ


def force_enabled(environ: Optional[Mapping[str, str]] = None) -> bool:
    """``ENGINE_PATCH_FORCE`` on: attn-core replaces native ops that exist and work."""
    return bool(parse_bool(FORCE_ENV, _env(environ).get(FORCE_ENV), default=False))


def v1_limit_override(environ: Optional[Mapping[str, str]] = None) -> Optional[int]:
    """``ENGINE_PATCH_V1_MAX_SEQ_LEN`` if set (0 disables native V1), else None."""
    return parse_int(V1_LIMIT_ENV, _env(environ).get(V1_LIMIT_ENV), minimum=0, maximum=V1_LIMIT_MAX)


def platform_override(environ: Optional[Mapping[str, str]] = None) -> Optional[str]:
    """``ENGINE_PATCH_PLATFORM`` (``iluvatar`` or ``generic``) if set, else None."""
    return parse_choice(PLATFORM_ENV, _env(environ).get(PLATFORM_ENV), PLATFORMS)


def shape_env(environ: Optional[Mapping[str, str]] = None) -> dict[str, tuple[Any, str]]:
    """The shape fields the environment sets: ``field -> (value, "VARIABLE=raw")``.

    Each value is parsed on its own (a positive int, or a dtype name -> ``torch.dtype``); whether
    they form a supported shape is :class:`attn_core.core.shapes.AttentionShape`'s check.
    """
    env = _env(environ)
    fields: dict[str, tuple[Any, str]] = {}
    for field, name in SHAPE_ENV.items():
        raw = env.get(name)
        if field == "dtype":
            value = parse_choice(name, raw, tuple(DTYPE_NAMES))
            value = None if value is None else DTYPE_NAMES[value]
        else:
            top = MAX_HEADS if field in ("num_heads", "num_kv_heads") else None
            value = parse_int(name, raw, minimum=1, maximum=top)
        if value is not None:
            fields[field] = (value, f"{name}={raw}")
    return fields


def check_environment(environ: Optional[Mapping[str, str]] = None) -> None:
    """Parse every ``ENGINE_PATCH_*`` variable; the first bad one raises its ``ValueError``."""
    force_enabled(environ)
    v1_limit_override(environ)
    platform_override(environ)
    shape_env(environ)
    linear_ops_extra(environ)
    linear_state_layout(environ)


def linear_state_layout(environ: Optional[Mapping[str, str]] = None) -> Optional[str]:
    """``ENGINE_PATCH_LINEAR_STATE_LAYOUT`` (``kv`` or ``vk``) if set, else None (detected)."""
    return parse_choice(STATE_LAYOUT_ENV, _env(environ).get(STATE_LAYOUT_ENV), STATE_LAYOUTS)


def linear_ops_extra(environ: Optional[Mapping[str, str]] = None) -> list[tuple[str, str, str]]:
    """``ENGINE_PATCH_LINEAR_OPS="module:attr=convention,..."`` as ``(module, attr, convention)``
    (conventions: :data:`engine_patch.linear_adapters.CONVENTIONS`); empty or unset: none."""
    from engine_patch.linear_adapters import CONVENTIONS

    raw = _env(environ).get(LINEAR_OPS_ENV, "")
    items = [item.strip() for item in raw.split(",") if item.strip()]
    if len(items) > LINEAR_OPS_MAX:
        raise ValueError(
            f"{LINEAR_OPS_ENV} must list at most {LINEAR_OPS_MAX} ops, got {len(items)}"
        )
    found = []
    for item in items:
        where, _, convention = item.partition("=")
        module, _, attr = where.partition(":")
        module, attr, convention = module.strip(), attr.strip(), convention.strip()
        if not (_DOTTED.fullmatch(module) and _NAME.fullmatch(attr)):
            raise ValueError(
                f"{LINEAR_OPS_ENV}={raw}: each entry must be module:attribute=convention "
                f"(a dotted module, an identifier), got {item!r}"
            )
        if convention not in CONVENTIONS:
            raise ValueError(
                f"{LINEAR_OPS_ENV}={raw}: the convention of {module}:{attr} must be one of "
                f"{sorted(CONVENTIONS)}, got {convention!r}"
            )
        found.append((module, attr, convention))
    return found


def attn_core_overrides_set(environ: Optional[Mapping[str, str]] = None) -> list[str]:
    """``NAME=value`` of each attn-core decode / prefill plan override set, to name them when
    attn-core's planner refuses one (its message gives the value, not the variable)."""
    env = _env(environ)
    names = [v.name for v in ATTN_CORE_ENV_VARS if v.section in ("decode", "prefill")]
    return [f"{name}={env[name]}" for name in names if env.get(name, "").strip()]
