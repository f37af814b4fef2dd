"""``python -m attn_sim profile-from FACTS.json``: a device profile from a device-facts file.

Every :data:`attn_sim.facts.PROFILE_FACTS` the file measured replaces the base profile's value,
with provenance ``measured on <target> <date> by device-facts: <method>``; a fact marked absent
(or not in the file) keeps the base's value and provenance. The profile is written complete (all
fields, ``attn-core/profile/1``, ``base`` recorded) so it reads the same if a built-in changes,
and it is checked by loading it back the way ``--profile FILE`` does.

Printed: the fields (base vs new), the facts that are not profile fields, the fastest decode
tier per measured shape (what the tier rule should pick on that device), and the predicted
decode / prefill step times (the report's cases, traced on both profiles) that move by more
than :data:`MOVE_PCT`.
"""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path
from typing import Any, Optional

from tabulate import tabulate

from attn_core.core.files import write_atomic
from attn_core.device.profile_file import profile_from_json, profile_to_json
from attn_core.device.spec import DEVICE_SPECS, DeviceSpec
from attn_sim import cli_args, report
from attn_sim.facts import PROFILE_FACTS, DeviceFacts, read_facts, tier_winners
from attn_sim.profiles import load_profile
from attn_sim.simulate import simulate

MOVE_PCT = 10.0
# A measured value this many times off the base's is probably in another unit (GB/s for B/s).
UNIT_SUSPECT_FACTOR = 100.0
NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")


def compare_cases():
    """The cases whose predicted times are compared (the report's, Qwen3.6)."""
    return report.traced_cases()


def profile_name(base: str, name: Optional[str], facts: DeviceFacts) -> str:
    """``--name``, or ``<base>+<target>``; it must read ``<base>+<suffix>`` because the traced
    code runs under the built-in profile the name starts with."""
    full = name if name is not None else f"{base}+{facts.target}"
    head, plus, suffix = full.partition("+")
    if head != base or not plus or not NAME_RE.fullmatch(suffix):
        origin = "--name" if name is not None else "the default name (<base>+<target>)"
        raise ValueError(
            f"{origin} must be '{base}+<suffix>' with a suffix of letters, digits, '.', '_' or "
            f"'-', got {full!r}"
        )
    return full


def build(base: DeviceSpec, facts: DeviceFacts, name: str) -> tuple[DeviceSpec, list[dict]]:
    """The new profile, and one row per profile field saying where its value came from."""
    values: dict[str, Any] = {}
    prov = dict(base.provenance)
    rows = []
    for field in PROFILE_FACTS:
        fact = facts.facts.get(field)
        old = getattr(base, field)
        if fact is not None and fact.measured:
            values[field] = fact.value
            prov[field] = facts.provenance(fact)
            source = f"measured: {fact.method}"
        elif fact is not None:
            source = f"kept (absent: {fact.absent})"
        else:
            source = "kept (not in the facts file)"
        new = values.get(field, old)
        rows.append(
            {"field": field, "old": old, "new": new, "change_%": _pct(old, new), "source": source}
        )
    spec = dataclasses.replace(base, name=name, provenance=prov, **values)
    return spec, rows


def profile_json(spec: DeviceSpec, base: str) -> dict:
    """Every field of ``spec`` (a complete file) with ``base`` recorded."""
    data = profile_to_json(spec)
    return {"schema": data["schema"], "name": spec.name, "base": base, **data}


def other_rows(facts: DeviceFacts) -> list[dict]:
    rows = []
    for name, fact in facts.facts.items():
        if name in PROFILE_FACTS:
            continue
        if name == "decode_tiers" and fact.measured:
            value = f"{len(fact.value)} rows (winners below)"
        else:
            value = _short(fact.value)
        how = fact.method if fact.measured else f"absent: {fact.absent}"
        rows.append({"fact": name, "value": value, "unit": fact.unit, "method": how})
    return rows


