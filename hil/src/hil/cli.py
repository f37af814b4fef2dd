"""``python -m hil``: run suites on targets, list them, plan a run, or lift a quarantine.

    python -m hil [--target A,B] [--suite functional,long-context] [--executor docker|local]
                  [--config hil/targets.toml] [--out hil-results] [--state PATH]
                  [--recheck] [--quick] [--wheels DIR] [--dry-run] [--list-targets] [--quiet]
    python -m hil reset-target NAME [--state PATH]

Exit status: 0 all suites passed, 1 test failures, 2 hang, infrastructure error or refusal
(also for a bad command line or config).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Optional

from tabulate import tabulate

from hil.config import EXECUTORS, Config, load_config
from hil.logs import Console
from hil.quarantine import QuarantineStore, default_state_path
from hil.runner import RunContext, run_all
from hil.status import EXIT_HANG_OR_INFRA, EXIT_OK, exit_code
from hil.summary import render, write_summary

DEFAULT_SUITES = "functional,long-context"


def repo_root() -> Path:
    """``$HIL_REPO``, else the checkout this module lives in (hil/src/hil/cli.py), else cwd."""
    if os.environ.get("HIL_REPO"):
        return Path(os.environ["HIL_REPO"]).resolve()
    here = Path(__file__).resolve().parents[3]
    if (here / "hil" / "suites").is_dir() and (here / "packages").is_dir():
        return here
    return Path.cwd()


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m hil", description=__doc__.splitlines()[0])
    p.add_argument(
        "--config", type=Path, help="targets TOML (default: $HIL_CONFIG or hil/targets.toml)"
    )
    p.add_argument("--target", default="", help="comma-separated target names (default: all)")
    p.add_argument("--suite", default=DEFAULT_SUITES, help="comma-separated suite names")
    p.add_argument("--executor", choices=EXECUTORS, default="docker")
    p.add_argument("--out", type=Path, default=Path("hil-results"), help="artifacts root")
    p.add_argument(
        "--state",
        type=Path,
        help="quarantine state file (default: $HIL_STATE or ~/.local/state/bi100-hil/state.json)",
    )
    p.add_argument(
        "--recheck",
        action="store_true",
        help="probe quarantined targets and lift the quarantine if the probe passes",
    )
    p.add_argument(
        "--quick", action="store_true", help="tiny sizes (HIL_QUICK=1): for CPU containers in tests"
    )
    p.add_argument(
        "--wheels",
        default=os.environ.get("HIL_WHEELS", ""),
        help="wheels for the image build context (default: $HIL_WHEELS)",
    )
    p.add_argument("--run-id", default="", help="artifacts go to OUT/RUN_ID (default: time)")
    p.add_argument("--dry-run", action="store_true", help="print the plan, run nothing")
    p.add_argument("--list-targets", action="store_true")
    p.add_argument("--quiet", action="store_true", help="do not echo suite output")
    return p


def reset_target(argv: Sequence[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m hil reset-target")
    p.add_argument("name")
    p.add_argument("--state", type=Path)
    args = p.parse_args(argv)
    store = QuarantineStore(args.state or default_state_path())
    if store.release(args.name):
        print(f"target {args.name}: quarantine lifted ({store.path})")
    else:
        print(f"target {args.name} was not quarantined ({store.path})")
    return EXIT_OK


def load(args) -> Config:
    repo = repo_root()
    path = args.config or Path(os.environ.get("HIL_CONFIG") or repo / "hil" / "targets.toml")
    return load_config(path, repo / "hil" / "suites" / "suites.toml")


def pick(config: Config, args) -> tuple:
    names = [n for n in args.target.split(",") if n] or list(config.targets)
    unknown = [n for n in names if n not in config.targets]
    if unknown:
        raise ValueError(f"--target names unknown targets {unknown}; known: {list(config.targets)}")
    suites = [s for s in args.suite.split(",") if s]
    bad = [s for s in suites if s not in config.suites]
    if bad or not suites:
        raise ValueError(f"--suite must name suites from {list(config.suites)}, got {suites}")
    return [config.targets[n] for n in names], [config.suites[s] for s in suites]


def list_targets(config: Config, store: QuarantineStore) -> str:
    quarantined = store.all()
    rows = []
    for t in config.targets.values():
        q = quarantined.get(t.name)
        rows.append(
            [
                t.name,
                t.endpoint,
                t.device,
                ", ".join(t.devices + t.gpus) or "-",
                t.base_image,
                f"QUARANTINED: {q['reason']}" if q else "ok",
                t.description,
            ]
        )
    return tabulate(
        rows,
        headers=["target", "endpoint", "device", "devices", "base image", "state", "description"],
        tablefmt="github",
    )


def dry_run(targets, suites, args, store) -> str:
    lines = [f"executor: {args.executor}; artifacts under {args.out}/<run-id>/"]
    for t in targets:
        q = store.get(t.name)
        state = f"QUARANTINED ({q['reason']}): would be refused" if q else "ok"
        if q and args.recheck:
            state += ", unless the --recheck probe passes"
        lines.append(
            f"target {t.name} [{t.endpoint}, device {t.device}, network {t.network}, "
            f"mem {t.mem_limit or '-'}]: {state}"
        )
        if args.executor == "docker":
            from hil.image import content_tag, context_files, packages_of

            repo = repo_root()
            dockerfile = Path(t.dockerfile or "hil/docker/Dockerfile")
            dockerfile = dockerfile if dockerfile.is_absolute() else repo / dockerfile
            build_args = {"BASE_IMAGE": t.base_image, "PYTHON": t.python, **t.build_args}
            wheels = t.wheels or args.wheels
            files = context_files(repo, dockerfile, wheels, packages_of(build_args))
            tag = content_tag(files, build_args)
            lines.append(f"  image {tag} from {t.base_image} ({len(files)} context files)")
        lines.append(f"  probe (timeout {t.probe_timeout_s:g} s)")
        for s in suites:
            lines.append(
                f"  suite {s.name} (timeout {t.suite_timeout(s):g} s, "
                f"per-test {t.test_timeout_s:g} s): " + ", ".join(step.name for step in s.steps)
            )
            lines.append("  probe")
    return "\n".join(lines)


def main(argv: Optional[Sequence[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "reset-target":
        return reset_target(argv[1:])
    args = build_parser().parse_args(argv)
    store = QuarantineStore(args.state or default_state_path())
    try:
        config = load(args)
        if args.list_targets:
            print(list_targets(config, store))
            return EXIT_OK
        targets, suites = pick(config, args)
    except (ValueError, OSError) as exc:
        print(f"hil: {exc}", file=sys.stderr)
        return EXIT_HANG_OR_INFRA
    if args.dry_run:
        print(dry_run(targets, suites, args, store))
        return EXIT_OK
    run_id = args.run_id or time.strftime("%Y%m%d-%H%M%S")
    ctx = RunContext(
        repo=repo_root(),
        out=args.out / run_id,
        run_id=run_id,
        store=store,
        console=Console(echo=not args.quiet),
        executor=args.executor,
        recheck=args.recheck,
        quick=args.quick,
        wheels=args.wheels,
    )
    results = run_all(targets, suites, ctx)
    write_summary(ctx.out / "summary.json", results, run_id)
    print(render(results))
    code = exit_code(results)
    print(f"exit {code}; summary in {ctx.out / 'summary.json'}")
    return code
