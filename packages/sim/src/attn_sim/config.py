"""Gate thresholds and the predicted-time baseline: the two checked-in data files.

``data/gates.toml`` holds every threshold (see the comments there); ``data/baseline.json`` holds
the predicted time of each gated case per profile, written only by
``python -m attn_sim update-baseline``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Optional

try:
    import tomllib
except ImportError:  # Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]

DATA = Path(__file__).parent / "data"
GATES_FILE = DATA / "gates.toml"
BASELINE_FILE = DATA / "baseline.json"


def load_gates(path: Optional[Path] = None) -> dict:
    with open(path or GATES_FILE, "rb") as f:
        return tomllib.load(f)


def decode_threshold(gates: dict, profile: str, key: str) -> Any:
    """``[decode.profile."<name>"]`` overrides ``[decode]``."""
    per = gates["decode"].get("profile", {}).get(profile, {})
    return per.get(key, gates["decode"][key])


def load_baseline(path: Optional[Path] = None) -> dict:
    p = Path(path or BASELINE_FILE)
    if not p.exists():
        return {"profiles": {}}
    with open(p) as f:
        return json.load(f)


def save_baseline(baseline: dict, path: Optional[Path] = None) -> Path:
    p = Path(path or BASELINE_FILE)
    with open(p, "w") as f:
        json.dump(baseline, f, indent=1, sort_keys=True)
        f.write("\n")
    return p
