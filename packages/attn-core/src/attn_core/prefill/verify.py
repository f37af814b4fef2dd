"""The one-time check of a fused prefill backend against the float64 reference, above planning.

Planning never runs a kernel: :func:`attn_core.plan_prefill` picks from
``Capabilities.fused_prefill``, and this module narrows that list to the backends that matched
the reference on this device, dtype and head size (:func:`verified_capabilities`), once per
process. :mod:`attn_core.runtime.prefill` calls it lazily on the first prefill; a caller that
forces a fused backend goes through :func:`ensure_verified`, which raises instead of falling back.

The check validates its case as the entry point does (:func:`attn_core.prefill.inputs.
validate_prefill`) and runs the backend's executor (:func:`attn_core.prefill.fused.
run_fused_prefill`) itself: nothing is passed down from the entry point. Verdicts live in the
verify-once registry (:mod:`attn_core.core.verify_once`, kind ``fused_prefill``, config
``(backend, dtype, head_size)``), with every other kernel's.
"""

from __future__ import annotations

import dataclasses

import torch

from attn_core.core import verify_once
from attn_core.core.settings import PrefillOverrides
from attn_core.core.shapes import AttentionShape
from attn_core.device.capabilities import Capabilities, fused_unavailable_reason
from attn_core.device.spec import DEFAULT_DEVICE, get_device_spec
from attn_core.prefill.fused import run_fused_prefill
from attn_core.prefill.inputs import validate_prefill
from attn_core.prefill.plan import PrefillLengths, PrefillPlan, plan_prefill
from attn_core.reference import PrefillCase, make_prefill_case, reference_prefix_prefill

KIND = "fused_prefill"
# Max |error| against the float64 reference a fused kernel may show on the check case: a few
# output ulps at these magnitudes (outputs are averages of N(0, 1) values, |out| < 1).
_CHECK_ATOL = {torch.float16: 2e-2, torch.bfloat16: 5e-2}


def verified_capabilities(
    caps: Capabilities, device: torch.device, dtype: torch.dtype, head_size: int
) -> Capabilities:
    """``caps`` with ``fused_prefill`` narrowed to the backends that matched the reference."""
    ok = tuple(n for n in caps.fused_prefill if _verify(n, device, dtype, head_size)[0])
    return caps if ok == caps.fused_prefill else dataclasses.replace(caps, fused_prefill=ok)


def ensure_verified(name: str, device: torch.device, dtype: torch.dtype, head_size: int) -> None:
    """Raise ``ValueError`` unless backend ``name`` is available and matched the reference: a
    forced backend that cannot serve is the caller's choice at fault, as for the native one."""
    why = fused_unavailable_reason(name, device, dtype)
    if why is not None:
        raise ValueError(f"prefill backend {name!r} is not available: {why}")
    ok, detail = _verify(name, device, dtype, head_size)
    if not ok:
        raise ValueError(
            f"prefill backend {name!r} did not match the reference on {device} for {dtype}, "
            f"head_size {head_size}: {detail}"
        )


def _verify(
    name: str, device: torch.device, dtype: torch.dtype, head_size: int
) -> tuple[bool, str]:
    verdict = verify_once.verdict(KIND, device, (name, dtype, head_size))
    return verdict.ok, verdict.detail


def _check(device: torch.device, config: tuple, subject: object = None) -> verify_once.Verdict:
    name, dtype, head_size = config
    return verify_once.Verdict(*_run_check(name, device, dtype, head_size))


def run_case(case: PrefillCase, plan: PrefillPlan) -> torch.Tensor:
    """``case`` through a fused ``plan``, validated as the entry point validates a call."""
    kw = case.kwargs()
    problem, spans = validate_prefill(
        *case.args(), None, kw["alibi_slopes"], kw["sliding_window"], kw["kv_cache_dtype"],
        kw["k_scale"], kw["v_scale"],
    )  # fmt: skip
    out = torch.empty_like(case.query)
    run_fused_prefill(plan, problem, spans, out)
    return out


def _run_check(
    name: str, device: torch.device, dtype: torch.dtype, head_size: int
) -> tuple[bool, str]:
    """Run the backend on a small GQA case (context + chunk, streaming split) vs the reference."""
    # Three sequences, one of them a single token; the query tile of 8 and 32-token streamed
    # context chunks make every part and merge path run. (Every sequence has context: the shared
    # reference cannot read a zero-token context yet.)
    case = make_prefill_case(
        [(37, 21), (5, 9), (80, 1)], 4, 2, head_size, block_size=16, dtype=dtype, device=device
    )
    plan = plan_prefill(
        AttentionShape(4, 2, head_size, 16, dtype),
        PrefillLengths(case.max_query_len, 80),
        get_device_spec(DEFAULT_DEVICE),  # grids only; the check does not read them
        Capabilities(device_type=device.type),
        PrefillOverrides(backend=name, stream=True, query_tile=8),
    )
    assert isinstance(plan, PrefillPlan)  # a forced fused backend's plan
    plan = dataclasses.replace(plan, stream_chunk=32)
    try:
        got = run_case(case, plan)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
    except Exception as exc:  # any failure of an optional kernel means "not usable here"
        return False, f"raised {type(exc).__name__}: {exc}"
    want = reference_prefix_prefill(**case.reference_kwargs())
    err = float((got.double().cpu() - want).abs().max())
    ok = bool(err <= _CHECK_ATOL.get(dtype, 1e-3))
    return ok, f"max abs error {err:.2e} (tolerance {_CHECK_ATOL.get(dtype, 1e-3):.0e})"


verify_once.register(KIND, _check)
