#!/usr/bin/env bash
# Every GPU measurement this repository records, in one go on a lab GPU (or the H200 stand-in).
#
#   bash bench/gpu_all.sh OUT_DIR [STEP ...]     # default: all steps, in this order
#
# Steps: cuda_tests decode_bench prefill_bench occupancy sim_calibration long_context
#        native_build native_status native_tests native_sanitize native_bench vllm_build
# Each step runs under its own timeout, writes OUT_DIR/STEP.log, and appends "STEP rc=N" to
# OUT_DIR/steps.txt; a failing or hung step does not stop the others. No nox needed: the
# packages run from the tree. Current numbers go in docs/benchmarks.md (one section per
# capability, with device, date, commit and command).
set -u
OUT="${1:-results}"
shift || true
mkdir -p "$OUT"
# absolute before the cd below: a relative OUT_DIR is the caller's, not the repository's
OUT="$(cd "$OUT" && pwd)" || { echo "cannot enter OUT_DIR $OUT" >&2; exit 2; }
cd "$(dirname "$0")/.."
STEPS_DIR="$OUT"
. bench/_steps.sh

run() {
    case "$1" in
    # the whole CUDA suite: 430 tests took 254 s on the H200 with 14 workers
    # (docs/benchmarks.md#cuda-tests), so the step spreads over the host's cores (pytest-xdist)
    # and stops one test hung past 300 s
    cuda_tests) step cuda_tests 570 python3 -m pytest -q -m cuda -p no:cacheprovider \
        -n "${CUDA_TEST_WORKERS:-14}" --timeout 300 \
        packages/attn-core/tests packages/engine-patch/tests packages/sim/tests ;;
    decode_bench) step decode_bench 150 python3 bench/decode_bench.py --out "$OUT" ;;
    prefill_bench) step prefill_bench 200 python3 bench/prefill_bench.py --out "$OUT" --budget-s 170 ;;
    occupancy) step occupancy 60 python3 bench/occupancy_check.py --out "$OUT" ;;
    sim_calibration) step sim_calibration 130 python3 bench/sim_calibration.py --out "$OUT" ;;
    long_context) step long_context 240 python3 -m hil --executor local --target h200-local \
        --suite long-context --out "$OUT/hil" --state "$OUT/hil/state.json" ;;
    native_build) step native_build 300 python3 -m attn_core.native build ;;
    native_status) step native_status 120 python3 -m attn_core.native status ;;
    native_tests) step native_tests 300 python3 -m pytest -q -p no:cacheprovider \
        packages/attn-core/tests/test_native_decode.py ;;
    native_sanitize) step native_sanitize 300 bash -c \
        "compute-sanitizer --tool memcheck --error-exitcode 9 python3 bench/native_sanitize.py && \
         compute-sanitizer --tool racecheck --error-exitcode 9 python3 bench/native_sanitize.py" ;;
    native_bench) step native_bench 420 python3 bench/native_decode_bench.py --out "$OUT" --sweep ;;
    vllm_build) step vllm_build 420 python3 -c "import sys; sys.path.insert(0, 'bench'); \
        from pathlib import Path; from vllm_baseline import load_vllm_v2; \
        print(load_vllm_v2(Path('.ci-cache/vllm-0.6.3.tar.gz'))[1])" ;;
    *) echo "unknown step: $1" >&2; return 2 ;;
    esac
}

steps=("$@")
[ ${#steps[@]} -gt 0 ] || steps=(cuda_tests decode_bench prefill_bench occupancy sim_calibration long_context)
record_device python3
for s in "${steps[@]}"; do run "$s"; done
cat "$OUT/steps.txt"
