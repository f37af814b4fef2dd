"""Platform detection: each sign alone makes Iluvatar; the override wins; bad values name it."""

import pytest

from engine_patch.platform import PLATFORM_ENV, detect_platform


@pytest.fixture(autouse=True)
def no_override(monkeypatch):
    monkeypatch.delenv(PLATFORM_ENV, raising=False)


def test_generic_machine(tmp_path):
    p = detect_platform(device_name="NVIDIA H200", corex_root=str(tmp_path / "none"),
                        torch_build="2.4.0+cu121")  # fmt: skip
    assert not p.is_iluvatar and p.reasons == ()


@pytest.mark.parametrize(
    "name, build, make_root, sign",
    [
        ("Iluvatar BI-V100", "2.1.0", False, "device name"),
        ("cpu", "2.1.0+corex.3.2.1", False, "torch build"),
        ("cpu", "2.1.0", True, "toolkit directory"),
    ],
)
def test_any_sign_is_enough(tmp_path, name, build, make_root, sign):
    root = tmp_path / "corex"
    if make_root:
        root.mkdir()
    p = detect_platform(device_name=name, corex_root=str(root), torch_build=build)
    assert p.is_iluvatar
    assert len(p.reasons) == 1 and p.reasons[0].startswith(sign)


def test_env_override(monkeypatch, tmp_path):
    monkeypatch.setenv(PLATFORM_ENV, "iluvatar")
    p = detect_platform(device_name="cpu", corex_root=str(tmp_path), torch_build="2.13")
    assert p.is_iluvatar and p.reasons == (f"{PLATFORM_ENV}=iluvatar",)
    monkeypatch.setenv(PLATFORM_ENV, "generic")
    assert not detect_platform(device_name="Iluvatar BI-V100").is_iluvatar


def test_bad_override_names_the_variable(monkeypatch):
    monkeypatch.setenv(PLATFORM_ENV, "amd")
    with pytest.raises(
        ValueError, match=f"{PLATFORM_ENV} must be one of iluvatar, generic, got 'amd'"
    ):
        detect_platform()
    monkeypatch.delenv(PLATFORM_ENV)
    with pytest.raises(ValueError, match="override must be one of iluvatar, generic, got 'amd'"):
        detect_platform(override="amd")


def test_detection_never_initialises_cuda(monkeypatch, tmp_path):
    # Plugins load in vLLM's engine before it forks workers; CUDA must stay uninitialised.
    import torch

    def forbidden(*args, **kwargs):
        raise AssertionError("get_device_name initialises CUDA")

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)
    monkeypatch.setattr(torch.cuda, "get_device_name", forbidden)
    p = detect_platform(corex_root=str(tmp_path), torch_build="2.1.0+corex.4.1")
    assert p.is_iluvatar and "not initialised" in p.device_name
