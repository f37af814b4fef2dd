"""``python -m attn_sim {report,gates,update-baseline,calibrate,sweep,occupancy,profile-from}``.

Exit codes: 0 done (gates: every check passed); 1 ``gates`` only: a gate failed; 2 bad usage
or bad input (an argument, a file or a key in it; an output that cannot be written), with a
message naming it. Inputs and outputs are checked before any simulation runs.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Optional

from tabulate import tabulate

from attn_core.core.files import write_atomic
from attn_core.device.spec import DEVICE_SPECS
from attn_sim import cli_args, config

PROG = "python -m attn_sim"
SCRIPT = "attn-sim"  # the console script (packages/sim/pyproject.toml)


def prog() -> str:
    """The name this process was started by: the console script's, else ``python -m``'s."""
    return SCRIPT if Path(sys.argv[0]).name == SCRIPT else PROG


EXIT_OK, EXIT_GATE_FAILED, EXIT_BAD_INPUT = 0, 1, 2


def plain(text: str) -> str:
    """A docstring's text for ``--help``: reST's double backticks dropped (argparse prints them
    as they are)."""
    return text.replace("``", "")


def _report(args) -> int:
    from attn_sim import report
    from attn_sim.gates import run_gates

    out = cli_args.writable_dir(args.out, "--out")
    built = report.build(args.profile, args.shape)
    paths = report.write(built, out)
    # the gates on this profile (a few seconds next to the report's minutes), for the verdict
    gated = run_gates([args.profile], config.load_gates(), config.load_baseline())
    wrote = f"wrote {', '.join(map(str, paths))} in {built['elapsed_s']:.1f} s"
    print(report_summary(built, report.markdown(built), out, gated, full=args.full, wrote=wrote))
    return EXIT_OK


def report_summary(built: dict, text: str, out: Path, gated, *, full: bool, wrote: str = "") -> str:
    """What ``report`` prints: the BI-V100 caveat first (one sentence), the headline table (or
    the whole report), where the rest is, and last a verdict of the gates on this profile with
    what to do next."""
    from attn_sim.report import headline
    from attn_sim.report_text import caveat

    lines = [caveat(built) or ""] if caveat(built) else []
    body = text if full else headline(text)
    if lines:  # said once, first: not again inside the headline
        body = body.replace(f"{lines[0]}\n\n", "", 1)
    lines.append(body)
    if not full:
        lines.append(
            f"(the headline table; the full report, {len(text.splitlines())} lines: "
            f"{out / 'report.md'}, or --full; the plot: {out / 'report.png'})"
        )
    if wrote:
        lines.append(wrote)
    profile = built["profile"]
    if gated.ok:
        lines.append(
            f"verdict: gates passed on {profile} ({gated.checks} gate checks); next: read "
            f"{out / 'report.md'}, or run `{prog()} gates` for every gated profile"
        )
    else:
        lines.append(
            f"verdict: gates FAILED on {profile} ({len(gated.violations)} of {gated.checks} "
            f"gate checks); next: `{prog()} gates --profiles {profile}` names each failure"
        )
    return "\n".join(lines)


def _gate_specs(args, gates: dict) -> list:
    """``--profiles`` when given, else the gates file's list (each loaded, errors named)."""
    if args.profiles is not None:
        return args.profiles
    source = args.gates or config.GATES_FILE
    specs = []
    for i, name in enumerate(gates["profiles"]):
        try:
            specs.append(cli_args.profile(name))
        except argparse.ArgumentTypeError as err:
            raise ValueError(f"gates file {source}: profiles[{i}]: {err}") from None
    return specs


def _gates(args) -> int:
    from attn_sim.gates import format_violations, run_gates

    gates = config.load_gates(args.gates)
    baseline = config.load_baseline(args.baseline, missing_ok=args.baseline is None)
    specs = _gate_specs(args, gates)
    # '' writes nothing, so --out takes no path_text; ~ expanded as there
    out = cli_args.writable_dir(os.path.expanduser(args.out), "--out") if args.out else None
    where = "--profiles" if args.profiles is not None else f"{args.gates or config.GATES_FILE}"
    print(f"gates on {', '.join(s.name for s in specs)} (from {where})")
    report = run_gates(specs, gates, baseline)
    failed = {(v.profile, v.case) for v in report.violations}
    rows = [r for r in _case_rows(report.results, baseline) if (r["profile"], r["case"]) in failed]
    if rows:  # the cases that failed a check; the rest are in gates.json
        print(tabulate(rows, headers="keys", tablefmt="github"))
    text = format_violations(report)
    print(text)
    print(_gates_verdict(report.ok, out))
    if out is not None:
        payload = {
            "ok": report.ok,
            "checks": report.checks,
            "profiles": [s.name for s in specs],
            "violations": [v.__dict__ for v in report.violations],
            "results": [r.to_json() for r in report.results],
        }
        write_atomic(out / "gates.json", json.dumps(payload, indent=1, default=str))
        write_atomic(out / "gates.txt", text + "\n")
    return EXIT_OK if report.ok else EXIT_GATE_FAILED


