"""The native prefill kernel is used only after it matched the float64 reference here.

One check per (device, library file (it names the MMA variant), query dtype, cache dtype, head
size, block size, GQA group), kept by the verify-once registry (:mod:`attn_core.core.
verify_once`, kind ``native_prefill``) like every other optional kernel, so it never runs during
a CUDA-graph capture. The case: four sequences of mixed contexts and chunks (a single token,
block - 1, a chunk longer than one query tile), permuted blocks, NaN (fp8: the NaN byte) in
every cache slot past each context (vLLM has written the chunk's K/V there; the kernel must take
them from ``key`` / ``value``), outputs NaN-poisoned; run with the launcher's own split and with
three forced splits (the log-sum-exp merge), against
:func:`attn_core.reference.reference_prefix_prefill`.
"""

from __future__ import annotations

import math

import torch

from attn_core.core import verify_once
from attn_core.core.shapes import AttentionShape
from attn_core.core.verify_once import Verdict
from attn_core.native.prefill_launch import native_prefix_prefill
from attn_core.native.prefill_library import PrefillLibrary
from attn_core.reference import PrefillCase, make_prefill_case, reference_prefix_prefill

KIND = "native_prefill"
# Max |error| on outputs of magnitude < 1 (averages of N(0, 1) values): a few output ulps, the
# fused prefill check's bounds.
TOLERANCE = {torch.float16: 2e-2, torch.bfloat16: 5e-2}
FORCED_SPLITS = 3


def prefill_config(lib: PrefillLibrary, shape: AttentionShape) -> tuple:
    """The registry's ``config`` of one compiled variant for ``shape``."""
    return (
        lib.path.name, shape.dtype, shape.kv_cache_dtype, shape.head_size, shape.block_size,
        shape.group,
    )  # fmt: skip


def verify_native_prefill(
    lib: PrefillLibrary, device: torch.device, shape: AttentionShape
) -> Verdict:
    """The kept verdict for ``shape`` with ``lib`` on ``device``, checking it now if none."""
    return verify_once.verdict(KIND, device, prefill_config(lib, shape), lib)


def _check(device: torch.device, config: tuple, lib: PrefillLibrary) -> Verdict:
    _, dtype, kv_cache_dtype, head_size, block_size, group = config
    kv_heads = 2
    seqs = [(37, 21), (block_size - 1, 17), (80, 1), (1, 130)]
    fp8 = kv_cache_dtype != "auto"
    case = make_prefill_case(
        seqs, group * kv_heads, kv_heads, head_size, block_size, dtype, device,
        kv_cache_dtype=kv_cache_dtype, k_scale=0.5 if fp8 else 1.0, v_scale=0.5 if fp8 else 1.0,
    )  # fmt: skip
    kw = case.reference_kwargs()
    want = reference_prefix_prefill(**kw)
    poison_past_context(case)
    worst = 0.0
    for splits in (None, FORCED_SPLITS):
        got = _run(lib, case, splits)
        torch.cuda.synchronize(device)
        if not bool(torch.isfinite(got).all()):
            return Verdict(False, f"non-finite output with num_splits={splits or 'planned'}")
        worst = max(worst, float((got.double().cpu() - want).abs().max()))
    tol = TOLERANCE[dtype]
    return Verdict(worst <= tol, f"max abs error {worst:.1e} (tolerance {tol:.0e})")


verify_once.register(KIND, _check)


def poison_past_context(case: PrefillCase) -> None:
    """NaN (fp8: the NaN byte 0x7F) in every cache slot at or past each sequence's context."""
    bs = case.key_cache.shape[3]
    nan = 0x7F if case.kv_cache_dtype != "auto" else math.nan
    for s, (c, n) in enumerate(
        zip(case.context_lens.tolist(), case.seq_lens.tolist(), strict=True)
    ):
        for pos in range(c, -(-n // bs) * bs):
            block = int(case.block_tables[s, pos // bs])
            case.key_cache[block, :, :, pos % bs, :] = nan
            case.value_cache[block, :, :, pos % bs] = nan


def _run(lib: PrefillLibrary, case: PrefillCase, splits) -> torch.Tensor:
    out = torch.full_like(case.query, math.nan)
    native_prefix_prefill(
        lib, *case.args(), None, max_context_len=int(case.context_lens.max()),
        alibi_slopes=case.alibi_slopes, sliding_window=case.sliding_window,
        kv_cache_dtype=case.kv_cache_dtype, k_scale=case.k_scale, v_scale=case.v_scale,
        out=out, num_splits=splits,
    )  # fmt: skip
    return out
