"""Native-op probing and V1's shared-memory reach."""

import types

import pytest

from attn_core import get_device_spec
from engine_patch.native import probe, v1_max_seq_len, v1_shared_mem_bytes
from engine_patch.signatures import KNOWN, UPSTREAM, VENDOR


def _module(**fns):
    return types.SimpleNamespace(**fns)


def _fn(names, body="pass"):
    namespace = {}
    exec(f"def f({', '.join(names)}):\n    {body}", namespace)
    return namespace["f"]


def test_missing_op():
    op = probe("paged_attention_v2", _module())
    assert not op.present and op.fn is None and "no paged_attention_v2" in op.detail


def test_upstream_without_compiled_kernel_is_absent():
    # The vLLM 0.6.3 wheel on a CPU torch: the Python function exists, torch.ops._C does not.
    op = probe(
        "paged_attention_v1", _module(paged_attention_v1=_fn(KNOWN["paged_attention_v1"][UPSTREAM]))
    )
    assert op.flavour == UPSTREAM and not op.present
    assert "torch.ops._C.paged_attention_v1 is not registered" in op.detail


def test_vendor_function_is_present_and_a_stub_is_not():
    names = KNOWN["paged_attention_v2"][VENDOR]
    real = probe("paged_attention_v2", _module(paged_attention_v2=_fn(names, "return None")))
    assert real.present and real.works and real.flavour == VENDOR
    stub = _fn(names, "raise NotImplementedError('no v2 here')")
    op = probe("paged_attention_v2", _module(paged_attention_v2=stub))
    assert not op.present and "NotImplementedError" in op.detail


@pytest.mark.parametrize(
    "profile, head_size, want",
    [
        # 32 KiB: (32768 - 256*2 q_vecs - 2*2*4 red_smem) / 4 = 8060 -> 8048 at block 16.
        ("bi-v100", 256, 8048),
        ("bi-v100", 128, 8112),
        ("bi-v100-smem48k", 256, 12144),
    ],
)
def test_v1_reach(profile, head_size, want):
    spec = get_device_spec(profile)
    limit = v1_max_seq_len(spec, 16, head_size, 2)
    assert limit == want
    assert v1_shared_mem_bytes(limit, 16, head_size, 2, spec.warp_size) <= spec.shared_mem_per_block
    assert (
        v1_shared_mem_bytes(limit + 1, 16, head_size, 2, spec.warp_size) > spec.shared_mem_per_block
    )
