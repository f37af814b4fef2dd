"""The device-facts file's records: one measured or absent fact, and the whole document.

The format is the one ``attn_sim.facts`` reads (``bi100-attn/device-facts/1``)::

    {"schema": ..., "target": ..., "date": "YYYY-MM-DDThh:mm:ssZ", "device_name": ...,
     "torch": ..., "quick": bool, "facts": {name: {"value", "unit", "method"} or
                                                  {"value": null, "unit", "absent": why}}}

Standard library only (the suite's sections import torch; this module does not), so the
tests can check documents without a device.
"""

from __future__ import annotations

import datetime
from typing import Any, Optional

SCHEMA = "bi100-attn/device-facts/1"


def measured(value: Any, unit: str, method: str, **extra: Any) -> dict:
    """A measured fact; ``extra`` keys (e.g. the other source's value) are carried as they are."""
    if value is None:
        raise ValueError(f"a measured fact needs a value, got None (method {method!r})")
    if not method:
        raise ValueError("a measured fact needs its method, got an empty one")
    return {"value": value, "unit": unit, "method": method, **extra}


def absent(unit: str, why: str) -> dict:
    """A fact not measured here, and why (a refusal to run, no device, no vLLM...)."""
    if not why:
        raise ValueError("an absent fact needs a reason, got an empty one")
    return {"value": None, "unit": unit, "absent": why}


def is_absent(fact: dict) -> bool:
    return fact.get("absent") is not None


def utc_now() -> str:
    now = datetime.datetime.now(datetime.timezone.utc).replace(microsecond=0)
    return now.isoformat().replace("+00:00", "Z")


def document(
    target: str,
    device_name: str,
    torch_version: str,
    quick: bool,
    facts: dict,
    date: Optional[str] = None,
    **extra: Any,
) -> dict:
    """The whole file; ``extra`` top-level keys (sizes, durations) are allowed by the reader."""
    return {
        "schema": SCHEMA,
        "target": target,
        "date": date or utc_now(),
        "device_name": device_name,
        "torch": torch_version,
        "quick": quick,
        "facts": facts,
        **extra,
    }
