"""Extreme but finite scales and magnitudes (issue 18, class 6): every path applies the softmax
scale in fp32, so a result is finite wherever the float64 reference is, and close to it.

fp16 decode with ``scale=65536`` used to fold the scale into the fp16 query (exact for a power
of two, but ``q * 65536`` overflows fp16 for ``|q| >= 1``) and returned NaN. The reference is
computed from the same rounded inputs the kernel reads; the tolerance is relative to the
largest ``|value|`` (every output is a convex combination of values), so it holds for the
near-one-hot softmax of a huge scale as for the uniform one of a tiny scale.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator
from typing import Union

import pytest
import torch
from conftest import poisoned_like
from decode_helpers import plan_of
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from attn_core import paged_decode, paged_prefix_prefill
from attn_core.reference import (
    make_paged_case,
    make_prefill_case,
    reference_decode,
    reference_prefix_prefill,
)

CUDA = torch.cuda.is_available()
DEVICES = ("cpu", "cuda") if CUDA else ("cpu",)
# (device, backend) pairs that run on this machine; the native decode and the fused prefill
# backends need a GPU (a backend the device cannot serve is skipped there, not failed).
DECODE_BACKENDS = [("cpu", "torch")] + ([("cuda", "torch"), ("cuda", "native")] if CUDA else [])
PREFILL_BACKENDS = [("cpu", "torch")] + ([("cuda", "torch"), ("cuda", "sdpa")] if CUDA else [])

# The scales, powers of two (the old fold was taken exactly for them) and the defaults.
SCALES = st.one_of(
    st.sampled_from((1e-4, 1 / 16, 0.125, 1.0, 16384.0, 32768.0, 65536.0)),
    st.floats(1e-4, 65536.0, allow_nan=False, allow_infinity=False),
)
MAGNITUDES = st.sampled_from((1e-3, 0.1, 1.0, 8.0, 64.0))
# Relative to max|v|: fp16 rounds probabilities (2^-11) and the output once more; bf16 2^-8.
# The softmax itself is computed in fp32, so a huge scale adds no more than that.
REL_TOL = {torch.float16: 4e-3, torch.bfloat16: 3e-2, torch.float32: 1e-4}

COMMON = settings(
    max_examples=30,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


def at_extreme_scales(
    backends: list[tuple[str, str]], **problem: st.SearchStrategy
) -> Callable[[Callable[..., None]], Callable[..., None]]:
    """A test over every (device, backend) of ``backends`` and every dtype, given a drawn
    ``scale``, ``magnitude`` and ``seed`` and the problem's own strategies ``problem``."""

    def decorate(test: Callable[..., None]) -> Callable[..., None]:
        drawn = given(scale=SCALES, magnitude=MAGNITUDES, seed=st.integers(0, 2**16), **problem)
        by_dtype = pytest.mark.parametrize("dtype", (torch.float16, torch.bfloat16, torch.float32))
        by_backend = pytest.mark.parametrize(("device", "backend"), backends)
        return by_backend(by_dtype(COMMON(drawn(test))))

    return decorate


def _magnified(t: torch.Tensor, magnitude: float) -> torch.Tensor:
    """``t * magnitude`` rounded once to ``t``'s dtype (the inputs the kernel reads)."""
    return (t.double() * magnitude).to(t.dtype)


def _magnify(case, magnitude: float, *names: str) -> None:
    """Each tensor ``names`` of ``case`` replaced by its :func:`_magnified` copy."""
    for name in names:
        setattr(case, name, _magnified(getattr(case, name), magnitude))


@contextlib.contextmanager
def _skip_if_unserved(
    backend: str, errors: Union[type[Exception], tuple[type[Exception], ...]], what: str
) -> Iterator[None]:
    """One of ``errors`` from a forced backend other than torch means this device cannot serve
    it: the test skips, naming ``what``; from torch it stands."""
    try:
        yield
    except errors as exc:
        if backend == "torch":
            raise
        pytest.skip(f"{what} unavailable here: {exc}")


