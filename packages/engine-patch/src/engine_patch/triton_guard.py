"""On Iluvatar, Triton attention never runs: its kernels hang the GPU for good.

A hung GPU cannot be caught with ``try/except`` and takes the shared lab machine down, so the
guard works before any launch:

- ``PagedAttention.forward_prefix`` is served by attn-core (installed by registration), and
  vLLM's Triton ``context_attention_fwd`` is replaced by a function that raises
  :class:`TritonRefusedError` - should anything still reach for it;
- the attention-backend selector refuses the Triton backends (ROCm's Triton flash attention,
  the block-sparse backend) with an explanation;
- settings that ask for Triton attention (``VLLM_ATTENTION_BACKEND=ROCM_FLASH``,
  ``VLLM_USE_TRITON_FLASH_ATTN=1``) are refused at registration and by ``status``.
"""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Callable, Mapping
from typing import Any, Optional

EXPLANATION = (
    "Triton kernels hang Iluvatar CoreX GPUs permanently (try/except cannot catch a hung GPU), "
    "so engine-patch refuses every Triton attention path on this platform; use the default "
    "backend, whose prefix path engine-patch routes to attn-core"
)
TRITON_BACKENDS = ("ROCM_FLASH",)


class TritonRefusedError(RuntimeError):
    """A Triton attention path was asked for on Iluvatar."""


def refused_settings(environ: Optional[Mapping[str, str]] = None) -> list[str]:
    """The settings in ``environ`` that ask for Triton attention (for Iluvatar)."""
    env = os.environ if environ is None else environ
    refused = []
    backend = env.get("VLLM_ATTENTION_BACKEND")
    if backend in TRITON_BACKENDS:
        refused.append(f"VLLM_ATTENTION_BACKEND={backend} (Triton flash attention)")
    triton_fa = env.get("VLLM_USE_TRITON_FLASH_ATTN")
    if triton_fa is not None and triton_fa.strip().lower() in ("1", "true"):
        refused.append(f"VLLM_USE_TRITON_FLASH_ATTN={triton_fa}")
    return refused


def _refuse(what: str) -> TritonRefusedError:
    return TritonRefusedError(f"{what} was asked for on Iluvatar: {EXPLANATION}")


def refusing_context_attention_fwd(*args: Any, **kwargs: Any) -> None:
    raise _refuse("vLLM's Triton prefix-prefill kernel (context_attention_fwd)")


def guard_which_attn_to_use(original: Callable) -> Callable:
    @functools.wraps(original)
    def which_attn_to_use(*args: Any, **kwargs: Any) -> Any:
        backend = original(*args, **kwargs)
        if getattr(backend, "name", None) in TRITON_BACKENDS:
            raise _refuse(f"attention backend {backend.name}")
        return backend

    return which_attn_to_use


def guard_get_attn_backend(original: Callable) -> Callable:
    @functools.wraps(original)
    def get_attn_backend(*args: Any, **kwargs: Any) -> Any:
        blocksparse = kwargs.get("is_blocksparse", args[6] if len(args) > 6 else False)
        if blocksparse:
            raise _refuse("the block-sparse attention backend (Triton kernels)")
        return original(*args, **kwargs)

    if hasattr(original, "cache_clear"):
        get_attn_backend.cache_clear = original.cache_clear  # type: ignore[attr-defined]
    return get_attn_backend


def modules_holding(value: object, prefix: str = "vllm") -> list[Any]:
    """Loaded ``prefix.*`` modules that imported ``value`` by name (``from x import f``)."""
    found = []
    for name, module in list(sys.modules.items()):
        if module is None or not (name == prefix or name.startswith(prefix + ".")):
            continue
        for attr, held in list(vars(module).items()):
            if held is value:
                found.append((module, attr))
    return found
