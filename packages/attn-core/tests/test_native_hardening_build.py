"""The build cache on hostile ground (no GPU, a stand-in compiler): a build output is complete or
absent, no write follows a link, a cache hit is one the build record vouches for, and a lock
held by a stopped process ends in a named error instead of a silent wait."""

from __future__ import annotations

import fcntl
import json
import os
import stat
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from attn_core.native import build
from attn_core.native.family import DECODE
from attn_core.native.toolchain import Toolchain

LIBRARY = DECODE.library_name("g1")


def fake_compiler(folder: Path, body: str = "") -> Path:
    """An ``nvcc`` stand-in: answers ``--version``, runs ``body`` (Python, with ``out`` the
    ``-o`` path), then writes ``out`` unless ``body`` exited."""
    path = folder / "bin" / "nvcc"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        f"#!{sys.executable}\nimport os, sys, time\n"
        "if '--version' in sys.argv:\n    print('Cuda compilation tools, release 99.0')\n"
        "    sys.exit(0)\n"
        "out = sys.argv[sys.argv.index('-o') + 1]\n"
        f"{body}\n"
        "macros = ' '.join(a for a in sys.argv if a.startswith('-D'))\n"
        "open(out, 'wb').write(b'\\x7fELF library ' + macros.encode())\n"
        "print('ptxas info    : Used 40 registers')\n"
    )
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    (folder / "nvvm").mkdir(exist_ok=True)
    return path


def fake_toolchain(folder: Path, body: str = "") -> Toolchain:
    nvcc = fake_compiler(folder, body)
    return Toolchain("nvcc", str(nvcc), str(folder), ("sm_90",), "release 99.0")


def _build(tc: Toolchain, out: Path) -> tuple[Path, float]:
    return build.build_variant(tc, out, DECODE, "g1")


def test_no_lock_file_or_temporary_folder_outlives_a_build(tmp_path: Path) -> None:
    out = tmp_path / "out"
    path, _ = _build(fake_toolchain(tmp_path / "cuda"), out)
    assert path.is_file()
    left = [p.name for p in out.iterdir() if p.name.endswith(".lock") or p.name.startswith("tmp")]
    assert not left, left


def test_a_failed_build_leaves_no_library_lock_or_temporary_folder(tmp_path: Path) -> None:
    """The compiler wrote half a library and died: nothing of it stays."""
    body = "open(out, 'wb').write(b'\\x7fELF hal'); sys.exit(1)"
    out = tmp_path / "out"
    with pytest.raises(build.BuildError):
        _build(fake_toolchain(tmp_path / "cuda", body), out)
    assert sorted(p.name for p in out.iterdir() if not p.name.endswith(".log")) == []


def test_a_symlinked_lock_is_never_written_through(tmp_path: Path) -> None:
    precious = tmp_path / "precious.txt"
    precious.write_text("the user's file\n")
    out = tmp_path / "out"
    out.mkdir()
    (out / f".{LIBRARY}.lock").symlink_to(precious)
    path, _ = _build(fake_toolchain(tmp_path / "cuda"), out)
    assert path.is_file()
    assert precious.read_text() == "the user's file\n"