def _used_max(value_cache: torch.Tensor, block_tables: torch.Tensor, lens: list) -> float:
    """max |v| over the blocks the sequences use (spare blocks hold 30x larger values)."""
    bs = value_cache.shape[-1]
    ids = [int(b) for s, n in enumerate(lens) for b in block_tables[s, : -(-n // bs)].tolist()]
    return float(value_cache[torch.tensor(ids, device=value_cache.device)].abs().max())


def _logit_error(scale: float, q: torch.Tensor, k: torch.Tensor) -> float:
    """A bound on the absolute error of an fp32 logit ``scale * q . k``: ``head_size`` fp32
    roundings of products up to ``max|q| max|k|``. Every path computes logits in fp32 (so
    does vLLM): at ``scale = 65536`` and magnitude 64 a logit is ~10^10 and only known to
    ~10^3, so near-ties may legitimately swap weight; where the bound is small (all ordinary
    scales, and huge ones on small magnitudes) the check below is tight."""
    eps = torch.finfo(torch.float32).eps
    return q.shape[-1] * eps * scale * float(q.abs().max()) * float(k.abs().max())


def _check(
    out: torch.Tensor, ref: torch.Tensor, values_max: float, dtype: torch.dtype, logit_err: float
) -> None:
    """Finite wherever the reference is, and within the dtype's rounding plus what the fp32
    logits' own error can move the weights (``exp(delta) - 1``, capped at the value range:
    every output is a convex combination of values)."""
    assert torch.isfinite(ref).all(), "the reference itself is not finite: a bad test case"
    got = out.double().cpu()
    assert torch.isfinite(got).all(), "NaN/inf where the float64 reference is finite"
    err = float((got - ref).abs().max())
    weights = min(2.0, math.expm1(min(2 * logit_err, 5.0)))
    assert err <= (REL_TOL[dtype] + weights) * values_max + 1e-30, (err, values_max, logit_err)


@at_extreme_scales(
    DECODE_BACKENDS,
    lens=st.lists(st.integers(1, 70), min_size=1, max_size=3),
    tier=st.sampled_from((None, "single_tile", "one_pass", "partitioned")),
)
def test_decode_finite_and_close_at_extreme_scales(
    device, backend, dtype, scale, magnitude, lens, tier, seed
) -> None:
    case = make_paged_case(lens, 8, 2, 64, 16, dtype, device, seed=seed)
    _magnify(case, magnitude, "query", "key_cache", "value_cache")
    plan = plan_of(case, tier=tier) if backend == "torch" else None
    out = poisoned_like(case.query)
    with _skip_if_unserved(backend, ValueError, "native decode"):
        paged_decode(
            case.query, case.key_cache, case.value_cache, case.block_tables, case.seq_lens,
            case.max_seq_len, scale, out=out, plan=plan, backend=backend,
        )  # fmt: skip
    ref = reference_decode(
        case.query, case.key_cache, case.value_cache, case.block_tables, case.seq_lens, scale
    )
    logit_err = _logit_error(scale, case.query, case.key_cache)
    _check(out, ref, _used_max(case.value_cache, case.block_tables, lens), dtype, logit_err)


@at_extreme_scales(
    PREFILL_BACKENDS,
    seqs=st.lists(st.tuples(st.integers(1, 40), st.integers(1, 20)), min_size=1, max_size=3),
)
def test_prefill_finite_and_close_at_extreme_scales(
    device, backend, dtype, scale, magnitude, seqs, seed
) -> None:
    if device == "cuda" and backend == "torch" and dtype != torch.float32 and scale <= 1.0:
        # The CUDA plan's 2-byte score tile (fp16) or 2-byte scaled query (bf16) holds a logit
        # to 2^-11 / 2^-8 of its size: the plan's documented trade-off for logits of ~30
        # (prefill/plan.py, _score_dtypes), not this issue's. Logits of 10^4 (magnitude 64 at
        # scale 1) would put near-ties off by whole units; a scale > 1 runs with fp32 scores.
        assume(magnitude <= 1.0)
    case = make_prefill_case(seqs, 8, 2, 64, 16, dtype, device, seed=seed)
    _magnify(case, magnitude, "query", "key", "value", "key_cache", "value_cache")
    out = poisoned_like(case.query)
    # a fused backend this device lacks raises either
    with _skip_if_unserved(backend, (ValueError, RuntimeError), f"prefill backend {backend}"):
        paged_prefix_prefill(*case.args(), scale, **case.kwargs(), out=out, backend=backend)
    ref = reference_prefix_prefill(
        case.query, case.key, case.value, case.key_cache, case.value_cache, case.block_tables,
        case.query_start_loc, case.context_lens, scale,
    )  # fmt: skip
    cached = _used_max(case.value_cache, case.block_tables, [c for c, _ in seqs])
    values_max = max(float(case.value.abs().max()), cached)
    keys_max = torch.stack([case.key.abs().max(), case.key_cache.abs().max()]).max()
    _check(out, ref, values_max, dtype, _logit_error(scale, case.query, keys_max))


@pytest.mark.parametrize("planned", (False, True), ids=("caller-plan", "planned-large-scale"))
@pytest.mark.parametrize("scale", (0.5, 16384.0, 65536.0))
def test_prefill_two_byte_score_plan_takes_a_large_scale_in_fp32(scale, planned) -> None:
    """The CUDA fp16 plan's 2-byte score tile, forced on the CPU: a scale > 1 runs with fp32
    scores instead of overflowing the tile. The planner chooses them when told
    (``large_scale``); a caller's plan made without it gets the same dtypes at the call."""
    from attn_core import AttentionShape, PrefillLengths, PrefillOverrides, prefill_plan_for

    case = make_prefill_case([(20, 9), (5, 4)], 8, 2, 64, 16, torch.float16, seed=3)
    shape = AttentionShape(8, 2, 64, 16, torch.float16)
    plan = prefill_plan_for(
        shape, PrefillLengths(9, 20), torch.device("cpu"),
        overrides=PrefillOverrides(backend="torch", score_dtype="float16"),
        large_scale=planned and scale > 1,
    )  # fmt: skip
    want = torch.float32 if planned and scale > 1 else torch.float16
    assert plan.score_dtype == want
    if scale <= 1 and not _cpu_has_half_baddbmm():
        pytest.skip("this torch's CPU has no fp16 baddbmm (torch 2.1); the 2-byte tile needs it")
    out = poisoned_like(case.query)
    paged_prefix_prefill(*case.args(), scale, **case.kwargs(), out=out, plan=plan)
    ref = reference_prefix_prefill(
        case.query, case.key, case.value, case.key_cache, case.value_cache, case.block_tables,
        case.query_start_loc, case.context_lens, scale,
    )  # fmt: skip
    # 2-byte scores carry a 2^-11 relative error of each logit: loose, but never NaN
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out.double(), ref, atol=0.05, rtol=0.05)


def _cpu_has_half_baddbmm() -> bool:
    """torch 2.1's CPU raises ``"baddbmm_with_gemm" not implemented for 'Half'``."""
    a = torch.zeros(1, 2, 2, dtype=torch.float16)
    try:
        torch.baddbmm(a, a, a)
    except RuntimeError:
        return False
    return True
