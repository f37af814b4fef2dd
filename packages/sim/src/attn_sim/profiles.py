"""Device profiles for the simulator: attn-core's built-in ones, or a calibrated JSON file.

The constants live in :mod:`attn_core.device_spec` (one copy, with provenance); this module only
resolves a ``--profile`` argument. A calibrated profile file (written by ``attn_sim calibrate``)
names its base profile and the fields it replaces::

    {"base": "h200", "name": "h200+calibrated",
     "fields": {"hbm_bandwidth": 3.9e12, "launch_overhead_s": 5.1e-6, ...},
     "provenance": {"hbm_bandwidth": "measured: calibrated from results/decode_bench.json ..."}}
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from attn_core.device_spec import DEVICE_SPECS, DeviceSpec, get_device_spec

# Device terms (fitted on CUDA-graph replay times) then the host term (fitted on eager times).
DEVICE_TERMS = ("hbm_bandwidth", "fp16_flops", "fp32_flops", "launch_gap_s")
HOST_TERMS = ("launch_overhead_s",)
CALIBRATABLE = DEVICE_TERMS + HOST_TERMS


def load_profile(name_or_path: str) -> DeviceSpec:
    """A built-in profile by name, or a calibrated profile JSON by path."""
    if name_or_path in DEVICE_SPECS:
        return get_device_spec(name_or_path)
    path = Path(name_or_path)
    if not path.exists():
        raise ValueError(
            f"profile must be one of {sorted(DEVICE_SPECS)} or a calibrated profile file, "
            f"got {name_or_path!r}"
        )
    data = json.loads(path.read_text())
    base = get_device_spec(data["base"])
    fields = {k: v for k, v in data["fields"].items() if k in CALIBRATABLE}
    unknown = set(data["fields"]) - set(CALIBRATABLE)
    if unknown:
        raise ValueError(f"calibrated fields must be among {CALIBRATABLE}, got {sorted(unknown)}")
    prov = {**base.provenance, **data.get("provenance", {})}
    name = data.get("name", f"{base.name}+calibrated")
    return dataclasses.replace(base, name=name, provenance=prov, **fields)


def save_profile(spec: DeviceSpec, base: str, path: Path, provenance: dict) -> Path:
    data = {
        "base": base,
        "name": spec.name,
        "fields": {k: getattr(spec, k) for k in CALIBRATABLE},
        "provenance": provenance,
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1) + "\n")
    return path
