#!/usr/bin/env bash
# Install the real vllm==0.6.3 Python package into the current Python environment for the CPU
# test stack, without its CUDA dependencies:
#   - the wheel with --no-deps (it declares torch==2.4.0, xformers, CUDA wheels);
#   - the pure-Python packages its imports need, pinned (requirements-vllm.txt, --no-deps);
#   - then delete the wheel's compiled extensions: they are built for torch 2.4 + CUDA and do
#     not load with another torch; _core_C in particular is found by find_spec and then fails,
#     while without the .so files vLLM 0.6.3 imports through its Python fallbacks.
# The environment must already have torch (e.g. a venv made with --system-site-packages).
#
# Usage: packages/engine-patch/ci/install-vllm.sh [python]   (default: python)
# Env:   VLLM_WHEEL_CACHE  where the ~190 MB wheel is kept between runs
#                          (default: $HOME/.cache/bi100-attn/wheels)
set -euo pipefail

PY="${1:-python}"
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
CACHE="${VLLM_WHEEL_CACHE:-$HOME/.cache/bi100-attn/wheels}"
WHEEL_NAME="vllm-0.6.3-cp38-abi3-manylinux1_x86_64.whl"

"$PY" -c "import torch" || { echo "install-vllm.sh: torch must be importable by $PY" >&2; exit 1; }
mkdir -p "$CACHE"
if [ ! -f "$CACHE/$WHEEL_NAME" ]; then
    "$PY" -m pip download --no-deps --only-binary=:all: "vllm==0.6.3" -d "$CACHE"
fi
"$PY" -m pip install --no-deps "$CACHE/$WHEEL_NAME"
"$PY" -m pip install --no-deps -r "$HERE/requirements-vllm.txt"

SITE="$("$PY" -c 'import importlib.util, os; print(os.path.dirname(importlib.util.find_spec("vllm").origin))')"
find "$SITE" -name '*.so' -print -delete
"$PY" - <<'PY'
import vllm.attention.ops.paged_attn  # noqa: F401  (fails here, not in the tests, if incomplete)
from importlib.metadata import version
print("install-vllm.sh: vllm", version("vllm"), "imports on this torch")
PY
