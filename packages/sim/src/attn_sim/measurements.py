"""Measured decode / prefill steps, read from the files the benches and the HIL suite write.

Accepted shapes: a list of records, or an object holding one under ``records`` / ``results`` /
``rows``. A record is ``{"case": {...}, "eager_s": t, "graph_s": t}`` (bench/sim_calibration.py;
either time may be missing or null, e.g. when the capture failed, with ``graph_error`` saying
why), ``{"case": {...}, "measured_s": t}`` (an eager time; older files), or flat; field names of
the decode bench and of the HIL long-context suite are both read: path (``path`` | ``kind``),
batch (``num_seqs`` | ``batch``), context (``context`` | ``context_len`` | ``seq_len``; for
prefill ``context`` counts the new tokens, the HIL suite's ``context_len`` only the cached
prefix), ``query_len``, shape (``num_heads``, ``num_kv_heads``, ``head_size``, ``block_size``,
default Qwen3.6), ``dtype``, and the time (``measured_s`` | ``median_s`` | ``time_s`` |
``median_ms`` | ``ms``; ``graph_s`` | ``graph_ms``). Records carrying a ``variant`` are kept
only when it names attn-core (or matches ``--variant``); the decode bench's
``"<variant>, CUDA graph"`` rows are the graph times of the same cases.

Every value a kept record gives is checked: a batch of -1, a NaN / negative / zero time, a head
size attn-core does not support is a ``ValueError`` naming the record (``rows[3]``) and the key.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Optional

from attn_core.core.shapes import AttentionShape
from attn_sim import files
from attn_sim import schema as s
from attn_sim.config import DECODE_TIERS, MAX_BATCH, MAX_CONTEXT
from attn_sim.workloads import DTYPES, Case

TIME_KEYS = (
    ("eager_s", 1.0),
    ("measured_s", 1.0),
    ("median_s", 1.0),
    ("time_s", 1.0),
    ("median_ms", 1e-3),
    ("ms", 1e-3),  # bench/decode_bench.py rows
)
GRAPH_KEYS = (("graph_s", 1.0), ("graph_ms", 1e-3))
# Variant names that mean "attn-core's default plan" (decode_bench also times forced tiers,
# partition sizes and baselines under other names; those are not what the sim predicts).
DEFAULT_VARIANTS = ("attn_core plan", "attn_core", "attn-core", "paged_decode")
GRAPH_SUFFIX = ", CUDA graph"  # decode_bench: "attn_core plan, CUDA graph" = graph replay
# decode_bench.py keeps the shape once, at the top level, under these names
SHAPE_ALIASES = {"heads": "num_heads", "kv_heads": "num_kv_heads"}
LIST_KEYS = ("records", "results", "rows")
PATHS = ("decode", "prefill")

_batch = s.integer(1, MAX_BATCH)
_tokens = s.integer(1, MAX_CONTEXT)
_time = s.number(0, strict=True)


@dataclasses.dataclass(frozen=True)
class Timing:
    """One measured case: its eager and/or CUDA-graph step time, seconds (None: not measured)."""

    case: Case
    eager_s: Optional[float] = None
    graph_s: Optional[float] = None
    device_launches: Optional[int] = None  # kernels the profiler saw in one eager step

    def time(self, mode: str) -> Optional[float]:
        return self.eager_s if mode == "eager" else self.graph_s


def read_timings(path: Path, variant: Optional[str] = None) -> list[Timing]:
    """:func:`parse_timings` of a file; every error names the file."""
    path = Path(path)
    data = files.read_json(path, "measurements file")
    try:
        return parse_timings(data, variant)
    except ValueError as err:
        raise ValueError(f"measurements file {path}: {err}") from None


def _first(record: dict, *keys, default=None):
    for k in keys:
        if k in record and record[k] is not None:
            return record[k]
    return default


def _first_key(record: dict, *keys) -> Optional[str]:
    return next((k for k in keys if record.get(k) is not None), None)


def _seconds(rec: dict, keys) -> Optional[float]:
    """The first of ``keys`` given, in seconds; every one given is checked (a record with a
    good ``eager_s`` and a NaN ``median_ms`` is a broken record, not a good one)."""
    given = [k for k, _ in keys if rec.get(k) is not None]
    for k in given:
        _time(k, rec[k])
    return float(rec[given[0]]) * dict(keys)[given[0]] if given else None


def _value(rec: dict, check, *keys, default):
    key = _first_key(rec, *keys)
    if key is None:
        return default
    check(key, rec[key])
    return rec[key]


def _case_of(rec: dict, context_key: str) -> Case:
    path = _value(rec, s.one_of(PATHS), "path", "kind", default="decode")
    query_len = _value(rec, _tokens, "query_len", default=1)
    context = rec[context_key]
    if path == "prefill" and context_key == "context_len":
        s.integer(0, MAX_CONTEXT)(context_key, context)
        context += query_len  # the HIL suite's context_len is the cached prefix only
    _tokens(context_key, context)
    if query_len > context:
        raise s.Invalid("query_len", f"<= the context ({context})", query_len)
    numbers = [
        _value(rec, s.integer(1), key, default=default)
        for key, default in (
            ("num_heads", 24),
            ("num_kv_heads", 4),
            ("head_size", 256),
            ("block_size", 16),
        )
    ]
    try:
        AttentionShape(*numbers)
    except ValueError as err:
        raise ValueError(f"shape: {err}") from None
    dtype = str(_first(rec, "dtype", default="float16")).replace("torch.", "")
    s.one_of(tuple(DTYPES))("dtype", dtype)
    tier = None
    if path == "decode" and rec.get("tier"):
        tier = rec["tier"]
        s.one_of(DECODE_TIERS)("tier", tier)
    return Case(
        path=path,
        num_seqs=_value(rec, _batch, "num_seqs", "batch", default=1),
        context=context,
        shape=AttentionShape(*numbers),
        dtype=dtype,
        query_len=query_len,
        tier=tier,
    )


def _records(data: Any) -> tuple[str, list, dict]:
    """``(name of the list, the records, fields shared by all)``."""
    if isinstance(data, list):
        return "record", data, {}
    if not isinstance(data, dict):
        raise ValueError(
            f"must be a list of records or an object holding one under {list(LIST_KEYS)}, "
            f"got {type(data).__name__}"
        )
    key = _first_key(data, *LIST_KEYS)
    if key is None:
        raise ValueError(f"holds no records: none of {list(LIST_KEYS)} is given")
    if not isinstance(data[key], list):
        raise s.Invalid(key, "a list of records", data[key])
    top = data.get("shape") if isinstance(data.get("shape"), dict) else {}
    return key, data[key], {SHAPE_ALIASES.get(k, k): v for k, v in top.items()}


def parse_timings(data, variant: Optional[str] = None) -> list[Timing]:
    """Every usable case of any accepted file shape, eager and graph times merged per case.

    ``variant``: keep only records of that exact variant name (and its ``", CUDA graph"`` row);
    default: attn-core's default plan, :data:`DEFAULT_VARIANTS`. Records without a variant are
    always kept.
    """
    list_name, records, shared = _records(data)
    wanted = (variant,) if variant else DEFAULT_VARIANTS
    merged: dict[Case, dict[str, Any]] = {}
    for i, raw in enumerate(records):
        if not isinstance(raw, dict):
            raise s.Invalid(f"{list_name}[{i}]", "an object", raw)
        try:
            _merge(raw, shared, wanted, variant, merged)
        except ValueError as err:
            raise ValueError(f"{list_name}[{i}]: {err}") from None
    out = [Timing(c, t.get("eager"), t.get("graph"), t.get("launches")) for c, t in merged.items()]
    return sorted(
        out, key=lambda t: (t.case.path, t.case.num_seqs, t.case.context, t.case.tier or "")
    )


def _merge(raw: dict, shared: dict, wanted: tuple, variant: Optional[str], merged: dict) -> None:
    case_part = raw.get("case") if isinstance(raw.get("case"), dict) else {}
    rec = {**shared, **raw, **case_part}
    name = rec.get("variant") or rec.get("impl")
    graph_row = name is not None and str(name).endswith(GRAPH_SUFFIX)
    if graph_row:
        name = str(name)[: -len(GRAPH_SUFFIX)]
    elif variant is None and rec.get("tier") and name == f"graph, tier={rec['tier']}":
        graph_row, name = True, DEFAULT_VARIANTS[0]  # decode_bench: the other tier, replayed
    if name is not None and str(name) not in wanted:
        return
    context_key = _first_key(rec, "context", "context_len", "seq_len")
    if context_key is None or rec.get("skipped"):
        return
    if graph_row:
        times = {"graph": _seconds(rec, TIME_KEYS)}
    else:
        times = {"eager": _seconds(rec, TIME_KEYS), "graph": _seconds(rec, GRAPH_KEYS)}
    times = {k: v for k, v in times.items() if v is not None}
    if not times:
        return
    launches = _value(rec, s.integer(0), "device_launches", "launches", default=None)
    if launches is not None and not graph_row:
        times["launches"] = launches
    merged.setdefault(_case_of(rec, context_key), {}).update(times)


def parse_measurements(data, variant: Optional[str] = None) -> list[tuple[Case, float]]:
    """``(case, eager seconds)`` pairs (cases with an eager time; see :func:`parse_timings`)."""
    return [(t.case, t.eager_s) for t in parse_timings(data, variant) if t.eager_s is not None]
