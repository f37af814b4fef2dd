"""Device profiles as JSON files: lab measurements committed as data and used by name or path.

A profile file replaces some or all fields of a :class:`~attn_core.device.spec.DeviceSpec`::

    {"schema": "attn-core/profile/1",
     "name": "bi-v100-lab",
     "base": "bi-v100",
     "fields": {"sm_count": 16, "hbm_bandwidth": 5.9e11, ...},
     "provenance": {"sm_count": "measured on bi-v100-lab by device-facts: ..."}}

``base`` (a built-in profile) supplies every field the file does not give; without it the file
must give them all. Files written before the schema key existed (``attn_sim calibrate``'s
``{"base", "name", "fields", "provenance"}``) read the same. Every error names the file and
the field.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Optional, Union

from attn_core.core.files import write_atomic
from attn_core.device.spec import DEVICE_SPECS, DeviceSpec

SCHEMA = "attn-core/profile/1"
_NOT_FIELDS = ("name", "provenance")
FIELDS: tuple[str, ...] = tuple(
    f.name for f in dataclasses.fields(DeviceSpec) if f.name not in _NOT_FIELDS
)
_FLOAT_FIELDS = frozenset(
    f.name for f in dataclasses.fields(DeviceSpec) if f.type in ("float", float)
)
# Fields that may be 0 (everything else must be > 0).
_ZERO_OK = frozenset(
    {
        "shared_mem_reserved_per_block",
        "launch_gap_s",
        "launch_overhead_s",
        "shared_mem_per_block_optin",
        "dependent_launch_gap_s",
    }
)


# What a data file may ask of the parser. Profiles, facts, measurements and gates nest at most
# 4 levels; 64 is far past any of them and far below the ~1000 frames at which Python's parsers
# raise RecursionError. 20 digits hold any 64-bit count; a longer integer can only be a typo and
# was an OverflowError where it met a float (math.isfinite, float()).
MAX_DEPTH = 64
MAX_INT_DIGITS = 20


def check_plain(data: Any, where: str) -> Any:
    """``data`` (parsed JSON / TOML) unless it nests deeper than :data:`MAX_DEPTH` or holds an
    integer longer than :data:`MAX_INT_DIGITS` digits: then a ``ValueError`` naming ``where``
    (the file) and the dotted key. Iterative, so the check itself cannot overflow the stack."""
    stack = [("", data, 0)]
    while stack:
        key, value, depth = stack.pop()
        if depth > MAX_DEPTH:
            raise ValueError(
                f"{where}: {key or 'the file'} is nested deeper than {MAX_DEPTH} levels"
            )
        if isinstance(value, int) and not isinstance(value, bool):
            digits = len(str(abs(value)))
            if digits > MAX_INT_DIGITS:
                raise ValueError(
                    f"{where}: {key or 'the file'} must be an integer of at most "
                    f"{MAX_INT_DIGITS} digits, got one of {digits} digits"
                )
        elif isinstance(value, Mapping):
            dot = f"{key}." if key else ""
            stack.extend((f"{dot}{k}", v, depth + 1) for k, v in value.items())
        elif isinstance(value, list):
            stack.extend((f"{key}[{i}]", v, depth + 1) for i, v in enumerate(value))
    return data


def parse_json_text(text: str, where: str) -> Any:
    """JSON text parsed and :func:`check_plain`-ed; every error a ``ValueError`` naming
    ``where``: the one JSON reader of attn-core's files (attn_sim reads its own through it)."""
    try:
        data = json.loads(text)
    except RecursionError:
        raise ValueError(f"{where}: nested deeper than {MAX_DEPTH} levels") from None
    except ValueError as exc:  # JSONDecodeError; an integer past Python's digit limit
        raise ValueError(f"{where}: cannot be parsed: not readable JSON ({exc})") from None
    return check_plain(data, where)


def is_profile_path(name_or_path: str) -> bool:
    """Whether a ``--profile`` / ``ATTN_CORE_DEVICE`` value names a file, not a built-in."""
    return name_or_path not in DEVICE_SPECS


def load_profile_file(path: Union[str, Path]) -> DeviceSpec:
    """The profile a JSON file describes (``~`` expanded); ``ValueError`` naming the file and
    field otherwise."""
    path = Path(os.path.expanduser(path))  # ~user unknown: as given (Path.expanduser raises)
    if not path.is_file():
        why = "is a directory" if path.is_dir() else "does not exist"
        raise ValueError(
            f"device profile must be one of {sorted(DEVICE_SPECS)} or a profile JSON file; "
            f"{str(path)!r} {why}"
        )
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"profile file {path}: not readable JSON ({exc})") from None
    return profile_from_json(parse_json_text(text, f"profile file {path}"), source=str(path))


