"""engine-patch on a CUDA device (the lead's H200 runs, the HIL functional suite on BI-V100).

vLLM is not installed there: the upstream-convention replacements and the stand-in fork run on
device tensors, and the status self-test runs on the device against the float64 reference.
"""

import json

import ep_helpers
import fake_vllm
import pytest
import torch
from ep_helpers import DECODE_TOL, PREFIX_TOL, assert_close, decode_args, decode_reference, op_args

from attn_core.core import settings, verify_once
from attn_core.core.shapes import AttentionShape, dtype_from_name
from attn_core.native.prefill import PrefillLibrary
from attn_core.reference import (
    make_paged_case,
    make_prefill_case,
    reference_prefix_prefill,
)
from engine_patch import cli, ops, register
from engine_patch.platform import PLATFORM_ENV
from engine_patch.selftest import run_self_test

NATIVE_PREFILL = PrefillLibrary.VERIFY_KIND

clean_state = pytest.fixture(ep_helpers.clean_state)

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]
CUDA = torch.device("cuda")


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32"])
@pytest.mark.parametrize("heads, kv_heads, head_size", [(24, 4, 256), (16, 2, 256), (32, 8, 128)])
def test_self_test_on_device(heads, kv_heads, head_size, dtype):
    checks = run_self_test(
        AttentionShape(heads, kv_heads, head_size, 16, dtype_from_name(dtype)), CUDA
    )
    assert all(c.passed for c in checks), [c for c in checks if not c.passed]
    assert all(c.device.startswith("cuda") for c in checks)


@pytest.mark.parametrize("seq_lens", [[1, 9, 81, 729], [33001, 5]])
def test_upstream_v2_replacement_on_device(seq_lens):
    case = make_paged_case(seq_lens, 24, 4, 256, 16, torch.float16, CUDA, seed=21)
    out = torch.full_like(case.query, float("nan"))
    empty = torch.empty(0, device=CUDA)
    ops.upstream_paged_attention_v2(
        out, empty, empty, empty, *op_args(case, 4, 0.0625, max(seq_lens)), 1.0, 1.0
    )
    assert_close(out, decode_reference(case, 0.0625), DECODE_TOL[torch.float16])


def test_fork_route_on_device(monkeypatch, clean_state):
    """Within V1's reach the platform's (stand-in) V1 runs; beyond it attn-core, on the GPU.

    The fork's V2 raises NotImplementedError (as on BI-V100): the first call beyond V1's reach
    probes it once, then attn-core serves that call and every later one.
    """
    monkeypatch.setenv(PLATFORM_ENV, "generic")
    monkeypatch.setenv("ENGINE_PATCH_V1_MAX_SEQ_LEN", "512")
    mods = fake_vllm.install(monkeypatch)
    register()
    paged = mods["vllm.attention.ops.paged_attn"].PagedAttention
    mapping = torch.arange(16, dtype=torch.int32, device=CUDA) // 8
    cases = (([100, 500], ["native_v1"]), ([513, 20000], ["native_v2"]), ([600, 9000], []))
    for lens, calls in cases:
        fake_vllm.CALLS.clear()
        case = make_paged_case(lens, 16, 2, 256, 16, torch.bfloat16, CUDA, seed=22)
        out = paged.forward_decode(*decode_args(case, max(lens), mapping, 0.0625))
        assert fake_vllm.CALLS == calls
        assert_close(out, decode_reference(case, 0.0625), DECODE_TOL[torch.bfloat16])


def test_status_cli_on_device(capsys, clean_state):
    code = cli.main(["status", "--json", "--device", "cuda"])
    report = json.loads(capsys.readouterr().out)
    assert report["device"].startswith("cuda")
    assert code == report["exit_code"] == 0, report["self_test"]


@pytest.fixture
def native_prefill_forced(monkeypatch):
    """``ATTN_CORE_PREFILL_BACKEND=native`` in attn-core's settings snapshot for one test."""
    monkeypatch.setenv("ATTN_CORE_PREFILL_BACKEND", "native")
    settings.reload()
    yield
    monkeypatch.delenv("ATTN_CORE_PREFILL_BACKEND")
    settings.reload()


def test_forward_prefix_runs_the_native_prefill_kernel(monkeypatch, clean_state,
                                                       native_prefill_forced):  # fmt: skip
    """vLLM's forward_prefix, patched, reaches attn-core's native prefill kernel on the GPU when
    the settings force it (issue 16's routing; on the H200 the default plan prices SDPA
    cheaper): Qwen3.6's heads, varlen chunks over contexts 0 to 2000, against float64."""
    monkeypatch.setenv(PLATFORM_ENV, "generic")
    fake_vllm.install(monkeypatch)
    register()
    from vllm.attention.ops.paged_attn import PagedAttention

    case = make_prefill_case([(0, 7), (300, 33), (2000, 17)], 24, 4, 256, 16, torch.float16,
                             CUDA, seed=5)  # fmt: skip
    q, k, v, kc, vc, bt, loc, lens, ctx, max_q = case.args()
    fake_vllm.CALLS.clear()
    out = PagedAttention.forward_prefix(
        q, k, v, "auto", kc, vc, bt, loc, lens, ctx, max_q, None, None, 1.0, 1.0
    )
    assert "triton_context_attention_fwd" not in fake_vllm.CALLS
    verdicts = [v for kind, _, _, v in verify_once.verdicts() if kind == NATIVE_PREFILL]
    assert verdicts and all(v.ok for v in verdicts), verdicts
    want = reference_prefix_prefill(q, k, v, kc, vc, bt, loc, ctx).cpu()
    assert_close(out, want, PREFIX_TOL[torch.float16])
