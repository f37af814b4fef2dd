"""vLLM 0.6.3's own paged-attention kernels, built from its sdist, as a benchmark baseline.

The sdist is fetched on a machine with a package index (the device machine has none) and
carried along:

    VLLM_TARGET_DEVICE=empty pip download --no-deps --no-binary :all: --no-build-isolation \
        vllm==0.6.3 -d .ci-cache/

:func:`load_vllm_v2` extracts ``csrc/`` to a temporary directory and compiles
``csrc/attention/attention_kernels.cu`` plus a small binding of ours into a torch extension
(nothing of vLLM is stored in this repository). Returns None and the reason where nvcc, the
sdist or a CUDA device is missing, so the benchmark can print the row as skipped.
"""

from __future__ import annotations

import math
import shutil
import tarfile
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Optional

import torch

# vLLM 0.6.3's V2 partition size (csrc/attention/attention_kernels.cu, PARTITION_SIZE).
VLLM_PARTITION_SIZE = 512

_BINDING = """
#include <torch/extension.h>
// The V2 launcher's signature as vLLM 0.6.3's csrc/ops.h declares it.
void paged_attention_v2(
    torch::Tensor& out, torch::Tensor& exp_sums, torch::Tensor& max_logits,
    torch::Tensor& tmp_out, torch::Tensor& query, torch::Tensor& key_cache,
    torch::Tensor& value_cache, int64_t num_kv_heads, double scale,
    torch::Tensor& block_tables, torch::Tensor& seq_lens, int64_t block_size,
    int64_t max_seq_len, const c10::optional<torch::Tensor>& alibi_slopes,
    const std::string& kv_cache_dtype, double k_scale, double v_scale, const int64_t tp_rank,
    const int64_t blocksparse_local_blocks, const int64_t blocksparse_vert_stride,
    const int64_t blocksparse_block_size, const int64_t blocksparse_head_sliding_step);
PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("paged_attention_v2", &paged_attention_v2); }
"""


def load_vllm_v2(sdist: Path, arch: Optional[str] = None) -> tuple[Optional[object], str]:
    """``(module with paged_attention_v2, how long the build took)`` or ``(None, why not)``."""
    if not torch.cuda.is_available():
        return None, "needs a CUDA device"
    if not sdist.is_file():
        return None, f"no vLLM sdist at {sdist} (see this module's docstring)"
    if shutil.which("nvcc") is None:
        return None, "nvcc not on PATH"
    from torch.utils.cpp_extension import load

    major, minor = torch.cuda.get_device_capability()
    arch = arch or f"{major}{minor}"
    # a fixed directory: a second load (another process) reuses the build instead of redoing it
    work = Path(tempfile.gettempdir()) / f"vllm063_sm{arch}"
    work.mkdir(exist_ok=True)
    with tarfile.open(sdist) as tar:
        members = [m for m in tar.getmembers() if "/csrc/" in m.name]
        tar.extractall(work, members=members)  # noqa: S202 - our own download, csrc/ only
    csrc = next(work.glob("vllm-*/csrc"))
    binding = work / "binding.cpp"
    binding.write_text(_BINDING)
    start = time.monotonic()
    try:
        module = load(
            name="vllm063_paged_attention",
            sources=[str(csrc / "attention" / "attention_kernels.cu"), str(binding)],
            extra_include_paths=[str(csrc)],
            extra_cuda_cflags=[
                "-O3",
                f"-gencode=arch=compute_{arch},code=sm_{arch}",
                # vLLM's own build undoes torch's "no half operators" defaults
                "-U__CUDA_NO_HALF_OPERATORS__",
                "-U__CUDA_NO_HALF_CONVERSIONS__",
                "-U__CUDA_NO_BFLOAT16_CONVERSIONS__",
                "-U__CUDA_NO_HALF2_OPERATORS__",
            ],
            build_directory=str(work),
            verbose=False,
        )
    except Exception as exc:  # a baseline that does not build is a skipped row, not a crash
        return None, f"build failed: {type(exc).__name__}: {str(exc)[-300:]}"
    return module, f"built in {time.monotonic() - start:.0f} s"


def v2_step(
    module: object,
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    max_seq_len: int,
    out: torch.Tensor,
) -> Callable[[], torch.Tensor]:
    """One V2 decode step with its scratch preallocated (capturable in a CUDA graph)."""
    num_seqs, num_heads, head_size = query.shape
    num_kv_heads, block_size = key_cache.shape[1], key_cache.shape[3]
    parts = math.ceil(max_seq_len / VLLM_PARTITION_SIZE)
    dev = query.device
    exp_sums = torch.empty(num_seqs, num_heads, parts, dtype=torch.float32, device=dev)
    max_logits = torch.empty_like(exp_sums)
    tmp_out = torch.empty(num_seqs, num_heads, parts, head_size, dtype=query.dtype, device=dev)
    scale = head_size**-0.5

    def step() -> torch.Tensor:
        module.paged_attention_v2(  # type: ignore[attr-defined]
            out, exp_sums, max_logits, tmp_out, query, key_cache, value_cache, num_kv_heads,
            scale, block_tables, seq_lens, block_size, max_seq_len, None, "auto", 1.0, 1.0,
            0, 0, 1, 64, 0,
        )  # fmt: skip
        return out

    return step


if __name__ == "__main__":
    from _args import not_a_benchmark  # this script's folder leads sys.path

    not_a_benchmark(__doc__, "bench/native_decode_bench.py times this baseline")
