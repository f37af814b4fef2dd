"""A stand-in for the native libraries, compiled with the host C compiler: their identity
functions only, so loaders and benches can be tested on any machine."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

# Both libraries' identity functions, with the version a macro: the loaders only call these
# before a device is needed (the launch and info entries are declared, never called here).
STAND_IN = """
static const char *name(int code) { return code == 2 ? "out of memory" : "other"; }
int attn_native_abi_version(void) { return NATIVE_VERSION; }
int attn_native_group_slots(void) { return SLOTS; }
const char *attn_native_platform(void) { return "stand-in"; }
const char *attn_native_error_string(int code) { return name(code); }
int attn_native_decode(void *args, void *stream) { return 1; }
int attn_native_kernel_info(int a, int b, int c, int d, int e, void *info) { return 1; }
int attn_prefill_abi_version(void) { return PREFILL_VERSION; }
int attn_prefill_mma(void) { return 1; }
const char *attn_prefill_platform(void) { return "stand-in"; }
const char *attn_prefill_error_string(int code) { return name(code); }
int attn_prefill(void *args, void *stream) { return 1; }
int attn_prefill_config_info(int a, int b, int c, int d, void *info) { return 1; }
"""


def stand_in(tmp_path: Path, native: int, prefill: int, slots: int = 6) -> Path:
    """A library answering ABI versions ``native`` and ``prefill`` and ``slots`` head slots,
    built into ``tmp_path`` (skips without a host C compiler)."""
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        pytest.skip("needs a host C compiler for the stand-in library")
    source, out = tmp_path / "stand_in.c", tmp_path / f"libstand_in_{native}_{prefill}_{slots}.so"
    source.write_text(STAND_IN)
    defines = [f"-DNATIVE_VERSION={native}", f"-DPREFILL_VERSION={prefill}", f"-DSLOTS={slots}"]
    subprocess.run([compiler, "-shared", "-fPIC", *defines, "-o", str(out), str(source)],
                   check=True)  # fmt: skip
    return out