def _gates_verdict(ok: bool, out: Optional[Path]) -> str:
    """The last line: passed or failed, and what to do next."""
    where = f" (every case: {out / 'gates.json'})" if out is not None else ""
    if ok:
        return f"verdict: gates passed; nothing to do{where}"
    return (
        f"verdict: gates FAILED; fix what the table names, or, if the change is intended, "
        f"accept the new numbers with `{prog()} update-baseline` and commit baseline.json{where}"
    )


def _case_rows(results, baseline: dict) -> list:
    rows = []
    for r in results:
        known = baseline.get("profiles", {}).get(r.profile, {}).get(r.label)
        base_ms = known["time_s"] * 1e3 if known else None
        rows.append(
            {
                "profile": r.profile,
                "case": r.label,
                "tier": r.tier,
                "launches": r.launches,
                "syncs": r.syncs,
                "transient/KV": round(r.transient_bytes / r.kv_bytes, 2),
                "time_ms": round(r.time_s * 1e3, 4),
                "baseline_ms": round(base_ms, 4) if base_ms else None,
                "change_%": round(100 * (r.time_s * 1e3 / base_ms - 1), 1) if base_ms else None,
            }
        )
    return rows


def _update_baseline(args) -> int:
    from attn_sim.gates import baseline_from, gated_cases
    from attn_sim.simulate import simulate

    gates = config.load_gates(args.gates)
    previous = config.load_baseline(args.baseline)
    specs = _gate_specs(args, gates)
    target = cli_args.writable_file(str(args.baseline or config.BASELINE_FILE), "--baseline")
    results = [simulate(s, c) for s in specs for c in gated_cases(gates)]
    path = config.save_baseline(baseline_from(results, previous), target)
    rows = [(r.profile, r.label, f"{r.time_s * 1e3:.4f}") for r in results]
    print(tabulate(rows, headers=("profile", "case", "time_ms"), tablefmt="github"))
    print(f"wrote {path}")
    return EXIT_OK


def _calibrate(args) -> int:
    from attn_sim import calibrate

    cli_args.readable_file(args.measurements, "measurements file")  # inputs before outputs
    out = cli_args.writable_dir(args.out, "--out")
    result = calibrate.run(args.profile, Path(args.measurements), out, args.variant)
    rows = calibrate.compact_rows(result["rows"])
    print(tabulate(rows, headers="keys", tablefmt="github", floatfmt=".3f"))
    fields = [
        (k, result["before"][k], v, "fitted" if k in result["fitted_terms"] else "kept")
        for k, v in result["fields"].items()
    ]
    print(tabulate(fields, headers=("constant", "before", "calibrated", ""), tablefmt="github"))
    for line in calibrate.launch_warnings(result["rows"])[:6]:
        print(line)
    print("\n".join(calibrate.verdicts(result, args.tolerance)))
    print(f"wrote {result['profile']} and {out / 'calibration.json'}")
    return EXIT_OK


def _sweep(args) -> int:
    from attn_sim.sweep import sweep_design, sweep_plan, sweep_prefill

    out = cli_args.writable_dir(args.out, "--out")
    payload = {}
    for spec in args.profile:
        plan_rows, design_rows = sweep_plan(spec), sweep_design(spec)
        prefill_rows = sweep_prefill(spec)
        payload[spec.name] = {"plan": plan_rows, "design": design_rows, "prefill": prefill_rows}
        print(f"## {spec.name}: attn-core decode plan constants (traced, relative to defaults)")
        print(tabulate(plan_rows, headers="keys", tablefmt="github"))
        print(f"## {spec.name}: GQA kernel design at 100K, batch 1 (analytic)")
        print(tabulate(design_rows, headers="keys", tablefmt="github"))
        print(f"## {spec.name}: attn-core prefill tiles (traced, 2K chunk at 32K/100K)")
        print(tabulate(prefill_rows, headers="keys", tablefmt="github"))
    write_atomic(out / "sweep.json", json.dumps(payload, indent=1, default=str))
    print(f"wrote {out / 'sweep.json'}")
    return EXIT_OK


def _occupancy(args) -> int:
    from attn_sim.occupancy import blocks_per_sm, waves

    spec = args.profile
    occ = blocks_per_sm(spec, args.threads, args.registers, args.smem)
    rows = [(k, v) for k, v in occ.limits.items()]
    print(tabulate(rows, headers=("limit", "blocks/SM"), tablefmt="github"))
    print(f"{spec.name}: {occ.blocks_per_sm} blocks/SM, limited by {occ.limiter}")
    if args.blocks and occ.blocks_per_sm:
        w = waves(spec, args.blocks, occ.blocks_per_sm)
        print(f"{args.blocks} blocks: {w.waves} waves, tail {w.tail_utilisation:.0%} busy")
    return EXIT_OK


