"""The live-log pump is linear in bytes: output without newlines is written through to the
log whole, and only a bounded head of one line is kept for the terminal."""

from __future__ import annotations

import io

from hil.logs import MAX_LINE_KEPT, Console, LogPump

MB = 1 << 20


def pump(chunks, tmp_path):
    stream = io.StringIO()
    p = LogPump(iter(chunks), tmp_path / "log.txt", Console(stream), "t/s")
    p.start()
    p.join(20.0)  # the quadratic pump took minutes here: a timely join is the test
    assert not p.is_alive(), "the log pump did not finish 20 MB in 20 s"
    assert p.error is None
    return stream.getvalue(), tmp_path / "log.txt"


def test_20_mb_without_a_newline_is_linear_and_written_whole(tmp_path):
    chunks = [b"x" * 4096] * (20 * MB // 4096) + [b"\nend\n"]
    shown, log = pump(chunks, tmp_path)
    assert log.stat().st_size == 20 * MB + 5
    lines = shown.splitlines()
    assert lines[-1] == "[t/s] end"
    assert len(lines) == 2 and len(lines[0]) < MAX_LINE_KEPT + 200
    assert f"{20 * MB - MAX_LINE_KEPT} more bytes in" in lines[0]


def test_lines_split_across_chunks_are_joined(tmp_path):
    shown, log = pump([b"ab", b"c\nd", b"e\n\nf"], tmp_path)
    assert shown.splitlines() == ["[t/s] abc", "[t/s] de", "[t/s] ", "[t/s] f"]
    assert log.read_bytes() == b"abc\nde\n\nf"
