"""The gated delta rule's gates from the layer's projections against the float64 reference:
shapes with and without a batch axis, every input dtype, softplus on both sides of its
threshold, custom softplus parameters, and bad input named."""

from __future__ import annotations

import pytest
import torch

from attn_core import gated_delta_gates
from attn_core.reference.gated_delta import reference_gates

DTYPES = [torch.float32, torch.float16, torch.bfloat16]


def _inputs(shape, dtype, seed=0):
    gen = torch.Generator().manual_seed(seed)
    hv = shape[-1]
    a_log = torch.randn(hv, generator=gen).to(dtype)
    a = (torch.randn(*shape, generator=gen) * 12).to(dtype)  # reaches past the threshold
    dt_bias = torch.randn(hv, generator=gen).to(dtype)
    b = torch.randn(*shape, generator=gen).to(dtype)
    return a_log, a, dt_bias, b


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", [(7, 5), (2, 3, 32)])
def test_gates_match_the_reference(dtype, shape) -> None:
    a_log, a, dt_bias, b = _inputs(shape, dtype)
    g, beta = gated_delta_gates(a_log, a, dt_bias, b)
    want_g, want_beta = reference_gates(a_log, a, dt_bias, b)
    assert g.dtype == torch.float32 and g.shape == a.shape
    assert beta is not None and beta.dtype == dtype and beta.shape == b.shape
    assert (g <= 0).all()
    torch.testing.assert_close(g.double(), want_g, atol=1e-5, rtol=1e-5)
    tol = {torch.float32: 1e-6, torch.float16: 1e-3, torch.bfloat16: 8e-3}[dtype]
    torch.testing.assert_close(beta.double(), want_beta, atol=tol, rtol=tol)


def test_softplus_parameters_and_no_b() -> None:
    a_log, a, dt_bias, _ = _inputs((9, 4), torch.float32, seed=1)
    g, beta = gated_delta_gates(a_log, a, dt_bias, softplus_beta=2.0, softplus_threshold=3.0)
    want_g, _ = reference_gates(a_log, a, dt_bias, softplus_beta=2.0, softplus_threshold=3.0)
    assert beta is None
    torch.testing.assert_close(g.double(), want_g, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"A_log": torch.zeros(3)}, "A_log must have shape [4]"),
        ({"dt_bias": torch.zeros(4, dtype=torch.int32)}, "dt_bias must be"),
        ({"b": torch.zeros(2, 4)}, "b must have shape [6, 4]"),
        ({"softplus_beta": 0.0}, "softplus_beta must be > 0, got 0.0"),
        ({"softplus_beta": "1"}, "softplus_beta must be a finite number, got '1'"),
        ({"softplus_threshold": float("nan")}, "softplus_threshold must be a finite number"),
        ({"a": torch.tensor(1.0)}, "a must have shape [..., HV], got a scalar"),
    ],
)
def test_bad_input_is_named(kwargs, message) -> None:
    args = {"A_log": torch.zeros(4), "a": torch.zeros(6, 4), "dt_bias": torch.zeros(4)}
    args.update(kwargs)
    with pytest.raises(ValueError) as err:
        gated_delta_gates(**args)
    assert message in str(err.value)
