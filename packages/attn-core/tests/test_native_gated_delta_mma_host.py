"""The Gated DeltaNet library in its NVIDIA configuration on the CPU: the 16-bit chunk-parallel
pair on the matrix unit (chunk_prep16, chunk_pass16), against the float64 reference.

ci/host_emulation.py builds csrc/gated_delta.cu as nvcc does (no ``__ILUVATAR__``) for the
host: ldmatrix, the m16n8k16 instruction and the shuffles run as warp collectives
(ci/host_cuda/attn_emu_warp.h), every asynchronous copy lands as late as its wait allows
(cuda_pipeline.h), shared memory starts NaN. So CI checks the pair's fragment arithmetic and
its copy pipeline without a GPU: a transposed fragment, a misplaced row or a read before a wait
fails here. Also run once with each phase's threads in reverse order (same bits). The rest of
the family in this configuration (the fp32 pair, decode, convolutions) shares the CoreX source
the other host tests check; its verify-once checks run here too.

Not covered: what nvcc makes of the source, races within a warp's lockstep, and time (the
``cuda`` tests in test_native_gated_delta_cuda.py).
"""

from __future__ import annotations

import pytest
import torch
from host_emulation_helpers import both_orders, emulated_gated_delta_nvidia

from attn_core.native.gated_delta import (
    OPERANDS16_STATE_TOLERANCE,
    TOLERANCE,
    check_chunk_parallel,
    check_chunk_parallel16,
    check_library,
    launch_chunk_parallel_prefill,
    prefill_errors,
)
from attn_core.native.split import chunk_record_bytes

CPU = torch.device("cpu")


def test_the_library_has_the_16bit_pair_and_its_record_size() -> None:
    lib = emulated_gated_delta_nvidia()
    assert lib.has_pair16(128, 128, torch.bfloat16) and lib.has_pair16(128, 32, torch.float16)
    assert not lib.has_pair16(64, 128, torch.bfloat16)  # K = 64: not compiled
    assert not lib.has_pair16(128, 128, torch.float32)
    for head_v in (32, 96, 128):
        assert lib.chunk_record16_bytes(128, head_v) == chunk_record_bytes(128, head_v, True)


@pytest.mark.parametrize(
    "dtype,group,head_v",
    [(torch.bfloat16, 2, 128), (torch.float16, 1, 32), (torch.bfloat16, 1, 96)],
    ids=["bf16-group2-v128", "fp16-group1-v32", "bf16-group1-v96"],
)
def test_the_16bit_pairs_own_check_passes(dtype, group: int, head_v: int) -> None:
    """Verify-once's check: lengths 0, 1, 5, 63, 64, 65, 70 and 200 in one segment and in
    one-slot segments (every chunk's state handed over through the final-state buffer)."""
    lib = emulated_gated_delta_nvidia()
    verdict = check_chunk_parallel16(lib, CPU, (lib.path.name, dtype, 128, head_v, group), 0)
    assert verdict.ok, verdict.detail


def test_the_16bit_pair_gives_the_same_bits_in_either_thread_order() -> None:
    """A read of shared memory another thread writes in the same phase, unordered by a barrier,
    would change with the order (the warp collectives themselves are lockstep): one-slot
    segments over 65 and 3 tokens, the output and final states compared bit for bit."""
    lib = emulated_gated_delta_nvidia()
    gen = torch.Generator().manual_seed(4)
    t, hv = 68, 2
    x = dict(
        q=torch.randn(t, 1, 128, generator=gen).bfloat16(),
        k=torch.randn(t, 1, 128, generator=gen).bfloat16(),
        v=torch.randn(t, hv, 64, generator=gen).bfloat16(), g=-torch.rand(t, hv, generator=gen),
        beta=torch.rand(t, hv, generator=gen).bfloat16(),
    )  # fmt: skip

    def run():
        out = torch.full((t, hv, 64), float("nan"), dtype=torch.bfloat16)
        final = torch.full((2, hv, 128, 64), float("nan"))
        launch_chunk_parallel_prefill(lib, **x, lengths=(65, 3), out=out, scale=128**-0.5,
                                      l2norm=True, final_state=final, workspace_bytes=1,
                                      operands16=True, stream=0)  # fmt: skip
        return out, final

    out, final = both_orders(run, lib)
    assert torch.isfinite(out.float()).all() and torch.isfinite(final).all()


@pytest.mark.parametrize("l2norm", [False, True])
def test_unnormalised_keys_and_lengths_around_the_chunk(l2norm: bool) -> None:
    lib = emulated_gated_delta_nvidia()
    o, s = prefill_errors(
        lib, 2, 4, 128, 32, torch.float16, CPU, lengths=(0, 1, 64, 129, 7), l2norm=l2norm,
        parallel=True, operands16=True, stream=0, seed=3,
    )  # fmt: skip
    assert o <= TOLERANCE[torch.float16] and s <= OPERANDS16_STATE_TOLERANCE[torch.float16], (o, s)


def test_the_rest_of_the_family_passes_its_checks_in_this_configuration() -> None:
    lib = emulated_gated_delta_nvidia()
    config = (lib.path.name, torch.bfloat16, 128, 64, 2)
    for check in (check_library, check_chunk_parallel):
        verdict = check(lib, CPU, config, stream=0)
        assert verdict.ok, (check.__name__, verdict.detail)
