"""Issue 18, class 8 (native CLI): ``facts`` reads the logs of the build it just made (not of
another build key); a bad ``ATTN_CORE_NATIVE_CACHE`` is exit 2 naming the variable, before
any compiler runs; ``--arch ''`` is refused instead of building every target; the help text
lists the subcommands there are."""

from __future__ import annotations

import re

import pytest

from attn_core.native import __main__ as cli
from attn_core.native import facts
from attn_core.native.build import SLOTS, library_name, log_path
from attn_core.native.toolchain import find_toolchain


def no_build(*args, **kwargs):
    raise AssertionError("a build started")


@pytest.fixture
def clean_env(monkeypatch):
    for var in ("ATTN_CORE_NATIVE_ARCH", "ATTN_CORE_NATIVE_CACHE"):
        monkeypatch.delenv(var, raising=False)
    return monkeypatch


@pytest.mark.parametrize("arch", ["", " ", ",", " , "])
def test_an_empty_arch_is_refused(clean_env, capsys, arch):
    clean_env.setattr(cli, "build_all", no_build)
    assert cli.main(["build", "--arch", arch]) == 2
    assert "--arch" in capsys.readouterr().err


@pytest.mark.parametrize("kind", ["file", "under a file"])
@pytest.mark.parametrize("command", [["build"], ["build", "--arch", "sm_90"], ["facts"]])
def test_a_cache_that_cannot_be_a_directory_is_exit_2_naming_the_variable(
    clean_env, tmp_path, capsys, kind, command
):
    blocker = tmp_path / "blocker"
    blocker.write_text("")
    clean_env.setenv("ATTN_CORE_NATIVE_CACHE", str(blocker if kind == "file" else blocker / "c"))
    clean_env.setattr(cli, "build_all", no_build)
    assert cli.main(command) == 2
    err = capsys.readouterr().err
    assert "ATTN_CORE_NATIVE_CACHE" in err and str(blocker) in err and "Traceback" not in err


@pytest.mark.parametrize("arch_env", [None, "sm_80", "sm_80,sm_90"])
def test_facts_reads_the_logs_of_the_build_it_made(clean_env, tmp_path, capsys, arch_env):
    if arch_env:
        clean_env.setenv("ATTN_CORE_NATIVE_ARCH", arch_env)
    wanted = tuple(arch_env.split(",")) if arch_env else None
    if find_toolchain(None, wanted)[0] is None:
        pytest.skip("no CUDA compiler on this machine")
    clean_env.setenv("ATTN_CORE_NATIVE_CACHE", str(tmp_path / "cache"))
    built = []

    def fake_build(toolchain, out_dir, *, defines=()):  # what build_all leaves: a log per library
        out_dir.mkdir(parents=True, exist_ok=True)
        for n in SLOTS:
            log_path(out_dir / library_name(n)).write_text("")
        built.append((out_dir, defines))
        return 0.1

    clean_env.setattr(cli, "build_all", fake_build)
    clean_env.setattr(facts, "COREX_DEFINES", facts.PORTABLE_DEFINES)
    code = cli.main(["facts"])
    err = capsys.readouterr().err
    assert code == 0, err
    # the default build, then the portable one (every kernel on the CUDA-core body) beside it;
    # CoreX's stand-in is that build while their flags agree
    (default, none), (portable, defines) = built
    assert none == () and defines == facts.PORTABLE_DEFINES
    assert portable.parent == default.parent and portable.name.startswith(default.name)
    # flags that differ (an nvcc-only one in the portable build): a third build for CoreX
    built.clear()
    clean_env.setattr(facts, "COREX_DEFINES", (*facts.PORTABLE_DEFINES, "ATTN_NVCC_ONLY=0"))
    assert cli.main(["facts"]) == 0, capsys.readouterr().err
    assert [d for _, d in built] == [(), facts.PORTABLE_DEFINES, facts.COREX_DEFINES]
    assert built[2][0].name.endswith("-corex")


def test_facts_with_missing_logs_is_a_failed_build_not_a_traceback(clean_env, tmp_path, capsys):
    if find_toolchain(None, None)[0] is None:
        pytest.skip("no CUDA compiler on this machine")
    clean_env.setenv("ATTN_CORE_NATIVE_CACHE", str(tmp_path / "cache"))
    clean_env.setattr(cli, "build_all", lambda toolchain, out_dir, **kw: 0.1)  # leaves no logs
    assert cli.main(["facts"]) == 1
    assert "log" in capsys.readouterr().err


def test_help_lists_the_subcommands_it_has(capsys):
    assert cli.main(["--help"]) == 0
    out = capsys.readouterr().out
    listed = re.findall(r"\{([a-z,]+)\}", out)
    assert listed and all(set(x.split(",")) == {"status", "build", "facts"} for x in listed), out
