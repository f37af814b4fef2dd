"""Paths read from the environment expand ``~`` (the shell does not, inside quotes or after
``=``): ``ATTN_CORE_NATIVE_CACHE='~/c'`` was a directory named ``~`` under the working one."""

from __future__ import annotations

import json

from attn_core.core import settings
from attn_core.device.profile_file import load_profile_file


def test_environment_paths_expand_tilde(monkeypatch, tmp_path):
    monkeypatch.setenv("HOME", str(tmp_path))
    env = {
        "ATTN_CORE_NATIVE_CACHE": "~/c",
        "CUDA_HOME": "~/cuda",
        "ATTN_CORE_DEVICE": "~/p.json",
    }
    o = settings.Overrides.from_env(env)
    assert o.native.cache_dir == str(tmp_path / "c")
    assert o.native.cuda_home == str(tmp_path / "cuda")
    assert o.device == str(tmp_path / "p.json")
    fallback = settings.Overrides.from_env({"CUDA_PATH": "~/cp"})
    assert fallback.native.cuda_home == str(tmp_path / "cp")
    assert settings.Overrides.from_env({"ATTN_CORE_DEVICE": "h200"}).device == "h200"


def test_profile_file_path_expands_tilde(monkeypatch, tmp_path):
    monkeypatch.setenv("HOME", str(tmp_path))
    data = {"schema": "attn-core/profile/1", "base": "h200", "name": "h200+t", "fields": {}}
    (tmp_path / "p.json").write_text(json.dumps(data))
    assert load_profile_file("~/p.json").name == "h200+t"


def test_readme_says_tilde_is_expanded():
    table = settings.env_var_table()
    for name in ("ATTN_CORE_NATIVE_CACHE", "CUDA_HOME", "ATTN_CORE_DEVICE"):
        row = next(line for line in table.splitlines() if f"`{name}`" in line)
        assert "~ expanded" in row, row
