"""Device-facts files: what the HIL ``device-facts`` suite measured on a target.

The format (``bi100-attn/device-facts/1``)::

    {"schema": "bi100-attn/device-facts/1",
     "target": "h200-local", "date": "YYYY-MM-DDThh:mm:ssZ", "device_name": "NVIDIA H200",
     "torch": "2.11.0+cu130", "quick": false,
     "facts": {"<name>": {"value": <number|string|bool|object|list|null>, "unit": "...",
                          "method": "how it was measured",
                          "absent": "<reason>"}}}   # with value null when not measured

Facts named like a :class:`~attn_core.device.spec.DeviceSpec` field (:data:`PROFILE_FACTS`)
become the profile's value; the others are carried (shown, not priced). ``decode_tiers`` is a
list of ``{"shape": ..., "tier": str, "graph_s": t, "eager_s": t}`` (either time may be null).
Every error names the file and the fact.
"""

from __future__ import annotations

import dataclasses
import datetime
from pathlib import Path
from typing import Any, Optional

from attn_core.device.spec import DeviceSpec
from attn_sim import files
from attn_sim import schema as s

SCHEMA = "bi100-attn/device-facts/1"
# Facts that are DeviceSpec fields, as the suite measures them: shared_mem_per_block is the
# driver's default per-block limit (bytes), hbm_bandwidth a streaming read (bytes/s), fp16_flops
# an fp16 matmul (FLOP/s), launch_overhead_s host time per eager launch, launch_gap_s device
# time per launch in CUDA-graph replay, fp32_flops (when measured) an fp32 matmul.
PROFILE_FACTS = (
    "sm_count",
    "warp_size",
    "max_threads_per_block",
    "max_threads_per_sm",
    "max_blocks_per_sm",
    "registers_per_sm",
    "max_registers_per_thread",
    "max_registers_per_block",
    "shared_mem_per_block",
    "shared_mem_per_sm",
    "l2_bytes",
    "memory_bytes",
    "hbm_bandwidth",
    "fp16_flops",
    "fp32_flops",
    "launch_overhead_s",
    "launch_gap_s",
)
_FLOAT_FIELDS = frozenset(
    f.name for f in dataclasses.fields(DeviceSpec) if f.type in ("float", float)
)
_ZERO_OK = frozenset({"launch_overhead_s", "launch_gap_s"})
_time = s.number(0, strict=True)


@dataclasses.dataclass(frozen=True)
class Fact:
    """One measurement; ``absent`` (with ``value`` None) says why it was not measured."""

    name: str
    value: Any
    unit: str = ""
    method: str = ""
    absent: Optional[str] = None

    @property
    def measured(self) -> bool:
        return self.absent is None


@dataclasses.dataclass(frozen=True)
class DeviceFacts:
    target: str
    date: datetime.datetime
    device_name: str
    torch: str
    quick: bool
    facts: dict[str, Fact]

    @property
    def day(self) -> str:
        return self.date.date().isoformat()

    def provenance(self, fact: Fact) -> str:
        return f"measured on {self.target} {self.day} by device-facts: {fact.method}"


def read_facts(path: Path) -> DeviceFacts:
    """The facts file at ``path``, checked; ``ValueError`` naming the file and the fact."""
    path = Path(path)
    data = files.read_json(path, "facts file")
    try:
        return parse_facts(data)
    except ValueError as err:
        raise ValueError(f"facts file {path}: {err}") from None


def _bool(key: str, value: Any) -> None:
    if not isinstance(value, bool):
        raise s.Invalid(key, "true or false", value)


def _string(key: str, value: Any) -> None:
    if not isinstance(value, str):
        raise s.Invalid(key, "a string", value)


def _anything(key: str, value: Any) -> None:
    """Any JSON value (a fact's own checks come later)."""


def _not_null(key: str, value: Any) -> None:
    if value is None:
        raise s.Invalid(key, "given (not null)", value)


def _time_or_null(key: str, value: Any) -> None:
    if value is not None:
        _time(key, value)


_TOP = s.table(
    {
        "schema": (True, s.one_of((SCHEMA,))),
        "target": (True, s.text),
        "date": (True, s.text),
        "device_name": (True, _string),
        "torch": (True, _string),
        "quick": (True, _bool),
        "facts": (True, s.mapping_of(_anything)),
    },
    extra=True,  # later suites may record more about the run
)


