#!/bin/sh
# `engine-patch status` as an image build step. engine-patch documents a console script
# (`engine-patch status`) and `python -m engine_patch`; use whichever this image has. Exit
# status is engine-patch's: 0 when vLLM is absent or the patch is active, non-zero otherwise.
PY="${1:-python3}"
if command -v engine-patch >/dev/null 2>&1; then
    exec engine-patch status
fi
"$PY" -m engine_patch status
rc=$?
if [ "$rc" = 2 ]; then
    # argparse usage error: a `python -m engine_patch` without subcommands is the status itself
    exec "$PY" -m engine_patch
fi
exit "$rc"
