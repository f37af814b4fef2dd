"""Gate thresholds and the predicted-time baseline: the two checked-in data files.

``data/gates.toml`` holds every threshold (see the comments there); ``data/baseline.json`` holds
the predicted time of each gated case per profile, written only by
``python -m attn_sim update-baseline``. Both are validated when read: a missing key, a value of
the wrong type or out of range is a ``ValueError`` naming the file and the dotted key (the CLI's
exit 2), never a ``KeyError`` half-way through the gates or a vacuous pass (``profiles = []``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Optional

from attn_core.core.files import write_atomic
from attn_core.device.spec import DEVICE_SPECS
from attn_sim import files
from attn_sim import schema as s

DATA = Path(__file__).parent / "data"
GATES_FILE = DATA / "gates.toml"
BASELINE_FILE = DATA / "baseline.json"

DECODE_TIERS = ("single_tile", "one_pass", "partitioned")  # attn-core's plan tiers
# Bounds that keep a case tractable on meta tensors (the report goes to 1M tokens, batch 64).
MAX_BATCH = 1024
MAX_CONTEXT = 1 << 24
# Thresholds a ``[decode.profile."<name>"]`` table may override: the ones gates.py reads through
# :func:`decode_threshold` (any other key there would be silently ignored). Keyed by built-in
# profile name (a calibrated profile takes its base's).
PER_PROFILE_KEYS = ("transient_kv_ratio",)
PROFILE_BASES = tuple(DEVICE_SPECS)

_batch = s.integer(1, MAX_BATCH)
_context = s.integer(1, MAX_CONTEXT)
_count = s.integer(0)
_ratio = s.number(0, strict=True)

_DECODE = {
    "cases": (
        True,
        s.list_of(
            s.tuple_of(_batch, _context, what="[batch, context]"),
            min_len=0,
            what="[batch, context] pairs",
        ),
    ),
    "max_launches": (True, s.integer(1)),
    "max_launches_by_tier": (False, s.mapping_of(s.integer(1), DECODE_TIERS)),
    "max_plan_launches": (True, s.integer(1)),
    "max_syncs": (True, _count),
    "transient_kv_ratio": (True, _ratio),
    "transient_floor_bytes": (True, _count),
    "profile": (
        False,
        s.mapping_of(s.table({k: (False, _ratio) for k in PER_PROFILE_KEYS}), PROFILE_BASES),
    ),
}
_PREFILL = {
    "cases": (
        True,
        s.list_of(
            s.tuple_of(_batch, _context, _context, what="[batch, new tokens, context]"),
            min_len=0,
            what="[batch, new tokens, context] triples",
        ),
    ),
    "max_syncs": (True, _count),
    "transient_over_kv_bytes": (True, _count),
}
_PLAN = {
    "batches": (True, s.list_of(_batch, max_len=64, what="batch sizes")),
    "context_min": (True, _context),
    "context_max": (True, _context),
    "steps_per_octave": (True, s.integer(1, 64)),
    "prefill_query_lens": (False, s.list_of(_context, min_len=0, max_len=64)),
    "decode_stream_tokens": (False, s.list_of(_context, min_len=0, max_len=64)),
}
_HYBRID = {
    "profiles": (True, s.list_of(s.text, max_len=16, what="built-in profile names")),
    "prompt": (True, _context),
    "chunk": (True, _context),
    "path": (True, s.one_of(("fallback", "torch", "native"))),
    "max_linear_share": (True, s.number(0, strict=True)),
}
GATES_SCHEMA = s.table(
    {
        "profiles": (True, s.list_of(s.text, max_len=16, what="profile names or files")),
        "decode": (True, s.table(_DECODE)),
        "prefill": (True, s.table(_PREFILL)),
        "plan": (True, s.table(_PLAN)),
        "time": (True, s.table({"tolerance": (True, s.number(0, strict=False))})),
        "hybrid": (False, s.table(_HYBRID)),
    }
)


def load_gates(path: Optional[Path] = None) -> dict:
    """The thresholds file, validated (see the module docstring)."""
    p = Path(path or GATES_FILE)
    data = files.read_toml(p, "gates file")
    try:
        check_gates(data)
    except ValueError as err:
        raise ValueError(f"gates file {p}: {err}") from None
    return data


def check_gates(gates: Any) -> None:
    """``ValueError`` naming the dotted key of the first thing wrong in a parsed gates file."""
    GATES_SCHEMA("", gates)
    if not gates["decode"]["cases"] and not gates["prefill"]["cases"]:
        raise ValueError("decode.cases and prefill.cases are both empty: nothing would be timed")
    plan = gates["plan"]
    if plan["context_max"] < plan["context_min"]:
        raise s.Invalid(
            "plan.context_max", f">= plan.context_min ({plan['context_min']})", plan["context_max"]
        )
    for i, (_, new, context) in enumerate(gates["prefill"]["cases"]):
        if new > context:
            raise s.Invalid(
                f"prefill.cases[{i}]",
                "[batch, new tokens, context >= new tokens]",
                [_, new, context],
            )


def decode_threshold(gates: dict, profile: str, key: str) -> Any:
    """``[decode.profile."<name>"]`` overrides ``[decode]``."""
    per = gates["decode"].get("profile", {}).get(profile, {})
    return per.get(key, gates["decode"][key])


_BASELINE_ENTRY = s.table(
    {"time_s": (True, s.number(0, strict=True)), "launches": (False, s.integer(0))}
)
BASELINE_SCHEMA = s.table({"profiles": (True, s.mapping_of(s.mapping_of(_BASELINE_ENTRY)))})


def load_baseline(path: Optional[Path] = None, *, missing_ok: bool = True) -> dict:
    """The baseline file, validated; ``{"profiles": {}}`` when it does not exist and
    ``missing_ok`` (``update-baseline`` writes a new one; ``gates`` then fails every time check
    with "no baseline")."""
    p = Path(path or BASELINE_FILE)
    if not p.exists() and not p.is_symlink():
        if missing_ok:
            return {"profiles": {}}
        raise ValueError(
            f"baseline file {p} does not exist (`update-baseline --baseline {p}` writes one)"
        )
    data = files.read_json(p, "baseline file")
    try:
        BASELINE_SCHEMA("", data)
    except ValueError as err:
        raise ValueError(f"baseline file {p}: {err}") from None
    return data


def save_baseline(baseline: dict, path: Optional[Path] = None) -> Path:
    p = Path(path or BASELINE_FILE)
    write_atomic(p, json.dumps(baseline, indent=1, sort_keys=True) + "\n")
    return p
