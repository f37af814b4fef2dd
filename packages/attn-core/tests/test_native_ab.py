"""bench/native_ab.py on the CPU: rows of any GQA group, each build's library for a row's group
out of a directory of builds, and a build that cannot serve a row named before anything runs
(stand-in libraries from the host C compiler)."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest
from bench_modules import bench_module
from native_stand_in import stand_in

from attn_core.native.family import DECODE, PREFILL


@pytest.fixture(scope="module")
def native_ab():
    return bench_module("native_ab")


def test_shapes_of_any_group_parse(native_ab) -> None:
    rows = native_ab.any_group_shapes("16/4/1x102400,32/4/8x32768:fp8_e4m3,6/1/1x8")
    assert rows == (
        (16, 4, 1, 102400, "auto"), (32, 4, 8, 32768, "fp8_e4m3"), (6, 1, 1, 8, "auto"),
    )  # fmt: skip
    for bad in ("7/2/1x8", "2/4/1x8", "16/0/1x8", "16/4/0x8", "16/4/1x8:fp4"):
        with pytest.raises(argparse.ArgumentTypeError, match=bad.split(":")[0]):
            native_ab.any_group_shapes(bad)


def test_the_decode_bench_keeps_qwens_group(native_ab) -> None:
    # native_decode_bench.py loads one library (group 6): its own --shapes still refuse others
    with pytest.raises(argparse.ArgumentTypeError, match="not a group of 6"):
        native_ab.parse_shapes("16/4/1x8192")
    assert native_ab.parse_shapes("12/2/1x8192") == ((12, 2, 1, 8192, "auto"),)


def test_a_directory_build_gives_each_group_its_slot_count(native_ab, tmp_path: Path) -> None:
    assert native_ab.library_path(tmp_path, 4) == tmp_path / "libattn_native_g4.so"
    assert native_ab.library_path(tmp_path, 12) == tmp_path / "libattn_native_g6.so"  # 2 x 6
    assert native_ab.library_path(tmp_path, 9) == tmp_path / "libattn_native_g5.so"  # 5 + 4
    lib = tmp_path / "one.so"
    assert native_ab.library_path(lib, 4) == lib  # a file is used as it is


def test_libraries_load_once_per_build_and_group(native_ab, tmp_path: Path) -> None:
    for slots in (4, 6):
        built = stand_in(tmp_path, DECODE.abi_version, PREFILL.abi_version, slots)
        built.rename(tmp_path / f"libattn_native_g{slots}.so")
    specs = native_ab.any_group_shapes("16/4/1x8,24/4/1x8,12/2/2x8,8/2/1x8")
    libs = native_ab.load_libraries([("a", tmp_path), ("b", tmp_path)], specs)
    assert sorted(libs) == [("a", 4), ("a", 6), ("b", 4), ("b", 6)]
    assert {key: lib.slots for key, lib in libs.items()} == {
        ("a", 4): 4, ("a", 6): 6, ("b", 4): 4, ("b", 6): 6,
    }  # fmt: skip


def test_a_build_that_cannot_serve_a_row_is_named(native_ab, tmp_path: Path) -> None:
    six = stand_in(tmp_path, DECODE.abi_version, PREFILL.abi_version, 6)
    specs = native_ab.any_group_shapes("16/4/1x8")
    with pytest.raises(ValueError, match=r"build old: .* serves 6 head slots, 16/4 heads need 4"):
        native_ab.load_libraries([("old", six)], specs)
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ValueError, match=r"build new: no library .*libattn_native_g4.so for 16/4"):
        native_ab.load_libraries([("new", empty)], specs)


def test_a_file_that_is_not_a_library_is_named(native_ab, tmp_path: Path) -> None:
    text = tmp_path / "libattn_native_g4.so"
    text.write_text("not a library")
    specs = native_ab.any_group_shapes("16/4/1x8")
    with pytest.raises(ValueError, match=r"build old: .*libattn_native_g4.so does not load"):
        native_ab.load_libraries([("old", tmp_path)], specs)


@pytest.mark.parametrize("rounds", ["0", "-3", "nine", "1.5"])
def test_rounds_below_one_or_not_whole_are_usage_errors(native_ab, rounds, capsys) -> None:
    with pytest.raises(SystemExit) as stopped:
        native_ab.main(["a=x.so", "b=y.so", "--rounds", rounds])
    assert stopped.value.code == 2
    assert "--rounds" in capsys.readouterr().err


def test_the_body_flag_names_attn_cores_bodies(native_ab, capsys) -> None:
    """--body picks the split of a portable library's body; it takes attn-core's own names,
    and anything else is a usage error before a device is needed."""
    from attn_core.native.facts import CUDA_CORE, MMA

    assert set(native_ab.BODIES) == {CUDA_CORE, MMA}
    with pytest.raises(SystemExit) as stopped:
        native_ab.main(["a=x.so", "b=y.so", "--body", "wmma"])
    assert stopped.value.code == 2
    assert "--body" in capsys.readouterr().err


def test_a_row_is_split_for_the_body_asked(native_ab) -> None:
    """plan_split gives the plan's split, or a forced body's; a body the row's dtype has no
    kernel for is a ValueError (main turns it into a usage error before timing anything)."""
    import torch

    from attn_core.device.spec import get_device_spec

    h200 = get_device_spec("h200")
    row = (24, 4, 1, 102400, "auto")
    assert native_ab.plan_split(row, torch.float16, spec=h200)[0] == 33  # the matrix-unit split
    assert native_ab.plan_split(row, torch.float16, "cuda_core", spec=h200)[0] == 160
    with pytest.raises(ValueError, match="no recorded kernel"):
        native_ab.plan_split(row, torch.float32, "mma", spec=h200)


def test_facts_files_name_a_build_and_a_file(native_ab, tmp_path: Path) -> None:
    facts = tmp_path / "kernel_facts.json"
    facts.write_text("{}")
    assert native_ab.parse_facts_files([f"new={facts}"], ["old", "new"]) == {"new": facts}
    for bad, match in (
        ("new", "expected NAME=FILE"),
        (f"other={facts}", "no build named 'other'"),
        (f"new={tmp_path / 'missing.json'}", "no file"),
    ):
        with pytest.raises(argparse.ArgumentTypeError, match=match):
            native_ab.parse_facts_files([bad], ["old", "new"])


def test_a_build_with_its_own_facts_runs_at_its_own_split(native_ab, tmp_path: Path) -> None:
    """--facts: the build whose facts record twice the registers (half the resident blocks on
    the H200) gets fewer partitions; the other keeps the shipped split. A file that is not a
    facts file is named."""
    import json

    import torch

    from attn_core.device.spec import get_device_spec
    from attn_core.native import facts

    data = json.loads(facts.FACTS_FILE.read_text())
    for record in data["kernels"]:
        record["registers"] = min(255, 2 * record["registers"])
    heavy = tmp_path / "heavy.json"
    heavy.write_text(json.dumps(data))
    h200 = get_device_spec("h200")
    rows = native_ab.any_group_shapes("12/4/1x102400")
    args = (rows, torch.float32, "cuda_core", ["main", "S"])
    (split,) = native_ab.build_splits(*args, {"S": heavy}, spec=h200)
    assert split["main"] == native_ab.plan_split(rows[0], torch.float32, "cuda_core", h200)
    assert split["S"][0] < split["main"][0]
    (shipped,) = native_ab.build_splits(*args, {}, spec=h200)  # and no file left in force
    assert shipped["S"] == shipped["main"] == split["main"]
    junk = tmp_path / "junk.json"
    junk.write_text("[1, 2]")
    with pytest.raises(ValueError, match="junk.json is not a kernel facts file"):
        native_ab.build_splits(*args, {"S": junk}, spec=h200)
