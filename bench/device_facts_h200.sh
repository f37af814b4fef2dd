#!/usr/bin/env bash
# device-facts on the H200 (--executor local), then profile-from against the h200 profile:
# prints the suite's facts table, then the old-vs-new field table and the predicted times that
# move by more than 10%.
#
#   bash bench/device_facts_h200.sh            # full sizes (under 90 s of suite on an H200)
#   bash bench/device_facts_h200.sh --quick    # quick sizes (a smoke run; on an H100
#                                              # 80GB it was still in its prefill section at 60 s)
#
# Full sizes: 1 GiB bandwidth buffers, 8192^3 fp16/bf16/fp32 matmuls (median of 20), 1000
# tiny launches (eager overhead, graph gap), decode tiers at batch 1/4/16 x context
# 2K/4K/8K/16K/32K/64K (median of 20, eager and graph). Quick: 64 MiB, 2048^3, 200 launches,
# batch 1/4 x 2K/8K, median of 5. The H200 image has no vLLM, so the V1 reach and V2 probe are
# recorded absent with that reason (no probe subprocess runs).
#
# Environment: PYTHON (default python3), RESULTS (default results/hil), BUILD_NATIVE=1 builds
# the native decode kernel first (not counted in the suite's time) so its rows are measured too;
# SKIP_PROFILE=1 stops after the suite (run profile-from elsewhere: it traces 37 cases on two
# profiles, device-free). Where $OUT is set (the device tool), the facts file, its table and the
# profile are copied there.
set -euo pipefail
QUICK=()
for arg in "$@"; do
  case "$arg" in
    --quick) QUICK=(--quick) ;;
    -h|--help) sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "device_facts_h200.sh: error: unknown argument '$arg' (takes only --quick)" >&2; exit 2 ;;
  esac
done
cd "$(dirname "$0")/.."
export PYTHONPATH="packages/attn-core/src:packages/engine-patch/src:packages/sim/src:hil/src${PYTHONPATH:+:$PYTHONPATH}"
PY=${PYTHON:-python3}
RESULTS=${RESULTS:-results/hil}
RUN_ID=facts-$(date -u +%Y%m%dT%H%M%SZ)
if [ "${BUILD_NATIVE:-0}" = "1" ]; then
  # the arch must be the one attn-core loads for this device (sm_90): a build for the default
  # arch list lands under another cache key and the suite would not find it
  "$PY" -m attn_core.native build --arch "${NATIVE_ARCH:-sm_90}" \
    || echo "native build failed or no toolkit: the native_decode fact will say why"
fi

start=$(date +%s)
rc=0
"$PY" -m hil --executor local --target h200-local --suite device-facts --out "$RESULTS" \
  --state "$RESULTS/state.json" --run-id "$RUN_ID" --recheck ${QUICK[@]+"${QUICK[@]}"} || rc=$?
took=$(( $(date +%s) - start ))
echo "device-facts suite: exit $rc, ${took} s (budget 90 s for the full sizes)"

DIR="$RESULTS/$RUN_ID/h200-local/device-facts"
FACTS="$DIR/device_facts.json"
if [ ! -f "$FACTS" ]; then
  echo "no facts file at $FACTS: see $DIR/log.txt" >&2
  exit 2
fi
PROFILE="$DIR/h200+h200-local.json"
if [ "${SKIP_PROFILE:-0}" != "1" ]; then
  "$PY" -m attn_sim profile-from "$FACTS" --base h200 --out "$PROFILE"
fi
if [ -n "${OUT:-}" ]; then
  cp "$FACTS" "$DIR/device_facts_table.md" "$OUT"/
  if [ -f "$PROFILE" ]; then cp "$PROFILE" "$OUT"/; fi
fi
exit "$rc"
