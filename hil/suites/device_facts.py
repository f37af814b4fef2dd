"""device-facts suite: measure the target's profile facts, each with its method.

Usage: python device_facts.py --out DIR [--junit FILE] [--quick] [--device cuda|cpu]
                              [--target NAME] [--sections driver,rates,tiers,prefill,linear,v1]

Writes OUT/device_facts.json (``bi100-attn/device-facts/1``, what ``python -m attn_sim
profile-from`` reads), OUT/device_facts_table.md, and a JUnit report with one case per section:

- ``driver``: name, SMs, warp, shared memory per block (default, opt-in) and per SM, registers
  per SM and per block, threads / blocks per SM, L2, memory (device_facts_driver.py);
- ``rates``: streaming-read and copy bandwidth, fp16 / bf16 / fp32 matmul, eager launch
  overhead, CUDA-graph launch gap (device_facts_rates.py);
- ``tiers``: attn-core's one_pass / partitioned tiers and the native kernel (where built and
  verified) at batch x context around the tier threshold, and that library's kernels as the
  driver reports them beside the records its plans are sized from (device_facts_tiers.py);
- ``prefill``: which native prefill MMA variant builds and verifies, and its attention rate on
  one chunk over a long context (device_facts_prefill.py);
- ``linear``: one Gated DeltaNet layer of the hybrid model in both forms, the chunked prefill
  (native where verified, and torch) over one prompt and the recurrent decode step at batch 1
  and 8, eager and CUDA-graph replay, and which backend serves (device_facts_linear.py);
- ``v1``: vLLM's compiled ``paged_attention_v1`` reach at Qwen3.6's shape by bisection, one
  subprocess per probe, and the V2 probe (device_facts_v1.py). Last, because a probe that
  hangs may wedge the device; the other sections are written by then.

Off CUDA (CI's CPU container) every GPU-only fact is written absent with the reason. Sizes are
:data:`FULL` and :data:`QUICK` (``--quick`` / ``HIL_QUICK=1``); the full suite takes well under
90 s on an H200. The file is rewritten after each section (a suite the watchdog kills still
leaves what it measured). Exit 0 when it is written and no section raised; 1 when one raised
(its facts are absent with the error, the rest stand).
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
import os
import sys
import time
import traceback
from pathlib import Path
from xml.sax.saxutils import escape, quoteattr

import torch
from device_facts_record import absent, document, is_absent, measured
from suite_files import write_atomic

# v1 last: its probes are the only step that may wedge the device (a HANG)
SECTIONS = ("driver", "rates", "tiers", "prefill", "linear", "v1")
FACTS_FILE = "device_facts.json"


@dataclasses.dataclass(frozen=True)
class Sizes:
    copy_bytes: int  # bandwidth buffers (the 1 GiB)
    matmul_n: int  # square matmul side
    rate_repeats: int
    launches: int  # tiny ops per launch-overhead / graph-gap measurement
    launch_repeats: int
    tier_batches: tuple
    tier_contexts: tuple
    tier_repeats: int
    v1_cap: int  # longest context the V1 bisection tries
    probe_timeout_s: float  # per V1 / V2 probe subprocess (vLLM's import included)
    prefill_chunk: int = 8192  # the native prefill's timed chunk ...
    prefill_context: int = 102400  # ... over this much context (the 100K / 8192 row)
    prefill_repeats: int = 3
    linear_prompt: int = 32768  # tokens of the Gated DeltaNet layer's timed prefill
    linear_batches: tuple = (1, 8)  # sequences of its timed decode step
    linear_repeats: int = 5


FULL = Sizes(1 << 30, 8192, 20, 1000, 5, (1, 4, 16),
             (2048, 4096, 8192, 16384, 32768, 65536), 20, 262144, 120.0)  # fmt: skip
QUICK = Sizes(64 << 20, 2048, 5, 200, 3, (1, 4), (2048, 8192), 5, 16384, 60.0, 2048, 8192, 2,
              linear_prompt=256, linear_repeats=2)  # fmt: skip

UNITS = {
    "native_v1_max_seq_len": "tokens",
    "native_v1_probes": "",
    "v2_probe": "",
    "decode_tiers": "s",
    "decode_tier_errors": "",
    "native_decode": "",
    "native_kernels": "",
    "native_prefill": "",
}


def section_names(section: str) -> dict:
    """{fact: unit} a section writes (what is marked absent when it cannot run)."""
    from device_facts_driver import units
    from device_facts_linear import LINEAR_UNITS
    from device_facts_rates import RATE_UNITS

    names = {
        "driver": units(),
        "rates": RATE_UNITS,
        "v1": {k: UNITS[k] for k in ("native_v1_max_seq_len", "native_v1_probes", "v2_probe")},
        "tiers": {k: UNITS[k] for k in ("decode_tiers", "native_decode", "native_kernels")},
        "prefill": {"native_prefill": UNITS["native_prefill"]},
        "linear": LINEAR_UNITS,
    }
    return names[section]


def all_absent(section: str, why: str) -> dict:
    return {name: absent(unit, why) for name, unit in section_names(section).items()}


# ---------------------------------------------------------------- sections
def run_driver(sizes: Sizes, notes: dict) -> dict:
    from device_facts_driver import driver_facts

    facts, notes["runtime_library"] = driver_facts(torch.cuda.current_device())
    return facts


def run_rates(sizes: Sizes, notes: dict) -> dict:
    from device_facts_rates import bandwidths, graph_gap, launch_overhead, matmul_rates

    facts = bandwidths(sizes.copy_bytes, sizes.rate_repeats)
    facts.update(matmul_rates(sizes.matmul_n, sizes.rate_repeats))
    facts.update(launch_overhead(sizes.launches, sizes.launch_repeats))
    facts.update(graph_gap(sizes.launches, sizes.launch_repeats))
    return facts


def v1_guess() -> int:
    """The profile's prediction of V1's reach (where the bisection starts)."""
    try:
        from attn_core import detect_device_spec
        from engine_patch.native import v1_max_seq_len

        spec = detect_device_spec(torch.device("cuda"))
        return v1_max_seq_len(spec, 16, 256, 2) or 8048
    except Exception:  # only a starting point: the BI-V100 profile's 8048
        return 8048


def run_v1(sizes: Sizes, notes: dict) -> dict:
    from device_facts_v1 import v1_facts

    if importlib.util.find_spec("vllm") is None:
        return all_absent("v1", "vLLM is not installed here: no compiled paged_attention_v1")
    return v1_facts(v1_guess(), sizes.v1_cap, sizes.probe_timeout_s)


def run_tiers(sizes: Sizes, notes: dict) -> dict:
    from device_facts_tiers import measure_tiers, native_kernels, native_library

    device = torch.device("cuda")
    try:
        lib, why = native_library(device)
    except Exception as exc:  # the native module's own failure is data about it
        lib, why = None, f"attn_core.native raised {type(exc).__name__}: {exc}"
    native = {"available": lib is not None, "detail": why}
    rows = measure_tiers(sizes.tier_batches, sizes.tier_contexts, sizes.tier_repeats, device, lib)
    timed = [r for r in rows if r.get("eager_s") is not None or r.get("graph_s") is not None]
    failed = [r for r in rows if r not in timed]
    method = (
        "attn_core.paged_decode on plans with DecodeOverrides(tier=...) (and the native kernel's "
        "launch_decode, one partition and its plan's partitioning), 24 q / 4 kv heads, head 256, "
        f"block 16, fp16, eager (CUDA events) and CUDA-graph replay, median of {sizes.tier_repeats}"
    )
    facts = {
        "decode_tiers": measured(timed, "s", method),
        "native_decode": measured(
            native,
            "",
            "attn_core.native load_library (no build) + verify against the float64 reference",
        ),  # fmt: skip
        "native_kernels": native_kernels(lib, why, device),
    }
    if failed:
        facts["decode_tier_errors"] = measured(failed, "", "rows whose every timing raised")
    return facts


def run_prefill(sizes: Sizes, notes: dict) -> dict:
    from device_facts_prefill import prefill_facts

    return prefill_facts(
        sizes.prefill_chunk, sizes.prefill_context, sizes.prefill_repeats, torch.device("cuda")
    )


def run_linear(sizes: Sizes, notes: dict) -> dict:
    from device_facts_linear import linear_facts

    return linear_facts(
        sizes.linear_prompt, sizes.linear_batches, sizes.linear_repeats, torch.device("cuda")
    )


RUNNERS = {
    "driver": run_driver,
    "rates": run_rates,
    "v1": run_v1,
    "tiers": run_tiers,
    "prefill": run_prefill,
    "linear": run_linear,
}


# ---------------------------------------------------------------- reporting
def table(facts: dict) -> str:
    from tabulate import tabulate

    rows = []
    for name, f in facts.items():
        if is_absent(f):
            rows.append([name, "-", f.get("unit", ""), f"absent: {f['absent']}"[:110]])
        else:
            value = f["value"]
            shown = f"{value:.4g}" if isinstance(value, float) else json.dumps(value)
            shown = shown if len(shown) <= 40 else shown[:37] + "..."
            rows.append([name, shown, f.get("unit", ""), f["method"][:110]])
    return tabulate(rows, headers=["fact", "value", "unit", "method"], tablefmt="github")


def junit_xml(results: dict) -> str:
    cases = []
    for name, r in results.items():
        body = ""
        if r["status"] == "skipped":
            body = f"<skipped message={quoteattr(r['why'])}/>"
        elif r["status"] == "error":
            body = f"<error message={quoteattr(r['why'])}>{escape(r['trace'])}</error>"
        cases.append(f'<testcase classname="device-facts" name={quoteattr(name)} '
                     f'time="{r["seconds"]}">{body}</testcase>')  # fmt: skip
    return ('<?xml version="1.0" encoding="utf-8"?>\n<testsuites><testsuite name="device-facts">'
            + "".join(cases) + "</testsuite></testsuites>\n")  # fmt: skip


# ---------------------------------------------------------------- main
def write_facts(args, device, cuda, sizes, facts, notes, results, t_start) -> dict:
    doc = document(
        target=args.target,
        device_name=torch.cuda.get_device_name() if device == "cuda" and cuda else "cpu",
        torch_version=torch.__version__,
        quick=args.quick,
        facts=facts,
        sizes=dataclasses.asdict(sizes),
        sections={k: {"status": v["status"], "seconds": v["seconds"]} for k, v in results.items()},
        platform={
            "torch_cuda": torch.version.cuda,
            "corex": getattr(torch.version, "corex", None),
            **notes,
        },  # fmt: skip
        suite_seconds=round(time.monotonic() - t_start, 2),
    )
    write_atomic(args.out / FACTS_FILE, json.dumps(doc, indent=1) + "\n")  # never half a file
    return doc


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=Path("results"))
    p.add_argument("--junit", type=Path)
    p.add_argument("--quick", action="store_true", default=os.environ.get("HIL_QUICK") == "1")
    p.add_argument(
        "--device", default=os.environ.get("HIL_DEVICE", ""), choices=("", "cuda", "cpu")
    )
    p.add_argument("--target", default=os.environ.get("HIL_TARGET") or "local")
    p.add_argument(
        "--sections",
        default=os.environ.get("HIL_DF_SECTIONS") or ",".join(SECTIONS),
        help=f"comma-separated subset of {','.join(SECTIONS)} "
        "(default: $HIL_DF_SECTIONS, else all)",
    )
    args = p.parse_args(argv)
    chosen = [s.strip() for s in args.sections.split(",") if s.strip()]
    unknown = sorted(set(chosen) - set(SECTIONS))
    if unknown or not chosen:
        p.error(f"--sections must name some of {', '.join(SECTIONS)}, got {args.sections!r}")
    args.sections = chosen
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    t_start = time.monotonic()
    cuda = torch.cuda.is_available()
    device = args.device or ("cuda" if cuda else "cpu")
    sizes = QUICK if args.quick else FULL
    args.out.mkdir(parents=True, exist_ok=True)
    facts: dict = {}
    notes: dict = {}
    results: dict = {}
    no_gpu = None
    if device != "cuda":
        no_gpu = f"no CUDA device on this run (device {device}, torch.cuda.is_available() {cuda})"
    elif not cuda:
        no_gpu = "device cuda asked for, but torch.cuda.is_available() is False"
    for section in args.sections:
        t0 = time.monotonic()
        print(f"[device-facts] {section} ({'quick' if args.quick else 'full'})", flush=True)
        if no_gpu:
            facts.update(all_absent(section, no_gpu))
            results[section] = {"status": "skipped", "why": no_gpu}
        else:
            try:
                facts.update(RUNNERS[section](sizes, notes))
                results[section] = {"status": "passed"}
            except Exception as exc:  # a bug or a device error: the other sections still run
                trace = traceback.format_exc()
                print(trace, flush=True)
                why = f"the {section} section raised {type(exc).__name__}: {exc}"[:300]
                for name, fact in all_absent(section, why).items():
                    facts.setdefault(name, fact)
                results[section] = {"status": "error", "why": why, "trace": trace}
            torch.cuda.empty_cache()
        results[section]["seconds"] = round(time.monotonic() - t0, 2)
        # after every section, so a suite the watchdog kills later still leaves what it measured
        write_facts(args, device, cuda, sizes, facts, notes, results, t_start)
    doc = write_facts(args, device, cuda, sizes, facts, notes, results, t_start)
    text = table(facts)
    print(text, flush=True)
    write_atomic(args.out / "device_facts_table.md", text + "\n")
    if args.junit:
        write_atomic(args.junit, junit_xml(results))
    print(f"[device-facts] wrote {args.out / FACTS_FILE} in {doc['suite_seconds']} s", flush=True)
    return 1 if any(r["status"] == "error" for r in results.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