def profile_from_json(data: Any, source: str = "<profile>") -> DeviceSpec:
    """A :class:`DeviceSpec` from a parsed profile file (see the module docstring)."""
    if not isinstance(data, Mapping):
        raise ValueError(f"profile file {source}: must be a JSON object, got {type(data).__name__}")
    check_plain(data, f"profile file {source}")
    schema = data.get("schema", SCHEMA)
    if not isinstance(schema, str) or schema != SCHEMA:
        raise ValueError(f"profile file {source}: schema must be {SCHEMA!r}, got {schema!r}")
    unknown_keys = set(data) - {"schema", "name", "base", "fields", "provenance"}
    if unknown_keys:
        raise ValueError(f"profile file {source}: unknown keys {sorted(unknown_keys)}")
    fields = data.get("fields", {})
    provenance = data.get("provenance", {})
    for key, value in (("fields", fields), ("provenance", provenance)):
        if not isinstance(value, Mapping):
            raise ValueError(f"profile file {source}: {key} must be an object")
    unknown = sorted(set(fields) - set(FIELDS))
    if unknown:
        raise ValueError(f"profile file {source}: fields must be among {FIELDS}, got {unknown}")
    # int or float per field, checked by _checked against the field's type
    values: dict[str, Any] = {k: _checked(source, k, v) for k, v in fields.items()}
    base_name = data.get("base")
    if base_name is not None:
        if not isinstance(base_name, str) or base_name not in DEVICE_SPECS:
            raise ValueError(
                f"profile file {source}: base must be one of {sorted(DEVICE_SPECS)}, "
                f"got {base_name!r}"
            )
        base: Optional[DeviceSpec] = DEVICE_SPECS[base_name]
    else:
        base = None
        missing = sorted(set(_required()) - set(values))
        if missing:
            raise ValueError(f"profile file {source}: without a base it must give {missing}")
    name = data.get("name") or (f"{base_name}+file" if base_name else Path(source).stem)
    if not isinstance(name, str):
        raise ValueError(f"profile file {source}: name must be a string, got {name!r}")
    prov = {str(k): str(v) for k, v in provenance.items()}
    if base is not None:
        spec = dataclasses.replace(
            base, name=name, provenance={**base.provenance, **prov}, **values
        )
    else:
        spec = DeviceSpec(name=name, provenance=prov, **values)
    problem = physical_problem(spec)
    if problem:
        raise ValueError(f"profile file {source}: {problem}")
    return spec


KiB, MiB, GiB, TiB = 1024, 1024**2, 1024**3, 1024**4
# Physical ranges, wide enough for every GPU of the last decade and the next (an H200 has
# 132 SMs, 228 KiB shared memory per SM, 4.8 TB/s, 989 TFLOP/s fp16), narrow enough that a
# value in the wrong unit (GB/s for B/s, ms for s) or a typo (10^30 SMs) is refused.
PHYSICAL_RANGES: dict[str, tuple[float, float]] = {
    "sm_count": (1, 4096),
    "warp_size": (16, 128),
    "max_threads_per_block": (64, 4096),
    "max_threads_per_sm": (64, 16384),
    "max_blocks_per_sm": (1, 256),
    "registers_per_sm": (1024, 4 * MiB),
    "max_registers_per_thread": (16, 1024),
    "register_alloc_unit": (1, 4096),
    "shared_mem_per_sm": (1 * KiB, 64 * MiB),
    "shared_mem_per_block": (1 * KiB, 64 * MiB),
    "shared_mem_alloc_unit": (1, 64 * KiB),
    "shared_mem_reserved_per_block": (0, 64 * KiB),
    "memory_bytes": (256 * MiB, 64 * TiB),
    "hbm_bandwidth": (1e9, 1e15),  # bytes/s
    "fp16_flops": (1e9, 1e17),
    "fp32_flops": (1e9, 1e17),
    "launch_overhead_s": (0.0, 0.1),
    "l2_bytes": (1 * KiB, 4 * GiB),
    "register_sub_partitions": (1, 16),
    "max_registers_per_block": (1024, 4 * MiB),
    "launch_gap_s": (0.0, 0.1),
    "shared_mem_per_block_optin": (0, 64 * MiB),
    "dependent_launch_gap_s": (0.0, 0.1),
}


