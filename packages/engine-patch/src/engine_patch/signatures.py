"""The calling conventions engine-patch adapts, and which one an installed function has.

vLLM 0.6.3 upstream and the vendor's BI-V100 fork call the same kernels with different
arguments. The fork keeps the older convention: a ``head_mapping`` tensor (query head -> KV head)
instead of ``num_kv_heads``, ``context_lens`` / ``max_context_len`` instead of ``seq_lens`` /
``max_seq_len``, and no fp8 scales or block-sparse arguments. The convention is read off the
installed function's parameter names (``inspect.signature`` follows vLLM's ``hint_on_error``
wrapper to the real function); anything else is refused with :class:`UnknownSignatureError`,
because guessing an argument order would silently compute garbage.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable

UPSTREAM = "upstream"
VENDOR = "vendor"

_V1_TAIL_UPSTREAM = (
    "query",
    "key_cache",
    "value_cache",
    "num_kv_heads",
    "scale",
    "block_tables",
    "seq_lens",
    "block_size",
    "max_seq_len",
    "alibi_slopes",
    "kv_cache_dtype",
    "k_scale",
    "v_scale",
    "tp_rank",
    "blocksparse_local_blocks",
    "blocksparse_vert_stride",
    "blocksparse_block_size",
    "blocksparse_head_sliding_step",
)
# The fork's documented signature: paged_attention_v1(output, query, key_cache, value_cache,
# head_mapping, scale, block_tables, context_lens, block_size, max_context_len, alibi_slopes,
# kv_cache_dtype).
_V1_TAIL_VENDOR = (
    "query",
    "key_cache",
    "value_cache",
    "head_mapping",
    "scale",
    "block_tables",
    "context_lens",
    "block_size",
    "max_context_len",
    "alibi_slopes",
    "kv_cache_dtype",
)

KNOWN: dict[str, dict[str, tuple[str, ...]]] = {
    "paged_attention_v1": {
        UPSTREAM: ("out",) + _V1_TAIL_UPSTREAM,
        VENDOR: ("output",) + _V1_TAIL_VENDOR,
    },
    "paged_attention_v2": {
        UPSTREAM: ("out", "exp_sum", "max_logits", "tmp_out") + _V1_TAIL_UPSTREAM,
        # The fork's V2 follows its V1 after the same four outputs (vLLM 0.2-era names).
        VENDOR: ("out", "exp_sums", "max_logits", "tmp_out") + _V1_TAIL_VENDOR,
    },
    "reshape_and_cache": {
        UPSTREAM: (
            "key",
            "value",
            "key_cache",
            "value_cache",
            "slot_mapping",
            "kv_cache_dtype",
            "k_scale",
            "v_scale",
        ),
        VENDOR: ("key", "value", "key_cache", "value_cache", "slot_mapping", "kv_cache_dtype"),
    },
}


class UnknownSignatureError(ValueError):
    """An installed function's parameters match no convention engine-patch knows."""


def parameter_names(fn: Callable) -> tuple[str, ...]:
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError) as exc:
        raise UnknownSignatureError(
            f"cannot read the signature of {getattr(fn, '__qualname__', fn)!r}: {exc}"
        ) from None
    return tuple(sig.parameters)


def flavour_of(op_name: str, fn: Callable) -> str:
    """``"upstream"`` or ``"vendor"``: the convention ``fn`` (installed as ``op_name``) uses.

    Parameter names must match one convention exactly; for V2 the names of the four scratch
    outputs may differ (only their count matters), the rest must match.
    """
    names = parameter_names(fn)
    for flavour, want in KNOWN[op_name].items():
        if names == want:
            return flavour
        if op_name == "paged_attention_v2" and len(names) == len(want) and names[4:] == want[4:]:
            return flavour
    expected = " or ".join(f"({', '.join(w)})" for w in KNOWN[op_name].values())
    raise UnknownSignatureError(
        f"_custom_ops.{op_name} must have the vLLM 0.6.3 upstream or the vendor fork's "
        f"parameters, expected {expected}, got ({', '.join(names)})"
    )
