"""An interrupted install leaves nothing the next one ships: the libraries in a wheel are the
ones its own build finished, never the partial outputs, locks or temporary folders of another."""

from __future__ import annotations

import shutil
import stat
import sys
from pathlib import Path

from test_native_hardening_package import _copy_package, _wheel


def _fake_nvcc(home: Path) -> Path:
    """An ``nvcc`` that writes its ``-o`` file (and ptxas-like output), in well under a second."""
    nvcc = home / "bin" / "nvcc"
    nvcc.parent.mkdir(parents=True)
    nvcc.write_text(
        f"#!{sys.executable}\nimport sys\n"
        "if '--version' in sys.argv:\n    print('Cuda compilation tools, release 99.0')\n"
        "    sys.exit(0)\n"
        "out = sys.argv[sys.argv.index('-o') + 1]\n"
        "open(out, 'wb').write(b'\\x7fELF library ' + ' '.join(sys.argv).encode())\n"
        "print('ptxas info: fake')\n"
    )
    nvcc.chmod(nvcc.stat().st_mode | stat.S_IXUSR)
    (home / "nvvm").mkdir()
    return nvcc


def test_stale_outputs_of_an_interrupted_build_never_reach_the_wheel(tmp_path: Path) -> None:
    """What an interrupted install leaves in build/ (a partial library, a lock, a temporary
    folder) is not copied: the next install ships only libraries it finished itself."""
    root = _copy_package(tmp_path)
    stale = root / "build" / "lib" / "attn_core" / "native" / "_prebuilt"
    (stale / "tmpk3j9x").mkdir(parents=True)
    (stale / "tmpk3j9x" / "libattn_native_g1.so").write_bytes(b"\x7fELF half")
    (stale / "libattn_native_g2.so").write_bytes(b"\x7fELF trunc")
    (stale / ".libattn_native_g2.so.lock").write_text("")
    names = _wheel(root, tmp_path / "off")
    assert not [n for n in names if "_prebuilt" in n], names
    shutil.rmtree(root / "build")  # now a build: the same junk, then a (fake) compiler
    (stale / "tmpk3j9x").mkdir(parents=True)
    (stale / "libattn_native_g2.so").write_bytes(b"\x7fELF trunc")
    (stale / ".libattn_native_g2.so.lock").write_text("")
    _fake_nvcc(tmp_path / "cuda")
    names = _wheel(
        root, tmp_path / "on", ATTN_CORE_NATIVE_BUILD="1", CUDA_HOME=str(tmp_path / "cuda"),
        ATTN_CORE_NATIVE_ARCH="sm_90",
    )  # fmt: skip
    prebuilt = sorted(n.rsplit("/", 1)[1] for n in names if "/_prebuilt/" in n)
    assert "libattn_native_g2.so" in prebuilt
    assert not [n for n in prebuilt if n.startswith((".", "tmp")) or n.endswith(".lock")], prebuilt
    assert not [n for n in names if "/_prebuilt/tmp" in n], names
