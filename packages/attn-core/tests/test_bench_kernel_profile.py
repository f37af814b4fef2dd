"""bench/_timing.py's kernel profile: the names its split is keyed by, and its CPU behaviour."""

from __future__ import annotations

import pytest
import torch
from bench_modules import bench_module


@pytest.fixture(scope="module")
def timing():
    # loaded when a test runs, not at collection: images that carry only packages/ (the hil
    # suites') collect this file without bench/
    return bench_module("_timing")


@pytest.mark.parametrize(
    ("name", "short"),
    [
        ("void attn::gdn::chunk_pass<128>(AttnGdnPrefillArgs, attn::gdn::ChunkSegment)",
         "chunk_pass<128>"),
        ("void at::native::(anonymous namespace)::fill<float, std::less<void> >(int*)",
         "fill<float, std::less<void> >"),
        ("void cutlass::Kernel2<cutlass_80_tensorop_s1688gemm_64x64_16x6_nn_align4>(Params)",
         "Kernel2<cutlass_80_tensorop_s1688gemm_64x64_16x6_nn_align4>"),
        ("chunk_gated_delta_rule_fwd_kernel_h_blockdim64",
         "chunk_gated_delta_rule_fwd_kernel_h_blockdim64"),
        ("Memcpy DtoD (Device -> Device)", "Memcpy DtoD"),
        ("void at::native::elementwise_kernel<128, 2, at::native::gpu_kernel_impl_nocast<"
         "at::native::BinaryFunctor<float, float, float, at::native::binary_internal::MulFunctor"
         "<float> > >(at::TensorIteratorBase&, at::native::BinaryFunctor<float, float, float, "
         "at::native::binary_internal::MulFunctor<float> > const&)::{lambda(int)#1}>(int, "
         "at::native::gpu_kernel_impl_nocast<at::native::BinaryFunctor<float, float, float> >)",
         "elementwise_kernel<...>"),
        ("void at::native::reduce_kernel<512, 1, at::native::ReduceOp<bool, "
         "at::native::func_wrapper_t<bool, at::native::or_kernel_cuda(at::TensorIterator&)"
         "::{lambda()#1}::operator()() const::{lambda(bool, bool)#1}>, unsigned int, bool, 4, "
         "4> >(at::native::ReduceOp<bool>)", "reduce_kernel<...>"),
    ],
)  # fmt: skip
def test_short_kernel_name(timing, name, short) -> None:
    assert timing.short_kernel_name(name) == short


def test_top_ranks_by_device_time(timing) -> None:
    profiled = timing.KernelProfile(5, {"a": 1.0, "chunk_prep<128>": 7.42, "chunk_pass<128>": 7.27})
    assert profiled.top(2) == "chunk_prep<128> 7.42, chunk_pass<128> 7.27"
    assert timing.KernelProfile(0, {}).top() == ""


def test_cpu_profile_counts_top_level_ops_and_has_no_device_times(timing) -> None:
    row, col = torch.ones(1, 4), torch.ones(4, 1)
    profiled = timing.kernel_profile(lambda: torch.mm(row, col).add_(1), torch.device("cpu"))
    assert profiled is not None and profiled.launches == 2 and profiled.device_ms == {}
    assert timing.kernel_launches(lambda: row + 1, torch.device("cpu")) == 1
