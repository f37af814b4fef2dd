"""Every file the simulator writes replaces a link at its name, never writes through it: a
report folder holding ``report.md -> ~/.bashrc`` (planted, or left by another user in a shared
folder) must leave ``~/.bashrc`` as it was."""

from __future__ import annotations

from pathlib import Path

from _cli import run
from test_calibrate import measurement_file
from test_cli_inputs import small

from attn_core.core.files import write_atomic
from attn_sim import config, report
from attn_sim.cli import main

SAMPLE = Path(__file__).parent / "data" / "device_facts_sample.json"
PRECIOUS = "the victim's own bytes\n"


def plant(folder: Path, *names: str) -> Path:
    """``folder/name -> victim`` for each name; the victim file."""
    folder.mkdir(parents=True, exist_ok=True)
    victim = folder.parent / f"victim-of-{folder.name}"
    victim.write_text(PRECIOUS)
    for name in names:
        (folder / name).symlink_to(victim)
    return victim


def assert_replaced(folder: Path, victim: Path, *names: str) -> None:
    assert victim.read_text() == PRECIOUS
    for name in names:
        path = folder / name
        assert path.is_file() and not path.is_symlink(), name
        assert path.read_bytes() != PRECIOUS.encode(), name


def test_gates_outputs(tmp_path):
    gates = small(tmp_path)
    out = tmp_path / "out"
    victim = plant(out, "gates.json", "gates.txt")
    r = run("gates", "--gates", str(gates), "--out", str(out))
    assert r.code in (0, 1), r.err
    assert_replaced(out, victim, "gates.json", "gates.txt")


def test_report_files(tmp_path, monkeypatch):
    monkeypatch.setattr(report, "markdown", lambda rep: "# report\n")
    monkeypatch.setattr(report, "plot", lambda rep, path: write_atomic(path, b"png"))
    out = tmp_path / "report"
    victim = plant(out, "report.md", "report.json", "report.png")
    report.write({"rows": []}, out)
    assert_replaced(out, victim, "report.md", "report.json", "report.png")


def test_profile_from_output(tmp_path):
    out = tmp_path / "profiles"
    victim = plant(out, "lab.json")
    assert main(["profile-from", str(SAMPLE), "--base", "h200", "--name", "h200+lab",
                 "--out", str(out / "lab.json")]) == 0  # fmt: skip
    assert_replaced(out, victim, "lab.json")


def test_calibration_outputs(tmp_path):
    src = measurement_file(tmp_path)
    out = tmp_path / "cal"
    victim = plant(out, "calibration.json", "calibrated_profile.json")
    assert main(["calibrate", str(src), "--profile", "h200", "--out", str(out)]) == 0
    assert_replaced(out, victim, "calibration.json", "calibrated_profile.json")


def test_baseline(tmp_path):
    folder = tmp_path / "base"
    victim = plant(folder, "baseline.json")
    config.save_baseline({"decode": {}}, folder / "baseline.json")
    assert_replaced(folder, victim, "baseline.json")