def _profile_from(args) -> int:
    from attn_sim import profile_from

    return profile_from.main(args.facts, args.base, args.name, args.out)


def _path(text: str) -> Path:
    return Path(cli_args.path_text(text))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=prog(),
        description=plain(__doc__.split("\n\n")[0]),
        epilog="exit codes: 0 done, 1 a gate failed (gates), 2 bad usage or input",
    )
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("report", help="tables, plot and JSON for one profile")
    p.add_argument(
        "--profile", type=cli_args.profile, default="bi-v100", help="built-in name or JSON file"
    )
    p.add_argument(
        "--out", type=cli_args.path_text, default="sim-report", help="directory (created)"
    )
    p.add_argument(
        "--full", action="store_true", help="print the whole report, not the headline table"
    )
    p.add_argument(
        "--shape",
        type=cli_args.shape,
        default="24,4,256,16",
        help="heads,kv_heads,head_size[,block] (default Qwen3.6)",
    )
    p.set_defaults(func=_report)

    for name, func, text in (
        ("gates", _gates, "check every gate; exit 1 with a table of what failed"),
        ("update-baseline", _update_baseline, "rewrite baseline.json from today's predictions"),
    ):
        p = sub.add_parser(name, help=text)
        p.add_argument(
            "--profiles",
            type=cli_args.profiles,
            default=None,
            help="comma-separated names or files; default: the gates file's list",
        )
        p.add_argument("--gates", type=_path, default=None, help="thresholds file (TOML)")
        p.add_argument("--baseline", type=_path, default=None, help="baseline file (JSON)")
        if name == "gates":
            p.add_argument("--out", default="sim-report", help="directory; '' writes nothing")
        p.set_defaults(func=func)

    p = sub.add_parser("calibrate", help="fit bandwidth, rates, launch overhead to measurements")
    p.add_argument(
        "measurements", type=cli_args.path_text, help="decode bench / HIL long-context JSON"
    )
    p.add_argument("--profile", type=cli_args.profile, default="h200")
    p.add_argument(
        "--out",
        type=cli_args.path_text,
        default="sim-report/calibration",
        help="directory (created)",
    )
    p.add_argument(
        "--variant",
        default=None,
        help="keep records of this variant (default: attn-core's default plan)",
    )
    p.add_argument(
        "--tolerance",
        type=cli_args.positive_float,
        default=25.0,
        help="held-out |error| %% for PASS (the issue's)",
    )
    p.set_defaults(func=_calibrate)

    p = sub.add_parser("sweep", help="plan constants minimising predicted time")
    p.add_argument("--profile", type=cli_args.profiles, default="bi-v100,bi-v100-smem48k,h200")
    p.add_argument(
        "--out", type=cli_args.path_text, default="sim-report", help="directory (created)"
    )
    p.set_defaults(func=_sweep)

    p = sub.add_parser("occupancy", help="blocks per SM of one kernel on a profile")
    p.add_argument("--profile", type=cli_args.profile, default="bi-v100")
    p.add_argument("--threads", type=cli_args.positive_int, required=True)
    p.add_argument("--registers", type=cli_args.non_negative_int, default=32)
    p.add_argument(
        "--smem", type=cli_args.non_negative_int, default=0, help="static + dynamic bytes"
    )
    p.add_argument(
        "--blocks", type=cli_args.non_negative_int, default=0, help="grid size, to count waves"
    )
    p.set_defaults(func=_occupancy)

    p = sub.add_parser(
        "profile-from", help="a profile JSON from a device-facts file (HIL device-facts suite)"
    )
    p.add_argument(
        "facts",
        type=cli_args.path_text,
        help="device-facts JSON (schema bi100-attn/device-facts/1)",
    )
    p.add_argument("--base", choices=sorted(DEVICE_SPECS), default="bi-v100")
    p.add_argument(
        "--name", default=None, help="profile name, '<base>+...' (default <base>+<target>)"
    )
    p.add_argument(
        "--out",
        type=cli_args.path_text,
        default=None,
        help="profile file (default sim-report/<name>.json)",
    )
    p.set_defaults(func=_profile_from)
    return parser


def main(argv: Optional[list[str]] = None) -> int:
    """Run one command; returns the exit code (never raises for bad input)."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as stop:  # argparse: --help (0) or a usage error (2), already printed
        return stop.code if isinstance(stop.code, int) else EXIT_BAD_INPUT
    try:
        return args.func(args)
    except ValueError as err:
        print(f"{prog()} {args.command}: error: {err}", file=sys.stderr)
    except OSError as err:  # a write that failed after the checks (disk full, path vanished)
        where = err.filename or "an output"
        print(
            f"{prog()} {args.command}: error: cannot write {where}: {err.strerror}",
            file=sys.stderr,
        )
    return EXIT_BAD_INPUT
