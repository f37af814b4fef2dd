"""``python -m attn_core.native`` on hostile ground, with a stand-in compiler: one exit code per
kind of mistake (2: the input, named; 3: no compiler), ``~`` in paths from the environment,
``facts --write`` that never shrinks the records, and a stop (Ctrl-C, SIGTERM) that is prompt,
clean and one line."""

from __future__ import annotations

import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
from test_native_hardening_build import fake_compiler

from attn_core.native import __main__ as cli
from attn_core.native import facts

SRC = Path(__file__).resolve().parents[1] / "src"


@pytest.fixture
def env(monkeypatch, tmp_path):
    """A stand-in nvcc at CUDA_HOME, a cache in tmp_path, no targets forced."""
    for var in ("ATTN_CORE_NATIVE_ARCH", "CUDA_PATH", "ATTN_CORE_NATIVE_LOCK_TIMEOUT"):
        monkeypatch.delenv(var, raising=False)
    fake_compiler(tmp_path / "cuda")
    monkeypatch.setenv("CUDA_HOME", str(tmp_path / "cuda"))
    monkeypatch.setenv("ATTN_CORE_NATIVE_CACHE", str(tmp_path / "cache"))
    return monkeypatch


def test_a_compiler_that_prints_binary_for_its_version_is_no_compiler(env, tmp_path, capsys):
    nvcc = tmp_path / "cuda" / "bin" / "nvcc"
    nvcc.write_text(
        f"#!{sys.executable}\nimport sys\nsys.stdout.buffer.write(b'\\xff\\xfe\\x00\\x81')\n"
    )
    code = cli.main(["build"])
    out, err = capsys.readouterr()
    assert code == 3, out + err
    assert str(nvcc) in out and "Traceback" not in out + err


@pytest.mark.parametrize("how", ["--arch", "ATTN_CORE_NATIVE_ARCH"])
def test_a_target_the_compiler_cannot_build_is_a_usage_error_naming_it(env, capsys, how):
    argv = ["build"]
    if how == "--arch":
        argv += ["--arch", "sm_90,ivcore10"]
    else:
        env.setenv("ATTN_CORE_NATIVE_ARCH", "ivcore10")
    code = cli.main(argv)
    err = capsys.readouterr().err
    assert code == 2, err
    assert how in err and "ivcore10" in err and "nvcc" in err, err


def test_the_loader_says_why_for_a_target_the_compiler_cannot_build(tmp_path) -> None:
    from attn_core.native.toolchain import find_toolchain

    fake_compiler(tmp_path / "cuda")
    toolchain, why = find_toolchain(str(tmp_path / "cuda"), ("ivcore10",))
    assert toolchain is None and "ivcore10" in why


def _read_only_cache(tmp_path: Path) -> list[str]:
    caches = ["/proc/self"]  # refused to root too
    folder = tmp_path / "ro"
    folder.mkdir()
    folder.chmod(stat.S_IRUSR | stat.S_IXUSR)
    if not os.access(folder, os.W_OK):
        caches.append(str(folder))
    return caches


@pytest.mark.parametrize("command", [["build"], ["facts"]])
def test_a_read_only_cache_is_exit_2_naming_the_variable(env, tmp_path, capsys, command):
    for cache in _read_only_cache(tmp_path):
        env.setenv("ATTN_CORE_NATIVE_CACHE", cache)
        code = cli.main(command)
        err = capsys.readouterr().err
        assert code == 2, (cache, err)
        assert "ATTN_CORE_NATIVE_CACHE" in err and cache in err and "Traceback" not in err


@pytest.mark.parametrize("value", ["0", "forever"])
def test_a_bad_lock_limit_is_exit_2_naming_the_variable(env, capsys, value):
    env.setenv("ATTN_CORE_NATIVE_LOCK_TIMEOUT", value)
    assert cli.main(["build", "--arch", "sm_90"]) == 2
    assert "ATTN_CORE_NATIVE_LOCK_TIMEOUT" in capsys.readouterr().err


def test_a_tilde_in_the_cache_and_cuda_home_is_the_home_directory(env, tmp_path, capsys):
    home, work = tmp_path / "home", tmp_path / "work"
    work.mkdir()
    shutil.move(str(tmp_path / "cuda"), str(home / "cuda") if home.mkdir() is None else "")
    env.setenv("HOME", str(home))
    env.setenv("CUDA_HOME", "~/cuda")
    env.setenv("ATTN_CORE_NATIVE_CACHE", "~/c")
    env.chdir(work)
    code = cli.main(["build", "--arch", "sm_90"])
    out, err = capsys.readouterr()
    assert code == 0, out + err
    assert not (work / "~").exists(), "a folder named ~ in the working directory"
    assert list((home / "c").glob("*/libattn_native_g1.so"))


PTXAS = (
    "ptxas info    : Compiling entry function "
    "'_ZN4attn16partition_kernelILi1ELi1ELi64ELi1EEEvv' for 'sm_90'\n"
    "ptxas info    : Used {regs} registers, 128 bytes smem\n"
)


