"""Issue 18, class 5: a profile file (``ATTN_CORE_DEVICE=<file>``, ``--profile FILE``) must
describe a possible GPU: every field within a physical range, and the relations between fields
(warp <= threads per block <= threads per SM, shared memory per block <= per SM, ...) hold.
The error names the file and the field."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from attn_core.device.detect import spec_named
from attn_core.device.profile_file import (
    FIELDS,
    PHYSICAL_RANGES,
    load_profile_file,
    physical_problem,
)
from attn_core.device.spec import DEVICE_SPECS

BAD = [
    ({"warp_size": 4096, "max_threads_per_sm": 64}, "warp_size"),
    ({"max_threads_per_block": 1}, "max_threads_per_block"),
    ({"sm_count": 10**30}, "sm_count"),
    ({"sm_count": 0}, "sm_count"),
    ({"warp_size": 48}, "warp_size"),
    ({"max_threads_per_block": 1000}, "max_threads_per_block"),
    ({"max_threads_per_block": 2048, "max_threads_per_sm": 1024}, "max_threads_per_block"),
    ({"shared_mem_per_block": 256 * 1024, "shared_mem_per_sm": 128 * 1024}, "shared_mem_per_block"),
    ({"hbm_bandwidth": 1e30}, "hbm_bandwidth"),
    ({"hbm_bandwidth": 584.0}, "hbm_bandwidth"),  # GB/s written where B/s belongs
    ({"fp16_flops": 1e-3}, "fp16_flops"),
    ({"launch_overhead_s": 6.0}, "launch_overhead_s"),  # us written where s belongs
    ({"l2_bytes": 64 * 2**30, "memory_bytes": 32 * 2**30}, "l2_bytes"),
    ({"max_registers_per_block": 10**6}, "max_registers_per_block"),
    ({"register_sub_partitions": 64}, "register_sub_partitions"),
    ({"memory_bytes": 10**20}, "memory_bytes"),
    ({"dependent_launch_gap_s": 0.5}, "dependent_launch_gap_s"),  # us written where s belongs
    ({"dependent_launch_gap_s": -5e-7}, "dependent_launch_gap_s"),
]


def write(tmp_path, fields: dict, base: str = "bi-v100"):
    path = tmp_path / "p.json"
    path.write_text(json.dumps({"base": base, "name": f"{base}+x", "fields": fields}))
    return path


@pytest.mark.parametrize("name", sorted(DEVICE_SPECS))
def test_built_in_profiles_are_physical(name):
    assert physical_problem(DEVICE_SPECS[name]) == ""


@pytest.mark.parametrize("fields, field", BAD, ids=[str(f) for f, _ in BAD])
def test_impossible_profiles_are_refused_naming_file_and_field(tmp_path, fields, field):
    path = write(tmp_path, fields)
    for load in (load_profile_file, spec_named):
        with pytest.raises(ValueError) as err:
            load(str(path))
        assert str(path) in str(err.value) and field in str(err.value), str(err.value)
    spec_named.cache_clear()


def test_attn_core_device_variable_refuses_it(tmp_path, monkeypatch):
    from attn_core.device.detect import detect_device_spec

    path = write(tmp_path, {"warp_size": 4096, "max_threads_per_sm": 64})
    monkeypatch.setenv("ATTN_CORE_DEVICE", str(path))
    spec_named.cache_clear()
    with pytest.raises(ValueError, match="warp_size"):
        detect_device_spec(forced=str(path))
    spec_named.cache_clear()


@settings(max_examples=80, deadline=None)
@given(field=st.sampled_from(sorted(PHYSICAL_RANGES)), data=st.data())
def test_any_value_outside_its_range_is_refused(field, data):
    low, high = PHYSICAL_RANGES[field]
    value = data.draw(
        st.floats(min_value=high * 1.01 + 1, max_value=1e300)
        | (st.floats(min_value=1e-300, max_value=low * 0.99) if low > 0 else st.nothing())
    )
    import dataclasses

    kind = type(getattr(DEVICE_SPECS["h200"], field))
    spec = dataclasses.replace(DEVICE_SPECS["h200"], **{field: kind(value)})
    if kind is int and low <= kind(value) <= high:
        return  # rounding brought it back in range
    assert field in physical_problem(spec)


def test_every_field_has_a_range():
    assert set(PHYSICAL_RANGES) == set(FIELDS)


def test_a_negative_gap_names_the_bound_zero_is_allowed(tmp_path):
    """Fields that may be 0 (a device without a programmatic dependent launch) are refused
    below it with ">= 0", not the "> 0" every other field gets."""
    with pytest.raises(ValueError, match="dependent_launch_gap_s must be >= 0, got -5e-07"):
        load_profile_file(write(tmp_path, {"dependent_launch_gap_s": -5e-7}))
    with pytest.raises(ValueError, match="sm_count must be > 0, got 0"):
        load_profile_file(write(tmp_path, {"sm_count": 0}))
    assert (
        load_profile_file(write(tmp_path, {"dependent_launch_gap_s": 0})).dependent_launch_gap_s
        == 0
    )
