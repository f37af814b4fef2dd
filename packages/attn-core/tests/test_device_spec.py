"""Device profiles: every constant has provenance, selection follows ATTN_CORE_DEVICE."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from attn_core import DEVICE_SPECS, DeviceSpec, detect_device_spec, get_device_spec
from attn_core.device.spec import opted_in

NUMERIC_FIELDS = [
    f.name for f in dataclasses.fields(DeviceSpec) if f.name not in ("name", "provenance")
]


@pytest.mark.parametrize("name", sorted(DEVICE_SPECS))
def test_every_constant_has_provenance(name: str) -> None:
    spec = get_device_spec(name)
    for field in NUMERIC_FIELDS:
        prov = spec.provenance.get(field, "")
        assert prov.split(":")[0] in ("datasheet", "measured", "assumed", "override"), (
            f"{name}.{field}: {prov!r}"
        )
        assert getattr(spec, field) >= 0, f"{name}.{field}"


def test_bi_v100_is_what_the_design_says() -> None:
    spec = get_device_spec("bi-v100")
    assert (spec.sm_count, spec.warp_size) == (16, 64)
    assert spec.shared_mem_per_block == 32 * 1024
    assert get_device_spec("bi-v100-smem48k").shared_mem_per_block == 48 * 1024
    assert spec.max_warps_per_sm == spec.max_threads_per_sm // 64


def test_with_overrides_marks_provenance() -> None:
    spec = get_device_spec("h200").with_overrides(sm_count=100)
    assert spec.sm_count == 100 and spec.provenance["sm_count"] == "override"
    assert get_device_spec("h200").sm_count == 132  # the profile itself is untouched


def test_unknown_profile_lists_known_ones() -> None:
    with pytest.raises(ValueError, match=r"device profile must be one of \[.*'h200'.*\], got 'x'"):
        get_device_spec("x")


def test_detection() -> None:
    assert detect_device_spec(torch.device("cpu"), forced=None).name == "bi-v100"
    assert detect_device_spec(torch.device("cpu"), forced="a100").name == "a100"
    with pytest.raises(ValueError, match="device profile must be one of"):
        detect_device_spec(forced="nope")


def test_forced_profile_file(tmp_path) -> None:
    """ATTN_CORE_DEVICE may name a profile JSON file (settings documents it)."""
    from attn_core.device.profile_file import save_profile_file

    path = save_profile_file(
        get_device_spec("h200").with_overrides(name="h200-lab", sm_count=100),
        tmp_path / "lab.json",
        base="h200",
    )
    spec = detect_device_spec(forced=str(path))
    assert spec.name == "h200-lab" and spec.sm_count == 100


def test_profiles_are_hashable_for_plan_caches() -> None:
    assert len({get_device_spec(n) for n in DEVICE_SPECS}) == len(DEVICE_SPECS)


def test_an_opted_in_kernel_sees_the_opt_in_budget():
    h200, bi = get_device_spec("h200"), get_device_spec("bi-v100")
    assert opted_in(h200).shared_mem_per_block == 227 * 1024 > h200.shared_mem_per_block
    assert opted_in(h200).shared_mem_per_sm == h200.shared_mem_per_sm  # nothing else moves
    assert opted_in(bi) is bi  # no opt-in on the vendor stack: the 32 KiB budget stands
