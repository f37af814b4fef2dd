"""What travels into a suite's container: the suite runner, tests, and the suite's spec.

Layout (tar members, extracted at ``/`` in a container or under a work directory locally)::

    hil/payload/hil/suites/...            the in-container scripts (run_suite.py, probe.py, ...)
    hil/payload/packages/<pkg>/tests/...  the packages' tests (the image has their code)
    hil/payload/packages/<pkg>/pyproject.toml   for pytest's markers and options
    hil/payload/<extra paths of the suite>
    hil/payload/hil-spec.json             the suite, resolved for run_suite.py
    hil/out/                              where results are written, copied back afterwards
"""

from __future__ import annotations

import io
import json
import tarfile
import time
from collections.abc import Iterable
from dataclasses import asdict
from pathlib import Path, PurePosixPath

from hil.config import Suite
from hil.files import write_atomic

PACKAGES_WITH_TESTS = ("attn-core", "engine-patch")
SKIP_NAMES = {"__pycache__", ".pytest_cache", ".hypothesis", ".ruff_cache"}
PAYLOAD_ROOT = PurePosixPath("hil/payload")
OUT_ROOT = PurePosixPath("hil/out")
SPEC_NAME = "hil-spec.json"
RUNNER = "hil/suites/run_suite.py"


def default_paths(suite: Suite) -> list[str]:
    paths = ["hil/suites"]
    for pkg in PACKAGES_WITH_TESTS:
        paths += [f"packages/{pkg}/tests", f"packages/{pkg}/pyproject.toml"]
    return paths + list(suite.payload)


def iter_files(repo: Path, rel: str) -> Iterable[Path]:
    root = repo / rel
    if root.is_file():
        yield root
        return
    if not root.is_dir():
        return  # a package without tests yet: the step reports it as skipped
    for path in sorted(root.rglob("*")):
        if path.is_file() and not SKIP_NAMES.intersection(path.relative_to(repo).parts):
            if path.suffix not in (".pyc", ".pyo"):
                yield path


def suite_spec(suite: Suite, payload_dir: str, out_dir: str, test_timeout_s: float) -> dict:
    steps = []
    for step in suite.steps:
        d = asdict(step)
        d["pytest"], d["command"] = list(step.pytest), list(step.command)
        steps.append(d)
    return {
        "suite": suite.name,
        "payload": payload_dir,
        "out": out_dir,
        "test_timeout_s": test_timeout_s,
        "steps": steps,
    }


def _add_bytes(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size, info.mtime, info.mode = len(data), int(time.time()), 0o644
    tar.addfile(info, io.BytesIO(data))


def _add_dir(tar: tarfile.TarFile, name: str) -> None:
    info = tarfile.TarInfo(name)
    info.type, info.mode, info.mtime = tarfile.DIRTYPE, 0o777, int(time.time())
    tar.addfile(info)


def build_payload(repo: Path, suite: Suite, spec: dict) -> bytes:
    """The tar archive (bytes) for ``put_archive('/', ...)`` or local extraction."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        _add_dir(tar, "hil")
        _add_dir(tar, str(PAYLOAD_ROOT))
        _add_dir(tar, str(OUT_ROOT))
        for rel in default_paths(suite):
            for path in iter_files(repo, rel):
                name = str(PAYLOAD_ROOT / path.relative_to(repo).as_posix())
                tar.add(path, arcname=name, recursive=False)
        _add_bytes(tar, str(PAYLOAD_ROOT / SPEC_NAME), json.dumps(spec, indent=1).encode())
    return buf.getvalue()


def _through_link(dest: Path, target: Path) -> bool:
    """Whether a folder between ``dest`` and ``target`` is a symlink (a write would leave
    ``dest``)."""
    here = dest
    for part in target.relative_to(dest).parts[:-1]:
        here = here / part
        if here.is_symlink():
            return True
    return False


def extract_safely(tar_stream: io.BufferedIOBase, dest: Path, strip: str) -> list[Path]:
    """Extract regular files under ``strip/`` into ``dest``; refuses absolute or ``..`` paths."""
    written = []
    with tarfile.open(fileobj=tar_stream, mode="r|*") as tar:
        for member in tar:
            parts = PurePosixPath(member.name).parts
            if not member.isfile() or not parts or parts[0] != strip or ".." in parts:
                continue
            rel = PurePosixPath(*parts[1:])
            if not rel.parts:
                continue
            target = dest / rel
            if _through_link(dest, target):
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            src = tar.extractfile(member)
            if src is not None:
                write_atomic(target, src.read())  # replaces a link at the name, never follows it
                written.append(target)
    return written