def _ptxas_compiler(tmp_path: Path, regs: int) -> None:
    body = f"print({PTXAS.format(regs=regs)!r})"
    fake_compiler(tmp_path / "cuda", body)


def _facts_copy(tmp_path: Path, monkeypatch, keep: int) -> Path:
    data = json.loads(facts.FACTS_FILE.read_text())
    data["kernels"] = data["kernels"][:keep]
    path = tmp_path / "kernel_facts.json"
    path.write_text(json.dumps(data))
    monkeypatch.setattr(facts, "FACTS_FILE", path)
    return path


@pytest.mark.parametrize("regs", [99999, 40])
def test_facts_write_never_shrinks_or_spoils_the_records(env, tmp_path, capsys, regs):
    """One record (of 99999 registers, or a plausible one) from builds that hold one kernel
    each must not replace the shipped records."""
    _ptxas_compiler(tmp_path, regs)
    path = _facts_copy(tmp_path, env, keep=10**6)  # the shipped records
    before = path.read_bytes()
    code = cli.main(["facts", "--write"])
    out, err = capsys.readouterr()
    assert code == 1, out + err
    assert path.read_bytes() == before
    assert "kernel_facts.json" in err and "Traceback" not in err


@pytest.mark.parametrize("damage", ["library truncated", "log replaced"])
def test_facts_write_reads_only_logs_a_build_record_vouches_for(env, tmp_path, capsys, damage):
    """A cached library truncated (its log intact) is rebuilt, not read as built; a log
    replaced beside an intact library is refused: neither one's 77 registers are recorded."""
    _ptxas_compiler(tmp_path, 40)
    path = _facts_copy(tmp_path, env, keep=0)
    assert cli.main(["build"]) == 0  # the targets facts builds for
    (library,) = (tmp_path / "cache").glob("*/libattn_native_g1.so")
    if damage == "library truncated":
        library.write_bytes(library.read_bytes()[:9])
    library.with_suffix(".log").write_text(PTXAS.format(regs=77))
    capsys.readouterr()
    code = cli.main(["facts", "--write"])
    out, err = capsys.readouterr()
    assert "77" not in path.read_text()
    if damage == "log replaced":
        assert code == 1 and "not the log its build wrote" in err, out + err
    else:
        assert code == 0 and library.stat().st_size > 9, out + err


def test_facts_write_records_a_build_that_adds_to_them(env, tmp_path, capsys):
    _ptxas_compiler(tmp_path, 40)
    path = _facts_copy(tmp_path, env, keep=0)
    code = cli.main(["facts", "--write"])
    out, err = capsys.readouterr()
    assert code == 0, out + err
    kernels = json.loads(path.read_text())["kernels"]
    assert {(k["toolchain"], k["body"]) for k in kernels} == {
        (facts.NVCC, facts.MMA),
        (facts.NVCC, facts.CUDA_CORE),
        (facts.COREX, facts.CUDA_CORE),
    }
    assert {k["registers"] for k in kernels} == {40}


def _sleeping_build(tmp_path: Path) -> tuple[subprocess.Popen, Path]:
    pids = tmp_path / "pids"
    pids.mkdir()
    body = f"open(os.path.join({str(pids)!r}, str(os.getpid())), 'w').close(); time.sleep(60)"
    fake_compiler(tmp_path / "cuda", body)
    environ = {
        **os.environ, "CUDA_HOME": str(tmp_path / "cuda"), "PYTHONPATH": str(SRC),
        "ATTN_CORE_NATIVE_CACHE": str(tmp_path / "cache"), "ATTN_CORE_NATIVE_ARCH": "sm_90",
    }  # fmt: skip
    environ.pop("CUDA_PATH", None)
    proc = subprocess.Popen(
        [sys.executable, "-m", "attn_core.native", "build"], env=environ, text=True,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
    )  # fmt: skip
    deadline = time.monotonic() + 60
    while not list(pids.iterdir()):
        assert time.monotonic() < deadline and proc.poll() is None, "no compiler started"
        time.sleep(0.1)
    return proc, pids


@pytest.mark.parametrize(("sig", "code"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_a_stopped_build_is_prompt_clean_and_one_line(tmp_path: Path, sig, code) -> None:
    proc, pids = _sleeping_build(tmp_path)
    time.sleep(0.5)
    if sig == signal.SIGINT:
        os.killpg(proc.pid, sig)  # what a terminal's Ctrl-C does: the whole foreground group
    else:
        proc.send_signal(sig)
    try:
        out, err = proc.communicate(timeout=20)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"still building 20 s after {sig.name}: {out}{err}")
    assert proc.returncode == code, out + err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    for pid in (int(p.name) for p in pids.iterdir()):
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
    left = [p for p in (tmp_path / "cache").rglob("*") if p.name.startswith(("tmp", "."))]
    assert not left, left
