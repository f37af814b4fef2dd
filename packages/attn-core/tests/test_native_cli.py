"""Issue 18, class 8 (native CLI): ``facts`` reads the logs of the build it just made (not of
another build key); a bad ``ATTN_CORE_NATIVE_CACHE`` is exit 2 naming the variable, before
any compiler runs; ``--arch ''`` is refused instead of building every target; the help text
lists the subcommands there are."""

from __future__ import annotations

import hashlib
import json
import re

import pytest

from attn_core.native import __main__ as cli
from attn_core.native import build as build_mod
from attn_core.native import decode, facts
from attn_core.native.build import family_key, log_path
from attn_core.native.family import DECODE
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

    def fake_build(toolchain, families, *, out_dir=None, cache=None, defines=(), **kw):
        # what build_all leaves: a library, its log and the build record vouching for both,
        # each family in its folder
        for family in families:
            folder = out_dir if out_dir is not None else cache / family_key(toolchain, family)
            folder.mkdir(parents=True, exist_ok=True)
            for variant in family.variants_for(toolchain.kind):
                library = folder / family.library_name(variant)
                library.write_bytes(b"library")
                log_path(library).write_text("")
                key = build_mod.library_key(
                    toolchain, build_mod.CSRC / family.source, library.name,
                    (*defines, *family.variants[variant]), flush_denormals=family.flush_denormals,
                )  # fmt: skip
                record = {
                    "key": key, "size": 7, "sha256": hashlib.sha256(b"library").hexdigest(),
                    "log_sha256": hashlib.sha256(b"").hexdigest(),
                }  # fmt: skip
                build_mod.record_path(library).write_text(json.dumps(record))
            if family is DECODE:
                built.append((folder, defines))
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
    clean_env.setattr(cli, "build_all", lambda toolchain, families, **kw: 0.1)  # leaves no logs
    assert cli.main(["facts"]) == 1
    assert "log" in capsys.readouterr().err


def test_help_lists_the_subcommands_it_has(capsys):
    assert cli.main(["--help"]) == 0
    out = capsys.readouterr().out
    listed = re.findall(r"\{([a-z,]+)\}", out)
    assert listed and all(set(x.split(",")) == {"status", "build", "facts"} for x in listed), out


class RecordedLibrary:
    """A library whose kernels report what ``kernel_facts.json`` records for ``chain`` (plus
    ``extra_registers`` on the partition kernel), as ``kernel_info`` does on a device."""

    def __init__(self, chain: str, spec, extra_registers: int = 0) -> None:
        self.chain, self.spec, self.extra = chain, spec, extra_registers

    def kernel_info(self, which, query_kind, cache_kind, bucket, group):
        from attn_core.native.abi import KernelFacts
        from attn_core.native.split import decode_body, group_slots

        q = facts.KINDS[query_kind]
        body = decode_body(self.spec, q, q)
        r = facts.lookup(which, q, q, bucket, group_slots(group), body, self.chain)
        extra = self.extra if which == "partition" else 0
        return KernelFacts(r.registers + extra, r.smem_bytes, 0, r.threads, 1)


def test_status_rows_set_the_driver_beside_the_record_the_plan_reads() -> None:
    """status's table: the H200 reads nvcc's records, a BI-V100 CoreX's stand-in; a kernel the
    driver reports otherwise than its record (CoreX's own registers, say) is marked."""
    from attn_core.device.spec import get_device_spec

    h200, bi = get_device_spec("h200"), get_device_spec("bi-v100")
    rows = decode.kernel_rows(RecordedLibrary(facts.NVCC, h200), 6, h200)
    assert len(rows) == 3 * 3 * 2  # head buckets x dtypes x (partition, merge)
    assert not any(row[-1].endswith(decode.DIFFERS) for row in rows)
    fp16_256 = next(r for r in rows if r[:4] == ("partition", 6, 256, "fp16"))
    mma = facts.lookup("partition", "float16", "float16", 256, 6, facts.MMA, facts.NVCC)
    assert fp16_256[-1] == f"{mma.registers} / {mma.smem_bytes}"  # the matrix-unit body's
    # CoreX's build with 8 more registers a thread than the stand-in: every partition kernel
    rows = decode.kernel_rows(RecordedLibrary(facts.COREX, bi, extra_registers=8), 6, bi)
    marked = [row for row in rows if row[-1].endswith(decode.DIFFERS)]
    assert {row[0] for row in marked} == {"partition"} and len(marked) == 9
    cuda_core = facts.lookup("partition", "float16", "float16", 256, 6, toolchain=facts.COREX)
    assert ("partition", 6, 256, "fp16", cuda_core.registers + 8) == next(
        row[:5] for row in marked if row[2:4] == (256, "fp16")
    )


def test_status_on_a_device_prints_the_table_and_the_differences(monkeypatch, capsys) -> None:
    """The device branch of ``status`` (CI has no GPU: the device, library and check stubbed),
    as a BI-V100 whose CoreX build uses 8 more registers a thread than the stand-in."""
    import torch

    import attn_core
    from attn_core.device.spec import get_device_spec
    from attn_core.native import loader

    bi = get_device_spec("bi-v100")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(attn_core, "detect_device_spec", lambda device: bi)
    monkeypatch.setattr(cli, "_prefill_lines", lambda device: ["prefill: stubbed"])
    found = loader.NativeStatus(True, "stubbed library")
    lib = RecordedLibrary(facts.COREX, bi, extra_registers=8)

    def load(cls, variant, settings, device, **kw):
        assert (cls, variant) == (decode.DecodeLibrary, "g6")
        return lib, found

    monkeypatch.setattr(loader, "load_library", load)
    monkeypatch.setattr(loader, "verify", lambda *args: None)
    assert cli.main(["status", "--groups", "6"]) == 0
    out = capsys.readouterr().out
    assert "recorded (corex): registers / smem" in out
    assert "9 kernels differ from the kernel_facts.json records" in out, out
    # the same device whose build matches the stand-in: said so, nothing marked
    monkeypatch.setattr(
        loader, "load_library", lambda *args, **kw: (RecordedLibrary(facts.COREX, bi), found)
    )
    assert cli.main(["status", "--groups", "6"]) == 0
    out = capsys.readouterr().out
    assert "all 18 kernels match the kernel_facts.json records this device's plans" in out, out
    assert decode.DIFFERS not in out and "kernels differ" not in out
