"""engine-patch's environment knobs, read in one place.

- ``ENGINE_PATCH_FORCE=1``: replace the ``_custom_ops`` attention ops and route all decode to
  attn-core even where the platform's native op exists and works.
- ``ENGINE_PATCH_V1_MAX_SEQ_LEN=<tokens>``: longest ``max_seq_len`` decode keeps on the
  platform's compiled V1 kernel (default: derived from its shared-memory need, see
  :mod:`engine_patch.native`); ``0`` sends every decode to attn-core.
- ``ENGINE_PATCH_PLATFORM=iluvatar|generic``: override platform detection
  (:mod:`engine_patch.platform`).
- ``ENGINE_PATCH_HEADS`` / ``ENGINE_PATCH_KV_HEADS`` / ``ENGINE_PATCH_HEAD_SIZE`` /
  ``ENGINE_PATCH_DTYPE`` / ``ENGINE_PATCH_BLOCK_SIZE``: the model shape ``status`` plans for
  (default Qwen3.6 on the platform: 24 / 4 / 256, float16, block 16).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Optional

import torch

FORCE_ENV = "ENGINE_PATCH_FORCE"
V1_LIMIT_ENV = "ENGINE_PATCH_V1_MAX_SEQ_LEN"
DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}


def _truthy(raw: Optional[str]) -> bool:
    return raw is not None and raw.strip().lower() in ("1", "true", "yes", "on")


def force_enabled() -> bool:
    """``ENGINE_PATCH_FORCE=1``: attn-core replaces native ops that exist and work."""
    return _truthy(os.environ.get(FORCE_ENV))


def _env_int(name: str, default: Optional[int], minimum: int) -> Optional[int]:
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {raw!r}") from None
    if value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {raw!r}")
    return value


def v1_limit_override() -> Optional[int]:
    """``ENGINE_PATCH_V1_MAX_SEQ_LEN`` if set (0 disables native V1), else None."""
    return _env_int(V1_LIMIT_ENV, None, 0)


@dataclass(frozen=True)
class ModelShape:
    """The attention shape ``status`` plans for (one rank's slice under tensor parallelism)."""

    num_heads: int = 24
    num_kv_heads: int = 4
    head_size: int = 256
    dtype: str = "float16"
    block_size: int = 16

    def __post_init__(self) -> None:
        for name in ("num_heads", "num_kv_heads", "head_size", "block_size"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"num_heads must be a multiple of num_kv_heads ({self.num_kv_heads}), "
                f"got {self.num_heads}"
            )
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {sorted(DTYPES)}, got {self.dtype!r}")

    @property
    def torch_dtype(self) -> torch.dtype:
        return DTYPES[self.dtype]

    @classmethod
    def from_env(cls) -> ModelShape:
        base = cls()
        return cls(
            num_heads=_env_int("ENGINE_PATCH_HEADS", base.num_heads, 1),
            num_kv_heads=_env_int("ENGINE_PATCH_KV_HEADS", base.num_kv_heads, 1),
            head_size=_env_int("ENGINE_PATCH_HEAD_SIZE", base.head_size, 1),
            dtype=os.environ.get("ENGINE_PATCH_DTYPE") or base.dtype,
            block_size=_env_int("ENGINE_PATCH_BLOCK_SIZE", base.block_size, 1),
        )
