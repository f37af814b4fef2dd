"""The native kernel is used only after it matched the float64 reference on this device.

One check per (device, library, query dtype, cache dtype, head size, block size, GQA group),
kept by the verify-once registry (:mod:`attn_core.core.verify_once`, kind ``native_decode``) like
every other optional kernel: a small random case in vLLM's layout (permuted blocks, lengths 1,
block - 1, block + 1 and two longer ones, NaN in the cache slots past each sequence's end)
through one partition and through several plus the merge, against
:func:`attn_core.reference.reference_decode`. The registry never runs it during a CUDA-graph
capture (it synchronises); the resolver then plans the torch path for that call.
"""

from __future__ import annotations

import math

import torch

from attn_core.core import verify_once
from attn_core.core.verify_once import Verdict
from attn_core.native.launch import launch_decode
from attn_core.native.library import NativeLibrary
from attn_core.native.split import partials_shapes
from attn_core.reference import make_paged_case, poison_tails, reference_decode

KIND = "native_decode"
# Max |error| on outputs of magnitude ~1 (averages of N(0, 1) values): a few output ulps.
TOLERANCE = {torch.float16: 5e-3, torch.bfloat16: 3e-2, torch.float32: 1e-4}


def native_config(
    lib: NativeLibrary,
    dtype: torch.dtype,
    kv_cache_dtype: str,
    head_size: int,
    block_size: int,
    group: int,
) -> tuple:
    """The registry's ``config`` of one compiled variant (the library file names the build)."""
    return (lib.path.name, dtype, kv_cache_dtype, head_size, block_size, group)


def verify_native(
    lib: NativeLibrary,
    device: torch.device,
    dtype: torch.dtype,
    kv_cache_dtype: str,
    head_size: int,
    block_size: int,
    group: int,
) -> Verdict:
    """The kept verdict for this configuration, checking it now if there is none."""
    config = native_config(lib, dtype, kv_cache_dtype, head_size, block_size, group)
    return verify_once.verdict(KIND, device, config, lib)


def _check(device: torch.device, config: tuple, lib: NativeLibrary) -> Verdict:
    _, dtype, kv_cache_dtype, head_size, block_size, group = config
    kv_heads = 2
    lens = [1, block_size - 1, block_size + 1, 300, 777]
    case = make_paged_case(
        lens, group * kv_heads, kv_heads, head_size, block_size, dtype, device,
        kv_cache_dtype=kv_cache_dtype, k_scale=0.5 if kv_cache_dtype != "auto" else 1.0,
    )  # fmt: skip
    poison_tails(case)
    want = reference_decode(
        case.query.cpu(), case.key_cache.cpu(), case.value_cache.cpu(),
        case.block_tables.cpu(), case.seq_lens.cpu(), None, None, kv_cache_dtype,
        case.k_scale, case.v_scale,
    )  # fmt: skip
    worst = 0.0
    for parts, size in ((1, 1024), (7, 128)):  # one partition; several, partial tiles, merge
        got = _run(lib, case, parts, size)
        torch.cuda.synchronize(device)
        if not bool(torch.isfinite(got).all()):
            return Verdict(False, f"non-finite output with {parts} partition(s)")
        worst = max(worst, float((got.double().cpu() - want).abs().max()))
    tol = TOLERANCE[dtype]
    return Verdict(worst <= tol, f"max abs error {worst:.1e} (tolerance {tol:.0e})")


verify_once.register(KIND, _check)


def _run(lib: NativeLibrary, case, parts: int, size: int) -> torch.Tensor:
    num_seqs, num_heads, head_size = case.query.shape
    out = torch.full_like(case.query, math.nan)
    o_shape, l_shape = partials_shapes(num_seqs, num_heads, parts, head_size)
    fp8 = case.kv_cache_dtype != "auto"
    launch_decode(
        lib, query=case.query, key_cache=case.key_cache, value_cache=case.value_cache,
        block_tables=case.block_tables, seq_lens=case.seq_lens, out=out,
        scale=head_size**-0.5 * (case.k_scale if fp8 else 1.0),
        v_scale=case.v_scale if fp8 else 1.0, kv_cache_dtype=case.kv_cache_dtype,
        num_partitions=parts, partition_size=size,
        part_out=torch.empty(o_shape, device=out.device) if parts > 1 else None,
        part_lse=torch.empty(l_shape, device=out.device) if parts > 1 else None,
    )  # fmt: skip
    return out
