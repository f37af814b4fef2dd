#!/usr/bin/env bash
# The native Gated DeltaNet family on one GPU, in one call of under 10 minutes:
#
#   bash bench/linear_native_check.sh [OUT_DIR]      # default: $OUT, else results/linear_native
#
# Steps, each under its own timeout, its output in OUT_DIR/STEP.log and "STEP rc=N" appended to
# OUT_DIR/steps.txt (a failing step does not stop the others):
#   build       load csrc/gated_delta.cu through attn-core's loader (nvcc or CoreX; ~5 s with
#               nvcc 13) and print its kernels' registers, shared memory, spills and occupancy;
#               then the float64 reference check of the model's configuration (bf16, 128 x 128,
#               group 2), its verdict printed;
#   cuda_tests  the family's CUDA tests and the linear layers' (which now take the native
#               kernels by default: prefill, decode and conv);
#   bench       native vs torch decode at batch 1 / 8 / 64 (eager and CUDA-graph replay), then
#               prefill at 32K, 128K and 2 x 16K: the torch chunked path against the native
#               chunked and token-by-token kernels, bench/linear_attn_bench.py
#               (OUT_DIR/linear_attn_bench.json);
# The chunk-parallel pair's compile-time variants, when there are any to time, have their own
# script: bench/linear_pair_tune.py (build here, run there).
set -u
OUT_DIR="${1:-${OUT:-results/linear_native}}"
mkdir -p "$OUT_DIR"
cd "$(dirname "$0")/.."
STEPS_DIR="$OUT_DIR"
. bench/_steps.sh
PY="${PYTHON:-python3}"

# a step, then its log's last lines: this script's output is what gets read
shown_step() {
    step "$@"
    tail -n 25 "$OUT_DIR/$1.log"
}

record_device "$PY"

shown_step build 60 "$PY" - <<'PYEOF'
import torch
from attn_core.core.settings import current_overrides
from attn_core.native.gated_delta import VARIANT, GatedDeltaLibrary
from attn_core.native.loader import load_library

lib, status = load_library(GatedDeltaLibrary, VARIANT, current_overrides().native, torch.device("cuda"))
print(status)
if lib is None:
    raise SystemExit(1)
for which in ("decode", "recurrent_prefill", "chunked_prefill", "conv_update", "conv_prefill",
              "conv_prefill_state"):
    for head_k in (64, 128) if "conv" not in which else (128,):
        print(which, head_k, lib.kernel_info(which, head_k))
from attn_core.native.gated_delta import check_library
print("reference check bf16 128x128 group 2:",
      check_library(lib, torch.device("cuda"), (lib.path.name, torch.bfloat16, 128, 128, 2)))
PYEOF

shown_step cuda_tests 240 "$PY" -m pytest -q -m cuda -p no:cacheprovider -p no:xdist \
    packages/attn-core/tests/test_native_gated_delta_cuda.py \
    packages/attn-core/tests/test_linear_cuda.py

# limits: 60 + 240 + 170 s, under 10 minutes with the device query; the bench starts no
# row after 130 s and rewrites its JSON after every row, so a step cut short keeps what it
# measured
shown_step bench 170 "$PY" bench/linear_attn_bench.py --out "$OUT_DIR" --prefill 32768,131072 \
    --varlen 2x16384 --decode-batches 1,8,64 --iters 3 --budget-s 130

