"""Issue 18, class 8 (hil): an interpreter that lacks one of the runner's packages gets a
message naming the package and how to install it, and exit 2 (bad environment is bad input),
never a traceback. ``python -S`` is such an interpreter: no site-packages at all."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from hil_helpers import REPO


def run_bare(args: list, tmp_path, entry: list) -> subprocess.CompletedProcess:
    env = {
        "PATH": os.environ.get("PATH", ""),
        "PYTHONPATH": str(REPO / "hil" / "src"),
        "HIL_WHEELS": str(tmp_path),
        "HOME": str(tmp_path),
    }
    return subprocess.run(
        [sys.executable, "-S", *entry, *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=120,
    )


ENTRIES = {
    "python -m hil": ["-m", "hil"],
    "console script": ["-c", "import sys; from hil.cli import main; sys.exit(main())"],
}


@pytest.mark.parametrize("entry", sorted(ENTRIES))
@pytest.mark.parametrize(
    "args",
    [["--list-targets"], ["--dry-run"], ["reset-target", "--all"], ["--target", "cpu-local"]],
)
def test_missing_tabulate_is_named_with_exit_2(tmp_path, entry, args):
    state = ["--state", str(tmp_path / "s.json")]
    proc = run_bare([*args, *state], tmp_path, ENTRIES[entry])
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    assert "tabulate" in proc.stderr and "pip install" in proc.stderr, proc.stderr


def test_a_docker_run_without_the_docker_sdk_names_it(tmp_path):
    """tabulate present, docker absent: planning and local runs work, a docker run is refused
    before it starts."""
    import shutil

    import tabulate

    site = tmp_path / "site"
    src = tabulate.__file__
    if src.endswith("__init__.py"):
        shutil.copytree(os.path.dirname(src), site / "tabulate")
    else:
        site.mkdir()
        shutil.copy(src, site)
    entry = [
        "-c",
        f"import sys; sys.path.append({str(site)!r}); import runpy; "
        "runpy.run_module('hil', run_name='__main__')",
    ]
    base = ["--state", str(tmp_path / "s.json"), "--out", str(tmp_path / "o")]
    proc = run_bare(["--list-targets", *base], tmp_path, entry)
    assert proc.returncode == 0, proc.stderr
    proc = run_bare(["--target", "cpu-local", "--run-id", "r", *base], tmp_path, entry)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "docker" in proc.stderr and "pip install" in proc.stderr, proc.stderr
    assert not (tmp_path / "o" / "r").exists()


@pytest.mark.parametrize("argv0, name", [("/usr/local/bin/hil", "hil"), ("x.py", "python -m hil")])
@pytest.mark.parametrize("argv", [["--help"], ["reset-target", "--help"]])
def test_usage_line_uses_the_name_it_was_started_by(monkeypatch, capsys, argv0, name, argv):
    from hil import cli

    monkeypatch.setattr(sys, "argv", [argv0])
    with pytest.raises(SystemExit):
        cli.main(argv)
    assert capsys.readouterr().out.startswith(f"usage: {name} "), argv0


def test_skip_hint_and_readme_give_the_same_engine_command():
    from hil_helpers import ENGINE_COMMAND

    conftest = (REPO / "hil" / "tests" / "conftest.py").read_text()
    assert "ENGINE_COMMAND" in conftest.split("def _unavailable", 1)[1].split("\n\n")[0]
    for readme in (REPO / "README.md", REPO / "hil" / "README.md"):
        text = readme.read_text()
        assert ENGINE_COMMAND in text, readme
        runs = [line for line in text.splitlines() if "bash .ci/docker-engine.sh" in line]
        assert all(ENGINE_COMMAND in line for line in runs), (readme, runs)
