"""Profiles: every constant has a provenance; names resolve; bad names say what exists."""

from __future__ import annotations

import dataclasses

import pytest

from attn_core.device.spec import DEVICE_SPECS, DeviceSpec
from attn_sim.profiles import load_profile

FIELDS = [f.name for f in dataclasses.fields(DeviceSpec) if f.name not in ("name", "provenance")]


@pytest.mark.parametrize("name", sorted(DEVICE_SPECS))
def test_every_constant_has_a_provenance(name):
    spec = DEVICE_SPECS[name]
    for f in FIELDS:
        prov = spec.provenance.get(f, "")
        assert prov.split(":")[0] in ("datasheet", "measured", "assumed", "override"), (f, prov)


def test_required_profiles_and_bi_v100_assumptions():
    assert {"bi-v100", "bi-v100-smem48k", "h200", "a100"} <= set(DEVICE_SPECS)
    bi, bi48 = load_profile("bi-v100"), load_profile("bi-v100-smem48k")
    assert (bi.warp_size, bi.sm_count, bi.shared_mem_per_block) == (64, 16, 32 * 1024)
    assert bi48.shared_mem_per_block == 48 * 1024
    assert bi48.provenance["shared_mem_per_block"].startswith("assumed")
    assert load_profile("h200").sm_count == 132


def test_unknown_profile_lists_the_known_ones():
    with pytest.raises(ValueError, match="bi-v100"):
        load_profile("v100-typo")