def parse_facts(data: Any) -> DeviceFacts:
    """A parsed facts file (see the module docstring), checked."""
    if isinstance(data, dict) and "schema" in data and data["schema"] != SCHEMA:
        raise s.Invalid("schema", repr(SCHEMA), data["schema"])
    _TOP("", data)
    try:
        date = datetime.datetime.fromisoformat(data["date"].replace("Z", "+00:00"))
    except ValueError:
        expected = "an ISO 8601 UTC time (YYYY-MM-DDThh:mm:ssZ)"
        raise s.Invalid("date", expected, data["date"]) from None
    facts = {name: _fact(f"facts.{name}", name, raw) for name, raw in data["facts"].items()}
    return DeviceFacts(
        target=data["target"],
        date=date,
        device_name=data["device_name"],
        torch=data["torch"],
        quick=data["quick"],
        facts=facts,
    )


def _fact(key: str, name: str, raw: Any) -> Fact:
    if not isinstance(raw, dict):
        raise s.Invalid(key, "an object with value, unit, method (or absent)", raw)
    if "value" not in raw:
        raise ValueError(f"{key}.value is missing (null with 'absent' when not measured)")
    for part in ("unit", "method", "absent"):
        if part in raw and raw[part] is not None:
            _string(f"{key}.{part}", raw[part])
    value, absent = raw["value"], raw.get("absent")
    if absent is not None:
        if value is not None:
            raise s.Invalid(f"{key}.value", "null when 'absent' gives a reason", value)
        s.text(f"{key}.absent", absent)
        return Fact(name, None, raw.get("unit") or "", raw.get("method") or "", absent)
    if value is None:
        raise ValueError(f"{key}.value is null without an 'absent' reason")
    s.text(f"{key}.method", raw.get("method"))
    if name in PROFILE_FACTS:
        value = _profile_value(f"{key}.value", name, value)
    elif name == "decode_tiers":
        _decode_tiers(f"{key}.value", value)
    return Fact(name, value, raw.get("unit") or "", raw["method"], None)


def _profile_value(key: str, name: str, value: Any) -> Any:
    """A DeviceSpec field's value: finite, > 0 (>= 0 for the launch latencies), an integer
    where the field is one."""
    lo_ok = name in _ZERO_OK
    if name in _FLOAT_FIELDS:
        s.number(0, strict=not lo_ok)(key, value)
        return float(value)
    if not (s.is_number(value) and float(value).is_integer() and value >= 1):
        raise s.Invalid(key, "an integer >= 1", value)
    return int(value)


_TIER_ROW = s.table(
    {
        "shape": (True, _not_null),
        "tier": (True, s.text),
        "graph_s": (False, _time_or_null),
        "eager_s": (False, _time_or_null),
    },
    extra=True,  # e.g. why a capture failed
)


def _decode_tiers(key: str, value: Any) -> None:
    s.list_of(_TIER_ROW, min_len=0, what="{shape, tier, graph_s, eager_s} rows")(key, value)
    for i, row in enumerate(value):
        if row.get("graph_s") is None and row.get("eager_s") is None:
            raise ValueError(f"{key}[{i}] gives neither graph_s nor eager_s")


def shape_text(shape: Any) -> str:
    if isinstance(shape, dict):
        return ", ".join(f"{k}={v}" for k, v in shape.items())
    if isinstance(shape, list):
        return ",".join(map(str, shape))
    return str(shape)


def tier_winners(rows: list[dict]) -> list[dict]:
    """Per shape (in first-seen order): each tier's times and the fastest tier, by CUDA-graph
    replay time (how vLLM runs decode) when every tier of the shape has one, else eager."""
    by_shape: dict[str, list[dict]] = {}
    for row in rows:
        by_shape.setdefault(shape_text(row["shape"]), []).append(row)
    out = []
    for shape, group in by_shape.items():
        mode = "graph_s" if all(r.get("graph_s") for r in group) else "eager_s"
        timed = [r for r in group if r.get(mode)]
        best = min(timed, key=lambda r: r[mode]) if timed else None
        out.append(
            {
                "shape": shape,
                "tiers": ", ".join(
                    f"{r['tier']} {_ms(r.get('graph_s'))}/{_ms(r.get('eager_s'))}" for r in group
                ),
                "winner": best["tier"] if best else None,
                "by": mode.replace("_s", ""),
            }
        )
    return out


def _ms(t: Optional[float]) -> str:
    return "-" if t is None else f"{t * 1e3:.3g}ms"
