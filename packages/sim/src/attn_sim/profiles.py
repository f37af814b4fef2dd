"""Device profiles for the simulator: attn-core's built-in ones, or a profile JSON file.

The constants live in :mod:`attn_core.device.spec` (one copy, with provenance) and profile files
are :mod:`attn_core.device.profile_file`'s (``attn-core/profile/1``: validated, every error names
the file and the field); this module only resolves a ``--profile`` argument and writes the files
``attn_sim calibrate`` and ``attn_sim profile-from`` produce. A calibrated file names its base
profile and the fields it replaces::

    {"schema": "attn-core/profile/1", "base": "h200", "name": "h200+calibrated",
     "fields": {"hbm_bandwidth": 3.9e12, "launch_overhead_s": 5.1e-6, ...},
     "provenance": {"hbm_bandwidth": "measured: calibrated from results/decode_bench.json ..."}}

Files written before the schema key existed read the same.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path

from attn_core.device.profile_file import is_profile_path, load_profile_file, save_profile_file
from attn_core.device.spec import DEVICE_SPECS, DeviceSpec, get_device_spec
from attn_sim.workloads import base_name

# Device terms (fitted on CUDA-graph replay times) then the host term (fitted on eager times).
DEVICE_TERMS = ("hbm_bandwidth", "fp16_flops", "fp32_flops", "launch_gap_s")
HOST_TERMS = ("launch_overhead_s",)
CALIBRATABLE = DEVICE_TERMS + HOST_TERMS


def load_profile(name_or_path: str) -> DeviceSpec:
    """A built-in profile by name, or a profile JSON file by path (``ValueError`` naming the
    file and field when it is not one)."""
    if not is_profile_path(name_or_path):
        return get_device_spec(name_or_path)
    spec = load_profile_file(name_or_path)
    if base_name(spec) not in DEVICE_SPECS:
        # the traced code runs under the built-in profile the name starts with (workloads)
        raise ValueError(
            f"profile file {name_or_path}: name must start with a built-in profile and '+' "
            f"(e.g. 'bi-v100+lab'; built-ins {sorted(DEVICE_SPECS)}), got {spec.name!r}"
        )
    return spec


def save_profile(spec: DeviceSpec, base: str, path: Path, provenance: Mapping[str, str]) -> Path:
    """Write ``spec`` as a profile file over ``base``: the fields that differ from it, each with
    ``provenance`` (the new entries) or the provenance ``spec`` already carried."""
    if base not in DEVICE_SPECS:
        raise ValueError(f"base must be one of {sorted(DEVICE_SPECS)}, got {base!r}")
    merged = dataclasses.replace(spec, provenance={**spec.provenance, **provenance})
    return save_profile_file(merged, path, base=base)
