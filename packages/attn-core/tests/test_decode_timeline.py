"""bench/decode_timeline.py on the CPU: its stamps still find every anchor in the kernel sources
(a kernel edit that moves one must update the bench, not silently drop a stamp), and a missing
anchor stops it with the file and the anchor named."""

from __future__ import annotations

import subprocess
import sys

import pytest
from bench_modules import bench_module, bench_path

BENCH = bench_path("decode_timeline")


def test_every_stamp_lands_in_the_kernel_sources(tmp_path) -> None:
    done = subprocess.run(
        [sys.executable, BENCH, "--patch-only", str(tmp_path)],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    warp = (tmp_path / "decode_warp.cuh").read_text()
    decode = (tmp_path / "paged_decode.cu").read_text()
    assert [warp.count(f"ATTN_PARTITION_STAMP({i});") for i in range(5)] == [1] * 5
    assert [decode.count(f"ATTN_MERGE_STAMP({i});") for i in range(3)] == [1] * 3
    assert "attn_timeline_stamps" in decode
    # the stamps go where they say: the merge's before and after it waits on the partitions
    wait = decode.index("  wait_for_partitions();  // before any read")
    assert decode.index("ATTN_MERGE_STAMP(0);") < wait < decode.index("ATTN_MERGE_STAMP(1);")


def test_a_missing_anchor_names_its_file(tmp_path, monkeypatch) -> None:
    bench = bench_module("decode_timeline")
    moved = tmp_path / "csrc"
    moved.mkdir()
    for name in ("paged_decode.cu", "decode_warp.cuh"):
        (moved / name).write_text((bench.CSRC / name).read_text())
    text = (moved / "decode_warp.cuh").read_text()
    (moved / "decode_warp.cuh").write_text(text.replace("if (merge_warp) store_state(warp);", ""))
    monkeypatch.setattr(bench, "CSRC", moved)
    with pytest.raises(bench.AnchorMissing, match=r"decode_warp\.cuh: anchor .*store_state"):
        bench.instrument(tmp_path / "out")
