"""Scales (``scale``, ``k_scale``, ``v_scale``) are finite and > 0 in every entry point.

Issue 11: decode checked ``<= 0`` (NaN passes), prefill rejected NaN but took inf, cache writes
took inf; each turned every output (or the cache) into NaN/inf without an error.
"""

from __future__ import annotations

import math

import pytest
import torch
from bad_input_helpers import call_with
from hypothesis import given, settings
from hypothesis import strategies as st

from attn_core.core.checks import check_positive_finite, resolve_scale

SCALES = {
    "paged_decode": ("scale", "k_scale", "v_scale"),
    "paged_prefix_prefill": ("scale", "k_scale", "v_scale"),
    "write_to_paged_cache": ("k_scale", "v_scale"),
}
CASES = [(entry, name) for entry, names in SCALES.items() for name in names]
NON_FINITE = (math.nan, math.inf, -math.inf)


@pytest.mark.parametrize("bad", (*NON_FINITE, 0.0, -0.0, -1.0, 0, -2), ids=str)
@pytest.mark.parametrize(("entry", "name"), CASES, ids=[f"{e}-{n}" for e, n in CASES])
def test_non_finite_or_non_positive_scales_are_refused(entry: str, name: str, bad) -> None:
    with pytest.raises(ValueError, match=rf"^{name} must be a positive float, got "):
        call_with(entry, name, bad)


@pytest.mark.parametrize(("entry", "name"), CASES, ids=[f"{e}-{n}" for e, n in CASES])
def test_scale_of_the_wrong_type_names_it(entry: str, name: str) -> None:
    for bad in ("0.5", True, [0.5], torch.tensor(0.5)):
        with pytest.raises(ValueError, match=rf"^{name} must be a (positive )?float"):
            call_with(entry, name, bad)


@pytest.mark.parametrize(("entry", "name"), CASES, ids=[f"{e}-{n}" for e, n in CASES])
def test_good_scales_of_any_real_type_run(entry: str, name: str) -> None:
    np = pytest.importorskip("numpy")  # numpy scalars are numbers.Real; numpy is optional here
    for good in (0.5, 2, np.float32(0.5), np.float64(0.25)):
        out = call_with(entry, name, good)
        if out is not None:
            assert torch.isfinite(out).all()


bad_scalars = st.one_of(
    st.sampled_from(NON_FINITE),
    st.floats(max_value=0.0, allow_nan=False),
    st.integers(max_value=0),
    st.booleans(),
    st.text(max_size=4),
    st.lists(st.floats(0.1, 2.0), max_size=2),
    st.just(torch.tensor([1.0])),
    st.none(),
)


@settings(max_examples=60, deadline=None)
@given(case=st.sampled_from(CASES), bad=bad_scalars)
def test_property_bad_scalars_give_a_named_value_error(case, bad) -> None:
    entry, name = case
    if bad is None and name == "scale":
        return  # None is the documented default (1 / sqrt(head_size))
    with pytest.raises(ValueError) as info:
        call_with(entry, name, bad)
    assert str(info.value).startswith(f"{name} must be"), str(info.value)
    assert "got" in str(info.value)


def test_helper() -> None:
    assert check_positive_finite("s", 2) == 2.0
    for bad in (*NON_FINITE, 0, -1e-30, True, "1", None):
        with pytest.raises(ValueError, match=r"^s must be a positive float, got"):
            check_positive_finite("s", bad)
    assert resolve_scale(None, 64) == 0.125
    with pytest.raises(ValueError, match=r"^scale must be a positive float, got inf"):
        resolve_scale(math.inf, 64)
