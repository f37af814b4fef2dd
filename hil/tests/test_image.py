"""The image tag is a content hash: stable for an unchanged tree, new for any change."""

from __future__ import annotations

import io
import shutil
import tarfile
from pathlib import Path

import pytest

from hil.image import content_tag, context_files, context_tar, packages_of

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def tree(tmp_path):
    """A minimal repo: the Dockerfile, the status check and three tiny packages."""
    (tmp_path / "hil" / "docker").mkdir(parents=True)
    for name in ("Dockerfile", "status-check.sh"):
        shutil.copy(REPO / "hil" / "docker" / name, tmp_path / "hil" / "docker" / name)
    for pkg in ("attn-core", "engine-patch", "sim"):
        src = tmp_path / "packages" / pkg / "src" / pkg.replace("-", "_")
        src.mkdir(parents=True)
        (src / "__init__.py").write_text(f"NAME = {pkg!r}\n")
        (tmp_path / "packages" / pkg / "pyproject.toml").write_text("[project]\n")
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    (wheels / "tabulate-0.9-py3-none-any.whl").write_bytes(b"w" * 10)
    return tmp_path


def tag(tree: Path, args=None) -> str:
    args = args or {"BASE_IMAGE": "base:1"}
    files = context_files(
        tree, tree / "hil/docker/Dockerfile", str(tree / "wheels"), packages_of(args)
    )
    return content_tag(files, args)


def test_tag_is_stable_and_ignores_bytecode(tree):
    first = tag(tree)
    cache = tree / "packages/attn-core/src/attn_core/__pycache__"
    cache.mkdir()
    (cache / "x.cpython-311.pyc").write_bytes(b"junk")
    assert tag(tree) == first and first.startswith("bi100-hil:")


@pytest.mark.parametrize(
    "change",
    [
        lambda t: (t / "packages/sim/src/sim/__init__.py").write_text("NAME = 'changed'\n"),
        lambda t: (t / "hil/docker/Dockerfile").write_text("FROM scratch\n"),
        lambda t: (t / "wheels/torch-2.1-cp310-none-any.whl").write_bytes(b"t"),
        lambda t: (t / "packages/engine-patch/src/engine_patch/new.py").write_text("x = 1\n"),
    ],
)
def test_any_change_makes_a_new_tag(tree, change):
    before = tag(tree)
    change(tree)
    assert tag(tree) != before


def test_build_args_and_packages_are_part_of_the_tag(tree):
    assert tag(tree, {"BASE_IMAGE": "a"}) != tag(tree, {"BASE_IMAGE": "b"})
    light = {"BASE_IMAGE": "a", "PACKAGES": ""}
    before = tag(tree, light)
    (tree / "packages/sim/src/sim/__init__.py").write_text("NAME = 'changed'\n")
    assert tag(tree, light) == before  # an image without packages does not depend on them


def test_context_tar_has_the_directories_copy_needs(tree):
    files = context_files(tree, tree / "hil/docker/Dockerfile", "", ())
    names = tarfile.open(fileobj=io.BytesIO(context_tar(files).read())).getnames()
    assert {"Dockerfile", "status-check.sh", "wheels", "packages"} <= set(names)
