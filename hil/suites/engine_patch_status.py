"""``engine-patch status`` as a suite step: its output saved to OUT/engine-patch-status.txt.

engine-patch documents a console script (``engine-patch status``) and ``python -m engine_patch``;
this uses whichever the image has. The exit status is engine-patch's: non-zero when vLLM is
present but the patch is not active in the process, or a self-test failed.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
from pathlib import Path

from suite_files import write_atomic


def status_argv() -> list:
    found = shutil.which("engine-patch")
    return [found, "status"] if found else [sys.executable, "-m", "engine_patch", "status"]


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args()
    argv = status_argv()
    proc = subprocess.run(argv, capture_output=True, text=True)
    text = proc.stdout + proc.stderr
    if proc.returncode == 2 and "usage" in text.lower():
        argv = argv[:-1]  # a `python -m engine_patch` without subcommands is the status itself
        proc = subprocess.run(argv, capture_output=True, text=True)
        text = proc.stdout + proc.stderr
    print(text, end="", flush=True)
    write_atomic(args.out / "engine-patch-status.txt", f"$ {' '.join(argv)}\n{text}")
    print(f"engine-patch status exited {proc.returncode}", flush=True)
    return proc.returncode


if __name__ == "__main__":
    sys.exit(main())