def field_table(rows: list[dict], base: str, name: str) -> str:
    """The field rows with the values as text (ints with separators, floats to 4 digits)."""
    shown = [{**r, "old": _number(r["old"]), "new": _number(r["new"])} for r in rows]
    headers = {
        "field": "field",
        "old": base,
        "new": name,
        "change_%": "change_%",
        "source": "source",
    }
    return tabulate(shown, headers=headers, tablefmt="github", disable_numparse=True)


def unit_warnings(rows: list[dict], base: str) -> list[str]:
    out = []
    for r in rows:
        old, new = r["old"], r["new"]
        if old and new and max(old / new, new / old) > UNIT_SUSPECT_FACTOR:
            out.append(
                f"warning: {r['field']} {new:.4g} is {new / old:.3g}x {base}'s {old:.4g}: "
                "check the fact's unit"
            )
    return out


def moved_times(base: DeviceSpec, spec: DeviceSpec) -> list[dict]:
    """Cases whose eager or graph step time moves by more than :data:`MOVE_PCT`."""
    rows = []
    for case in compare_cases():
        old, new = simulate(base, case), simulate(spec, case)
        eager, graph = _pct(old.time_s, new.time_s), _pct(old.graph_time_s, new.graph_time_s)
        if max(abs(eager), abs(graph)) > MOVE_PCT:
            rows.append(
                {
                    "case": case.label(),
                    f"{base.name} ms": round(old.time_s * 1e3, 4),
                    f"{spec.name} ms": round(new.time_s * 1e3, 4),
                    "change_%": eager,
                    f"{base.name} graph ms": round(old.graph_time_s * 1e3, 4),
                    f"{spec.name} graph ms": round(new.graph_time_s * 1e3, 4),
                    "graph change_%": graph,
                }
            )
    return rows


def main(facts_path: str, base: str, name: Optional[str], out: Optional[str]) -> int:
    facts = read_facts(Path(facts_path))
    base_spec = DEVICE_SPECS[base]
    name = profile_name(base, name, facts)
    spec, rows = build(base_spec, facts, name)
    data = profile_json(spec, base)
    # the checks --profile FILE makes (physical ranges and relations), before any output
    profile_from_json(data, source=f"{facts_path} (as profile {name})")
    target = cli_args.writable_file(out or f"sim-report/{name}.json", "--out")
    write_atomic(target, json.dumps(data, indent=1) + "\n")
    if load_profile(str(target)) != spec:  # what --profile FILE will see
        raise RuntimeError(f"{target} does not read back as the profile written (a bug)")

    measured = sum(1 for f in PROFILE_FACTS if f in facts.facts and facts.facts[f].measured)
    print(
        f"device-facts of {facts.device_name or '?'} on {facts.target}, {facts.date.isoformat()} "
        f"(torch {facts.torch or '?'}{', quick run' if facts.quick else ''}): "
        f"{measured} of {len(PROFILE_FACTS)} profile fields measured"
    )
    print(field_table(rows, base, name))
    others = other_rows(facts)
    if others:
        print("\nnot profile fields (carried, not priced):")
        print(tabulate(others, headers="keys", tablefmt="github"))
    tiers = facts.facts.get("decode_tiers")
    if tiers is not None and tiers.measured and tiers.value:
        print(
            "\ndecode tiers measured (graph/eager per tier); the fastest is the tier the rule "
            "should pick on this device"
        )
        print(tabulate(tier_winners(tiers.value), headers="keys", tablefmt="github"))
    for line in unit_warnings(rows, base):
        print(line)
    if not measured:
        print(f"warning: no profile field was measured: {name} equals {base}")
    moved = moved_times(base_spec, spec)
    print(f"\npredicted step times that move by more than {MOVE_PCT:g}% ({base} -> {name}):")
    print(tabulate(moved, headers="keys", tablefmt="github") if moved else "none")
    print(f"\nwrote {target} (use it as --profile {target}, or ATTN_CORE_DEVICE={target})")
    return 0


def _pct(old: float, new: float) -> float:
    return round(100.0 * (new - old) / old, 1) if old else 0.0


def _number(value: float) -> str:
    return f"{value:,}" if isinstance(value, int) else f"{value:.4g}"


def _short(value: Any, limit: int = 60) -> str:
    text = value if isinstance(value, str) else json.dumps(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