def test_a_symlinked_log_or_record_is_never_written_through(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    victims = []
    for i, link in enumerate((build.log_path(out / LIBRARY), out / (LIBRARY + ".json"))):
        victim = tmp_path / f"victim{i}.txt"
        victim.write_text("the user's file\n")
        link.symlink_to(victim)
        victims.append(victim)
    _build(fake_toolchain(tmp_path / "cuda"), out)
    for victim in victims:
        assert victim.read_text() == "the user's file\n"
    assert not build.log_path(out / LIBRARY).is_symlink()
    assert "nvcc" in build.log_path(out / LIBRARY).read_text()


@pytest.mark.parametrize("damage", ["truncated", "emptied", "unrecorded", "other key"])
def test_a_damaged_cached_library_is_rebuilt_not_served(tmp_path: Path, damage: str) -> None:
    tc = fake_toolchain(tmp_path / "cuda")
    out = tmp_path / "out"
    path, _ = _build(tc, out)
    whole = path.read_bytes()
    record = out / (LIBRARY + ".json")
    if damage == "truncated":
        path.write_bytes(whole[:10])
    elif damage == "emptied":
        path.write_bytes(b"")
    elif damage == "unrecorded":
        record.unlink()
    else:
        data = json.loads(record.read_text())
        data["key"] = "0" * len(data["key"])
        record.write_text(json.dumps(data))
    assert build.cached_damage(tc, path, DECODE, "g1")
    rebuilt, seconds = _build(tc, out)
    assert seconds > 0, "a damaged library was reported as a cached build"
    assert rebuilt.read_bytes() == whole
    assert build.cached_damage(tc, rebuilt, DECODE, "g1") == ""


def test_the_loader_refuses_a_damaged_cache_when_it_may_not_build(tmp_path: Path) -> None:
    from attn_core.core.settings import NativeSettings
    from attn_core.native import loader
    from attn_core.native.decode import DecodeLibrary

    home = tmp_path / "cuda"
    fake_compiler(home)
    cache = tmp_path / "cache"
    settings = NativeSettings(cuda_home=str(home), cache_dir=str(cache), build=True, arch="sm_90")
    tc, _ = loader.find_toolchain(str(home), ("sm_90",))
    path, _ = build.build_variant(tc, cache / build.family_key(tc, DECODE), DECODE, "g1")
    path.write_bytes(path.read_bytes()[:7])
    off = replace(settings, build=False)
    lib, status = loader._locate(DecodeLibrary, "g1", off, "sm_90", None)
    assert lib is None
    assert "cached build is damaged" in status.detail, status.detail


def _hold(lock: Path, pid: int):
    handle = open(lock, "a+")
    fcntl.flock(handle, fcntl.LOCK_EX)
    handle.truncate(0)
    handle.write(f"{pid}\n")
    handle.flush()
    return handle


def test_a_held_lock_names_its_holder_and_gives_up_after_the_limit(
    tmp_path: Path, monkeypatch, capfd
) -> None:
    out = tmp_path / "out"
    out.mkdir()
    monkeypatch.setenv("ATTN_CORE_NATIVE_LOCK_TIMEOUT", "1")
    holder = _hold(out / f".{LIBRARY}.lock", 424242)
    try:
        with pytest.raises(build.BuildLockTimeout) as raised:
            _build(fake_toolchain(tmp_path / "cuda"), out)
    finally:
        holder.close()
    message = str(raised.value)
    assert "424242" in message and "ATTN_CORE_NATIVE_LOCK_TIMEOUT" in message, message
    assert "424242" in capfd.readouterr().err  # said while waiting, not only at the end


@pytest.mark.parametrize("value", ["0", "-3", "soon", "nan"])
def test_a_bad_lock_limit_is_refused_naming_the_variable(monkeypatch, value: str) -> None:
    monkeypatch.setenv("ATTN_CORE_NATIVE_LOCK_TIMEOUT", value)
    with pytest.raises(ValueError, match="ATTN_CORE_NATIVE_LOCK_TIMEOUT"):
        build.lock_timeout()


def test_a_build_record_is_written_beside_each_library(tmp_path: Path) -> None:
    tc = fake_toolchain(tmp_path / "cuda")
    path, _ = _build(tc, tmp_path / "out")
    data = json.loads((path.parent / (path.name + ".json")).read_text())
    assert data["size"] == path.stat().st_size
    assert set(data) >= {"key", "size", "sha256"}
    assert os.path.getsize(path) > 0


def test_records_and_logs_are_readable_by_every_user(tmp_path: Path) -> None:
    """A root install's prebuilt libraries are loaded by the serving user, who must read the
    record that vouches for them."""
    path, _ = _build(fake_toolchain(tmp_path / "cuda"), tmp_path / "out")
    for written in (build.record_path(path), build.log_path(path)):
        assert written.stat().st_mode & 0o044 == 0o044, oct(written.stat().st_mode)


def test_concurrent_builders_of_one_library_compile_it_once(tmp_path: Path) -> None:
    """The lock file is removed after each build: a waiter holding the removed file must not
    build beside a newcomer that locked a new one."""
    from concurrent.futures import ThreadPoolExecutor

    count = tmp_path / "compiles"
    count.mkdir()
    body = f"open(os.path.join({str(count)!r}, str(os.getpid())), 'w').close(); time.sleep(0.5)"
    tc = fake_toolchain(tmp_path / "cuda", body)
    with ThreadPoolExecutor(max_workers=4) as pool:
        results = list(pool.map(lambda _: _build(tc, tmp_path / "out"), range(4)))
    assert len(list(count.iterdir())) == 1
    assert sorted(seconds > 0 for _, seconds in results) == [False, False, False, True]
    assert not list((tmp_path / "out").glob(".*.lock"))


def test_a_damaged_prebuilt_library_is_not_loaded(tmp_path: Path, monkeypatch) -> None:
    from attn_core.core.settings import NativeSettings
    from attn_core.native import loader
    from attn_core.native.decode import DecodeLibrary

    prebuilt = tmp_path / "_prebuilt"
    path, _ = _build(fake_toolchain(tmp_path / "cuda"), prebuilt)
    path.write_bytes(path.read_bytes()[:7])
    monkeypatch.setattr(loader, "PREBUILT", prebuilt)
    settings = NativeSettings(
        cuda_home=str(tmp_path / "cuda"), cache_dir=str(tmp_path / "c"), build=False
    )
    lib, status = loader._locate(DecodeLibrary, "g1", settings, "sm_90", None)
    assert lib is None, status
    assert f"prebuilt {path}: damaged" in status.detail, status.detail


def test_a_tilde_in_the_loader_s_cache_is_the_home_directory(tmp_path: Path, monkeypatch) -> None:
    from attn_core.native import loader

    monkeypatch.setenv("HOME", str(tmp_path))
    assert loader.cache_root("~/c") == tmp_path / "c"
