"""``python -m attn_sim`` as a user runs it: a real process, its exit code and its stderr.

The in-process tests (test_cli_inputs.py, test_cli_properties.py) call ``main``; these check
that ``__main__`` passes its code to the shell and that nothing prints a traceback on the way.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

SAMPLE = Path(__file__).parent / "data" / "device_facts_sample.json"


def attn_sim(*argv: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "attn_sim", *argv],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_bad_shape_exits_2_with_one_line(tmp_path):
    p = attn_sim("report", "--shape", "24,0,256", "--out", str(tmp_path), cwd=tmp_path)
    assert p.returncode == 2 and "Traceback" not in p.stderr
    assert "argument --shape" in p.stderr and "num_kv_heads" in p.stderr
    assert p.stdout == "" and not (tmp_path / "report.md").exists()


def test_gates_file_that_is_a_directory_exits_2(tmp_path):
    p = attn_sim("gates", "--gates", str(tmp_path), "--out", "", cwd=tmp_path)
    assert p.returncode == 2 and "Traceback" not in p.stderr
    assert f"gates file {tmp_path} is a directory" in p.stderr


def test_a_measured_profile_file_works_as_profile(tmp_path, monkeypatch):
    from _cli import run

    from attn_sim import profile_from

    monkeypatch.setattr(profile_from, "compare_cases", lambda: [])  # the tables, not the traces
    out = tmp_path / "p.json"
    assert run("profile-from", str(SAMPLE), "--base", "h200", "--out", str(out)).code == 0
    p = attn_sim("occupancy", "--profile", str(out), "--threads", "256", cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    assert "h200+h200-local: 8 blocks/SM" in p.stdout
    assert json.loads(out.read_text())["base"] == "h200"