def physical_problem(spec: DeviceSpec) -> str:
    """Why ``spec`` cannot describe a GPU (a field outside its physical range, or two fields in
    an impossible relation), naming the field(s) and values; "" when it can."""
    for name, (low, high) in PHYSICAL_RANGES.items():
        value = getattr(spec, name)
        if not (isinstance(value, (int, float)) and math.isfinite(value) and low <= value <= high):
            return f"{name} must be within [{low:g}, {high:g}] {_unit(name)}, got {value!r}"
    w = spec.warp_size
    relations = (
        (w & (w - 1) == 0, f"warp_size must be a power of two, got {w}"),
        _le(spec, "warp_size", "max_threads_per_block"),
        _le(spec, "max_threads_per_block", "max_threads_per_sm"),
        (
            spec.max_threads_per_block % w == 0,
            f"max_threads_per_block must be a multiple of warp_size {w}, "
            f"got {spec.max_threads_per_block}",
        ),
        (
            spec.max_threads_per_sm % w == 0,
            f"max_threads_per_sm must be a multiple of warp_size {w}, "
            f"got {spec.max_threads_per_sm}",
        ),
        _le(spec, "shared_mem_per_block", "shared_mem_per_sm"),
        _le(spec, "shared_mem_alloc_unit", "shared_mem_per_block"),
        _le(spec, "shared_mem_reserved_per_block", "shared_mem_per_block"),
        _le(spec, "max_registers_per_block", "registers_per_sm"),
        _le(spec, "register_alloc_unit", "registers_per_sm"),
        (
            spec.max_registers_per_thread * w <= spec.registers_per_sm,
            f"max_registers_per_thread {spec.max_registers_per_thread} x warp_size {w} must "
            f"fit registers_per_sm {spec.registers_per_sm}",
        ),
        (
            spec.register_sub_partitions <= spec.max_threads_per_sm // w,
            f"register_sub_partitions {spec.register_sub_partitions} must be <= the warps per "
            f"SM (max_threads_per_sm // warp_size = {spec.max_threads_per_sm // w})",
        ),
        _le(spec, "l2_bytes", "memory_bytes"),
    )
    return next((why for ok, why in relations if not ok), "")


def _unit(name: str) -> str:
    if name.endswith("_s"):
        return "seconds"
    if name == "hbm_bandwidth":
        return "bytes/s"
    if name.endswith("_flops"):
        return "FLOP/s"
    if name.endswith(("_bytes", "_per_sm", "_per_block", "_unit")) and "mem" in name:
        return "bytes"
    if name == "l2_bytes" or name == "memory_bytes":
        return "bytes"
    return "(a count)"


def _le(spec: DeviceSpec, small: str, large: str) -> tuple[bool, str]:
    a, b = getattr(spec, small), getattr(spec, large)
    return a <= b, f"{small} must be <= {large}, got {small} {a} > {large} {b}"


def profile_to_json(spec: DeviceSpec, base: Optional[str] = None) -> dict:
    """The file form of ``spec``: every field, or with ``base`` only those that differ."""
    ref = DEVICE_SPECS[base] if base is not None else None
    fields = {
        k: getattr(spec, k) for k in FIELDS if ref is None or getattr(spec, k) != getattr(ref, k)
    }
    prov = {k: v for k, v in spec.provenance.items() if ref is None or k in fields}
    data: dict = {"schema": SCHEMA, "name": spec.name}
    if base is not None:
        data["base"] = base
    data["fields"] = fields
    data["provenance"] = prov
    return data


def save_profile_file(spec: DeviceSpec, path: Union[str, Path], base: Optional[str] = None) -> Path:
    """Write ``spec`` as a profile file (parent directories created; a link at ``path`` is
    replaced, not written through)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, json.dumps(profile_to_json(spec, base), indent=1) + "\n")
    return path


def _required() -> tuple[str, ...]:
    return tuple(
        f.name
        for f in dataclasses.fields(DeviceSpec)
        if f.name not in _NOT_FIELDS
        and f.default is dataclasses.MISSING
        and f.default_factory is dataclasses.MISSING
    )


def _checked(source: str, key: str, value: Any) -> Union[int, float]:
    is_number = isinstance(value, (int, float)) and not isinstance(value, bool)
    if not is_number or not math.isfinite(float(value)):
        raise ValueError(f"profile file {source}: {key} must be a finite number, got {value!r}")
    if key not in _FLOAT_FIELDS and not float(value).is_integer():
        raise ValueError(f"profile file {source}: {key} must be an integer, got {value!r}")
    if value < 0 or (value == 0 and key not in _ZERO_OK):
        bound = ">= 0" if key in _ZERO_OK else "> 0"
        raise ValueError(f"profile file {source}: {key} must be {bound}, got {value!r}")
    return float(value) if key in _FLOAT_FIELDS else int(value)
