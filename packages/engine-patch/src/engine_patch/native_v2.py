"""The platform's V2 kernel, used beyond V1's reach only after it matched the reference here.

Where a working V2 exists (upstream vLLM on NVIDIA; a vendor build that implements it), it is
one launch pair with no Python around it, so decode prefers it to attn-core's plan - but only
once, per (device, dtype, head size, block size), it has matched the float64 reference on a
small GQA case with a sequence spanning several 512-token partitions. The check runs on the
first call that could use V2; during CUDA-graph capture it is postponed (attn-core serves), so
capture never sees a host sync. The verdicts live in attn-core's verify-once registry (kind
``platform_v2``), beside attn-core's own kernels', and ``engine-patch status`` lists them all.
"""

from __future__ import annotations

from typing import Optional, Union

import torch

from attn_core.core import verify_once
from attn_core.reference import make_paged_case, reference_decode
from engine_patch.native import NativeOp
from engine_patch.ops import head_mapping
from engine_patch.signatures import VENDOR
from engine_patch.tolerances import DECODE_TOL, excess

# vLLM 0.6.3's _PARTITION_SIZE: its V2 launcher and the scratch shapes assume it.
PARTITION_SIZE = 512
KIND = "platform_v2"


def call(
    native: NativeOp,
    out: torch.Tensor,
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    kv_heads: Union[int, torch.Tensor],
    scale: float,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    max_seq_len: int,
    alibi_slopes: Optional[torch.Tensor],
    kv_cache_dtype: str,
    k_scale: float = 1.0,
    v_scale: float = 1.0,
) -> bool:
    """Run native V2 into ``out``; False when it cannot (the caller falls back to attn-core)."""
    num_seqs, num_heads, head_size = query.shape
    parts = -(-max_seq_len // PARTITION_SIZE)
    device = query.device
    tmp_out = torch.empty(num_seqs, num_heads, parts, head_size, dtype=out.dtype, device=device)
    exp_sums = torch.empty(num_seqs, num_heads, parts, dtype=torch.float32, device=device)
    max_logits = torch.empty_like(exp_sums)
    block_size = value_cache.shape[3]
    head = (out, exp_sums, max_logits, tmp_out, query, key_cache, value_cache)
    tail = (scale, block_tables, seq_lens, block_size, max_seq_len, alibi_slopes, kv_cache_dtype)
    if native.flavour == VENDOR:
        if k_scale != 1.0 or v_scale != 1.0:
            return False  # the fork's kernels take no fp8 scales
        if not isinstance(kv_heads, torch.Tensor):
            kv_heads = head_mapping(num_heads, key_cache.shape[1], device)
        args: tuple = head + (kv_heads,) + tail
    else:
        args = head + (key_cache.shape[1],) + tail + (k_scale, v_scale)
    try:
        native.fn(*args)  # type: ignore[misc]
    except NotImplementedError as exc:
        native.failure = f"raised NotImplementedError: {exc}"
        return False
    return True


def verified(
    native: NativeOp, device: torch.device, dtype: torch.dtype, head_size: int, block_size: int
) -> tuple[bool, str]:
    """Whether native V2 matched the reference here (checked once per key), and why not."""
    # the op's identity is in the key: a re-registered op is a new subject
    config = (native.name, id(native.fn), dtype, head_size, block_size)
    verdict = verify_once.verdict(KIND, device, config, native)
    return verdict.ok, verdict.detail


def _verdict(device: torch.device, config: tuple, native: NativeOp) -> verify_once.Verdict:
    _, _, dtype, head_size, block_size = config
    return verify_once.Verdict(*_check(native, device, dtype, head_size, block_size))


def _check(
    native: NativeOp, device: torch.device, dtype: torch.dtype, head_size: int, block_size: int
) -> tuple[bool, str]:
    lens = [1, 600, 1500]  # one token; two and three partitions
    case = make_paged_case(lens, 8, 2, head_size, block_size, dtype, device, seed=5)
    out = torch.full_like(case.query, float("nan"))
    scale = head_size**-0.5
    try:
        ran = call(
            native,
            out,
            case.query,
            case.key_cache,
            case.value_cache,
            2,
            scale,
            case.block_tables,
            case.seq_lens,
            max(lens),
            None,
            "auto",
        )
    except Exception as exc:  # a crash disqualifies it, it does not break decode
        return False, f"native V2 check raised {type(exc).__name__}: {exc}"
    if not ran:
        return False, f"native V2 {native.failure or 'cannot take this call'}"
    ref = reference_decode(
        case.query, case.key_cache, case.value_cache, case.block_tables, case.seq_lens, scale
    )
    atol, rtol = DECODE_TOL[dtype]
    err, over = excess(out, ref, rtol)
    if not bool(torch.isfinite(out).all()) or over > atol:
        return False, f"native V2 did not match the reference (max error {err:.2e})"
    return True, f"native V2 matched the reference (max error {err:.2e})"


verify_once.register(KIND, _verdict)
