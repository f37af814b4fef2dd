"""``python -m hil``: run suites on targets, list them, plan a run, or lift a quarantine.

    python -m hil [--target A,B] [--suite functional,long-context] [--executor docker|local]
                  [--config hil/targets.toml] [--out hil-results] [--state PATH] [--run-id ID]
                  [--recheck] [--quick] [--wheels DIR] [--dry-run] [--list-targets] [--quiet]
    python -m hil reset-target (NAME | --all | --repair) [--state PATH]

Exit status: 0 all suites passed, 1 test failures only, 2 hang, infrastructure error or refusal
(also for a bad command line, config or state file).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import re
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Optional

from hil.config import EXECUTORS, Config, load_config
from hil.logs import Console
from hil.quarantine import QuarantineStore, default_state_path
from hil.runner import RunContext, run_all
from hil.status import EXIT_HANG_OR_INFRA, EXIT_OK, exit_code
from hil.summary import render, wrap, write_summary

DEFAULT_SUITES = "functional,long-context"
# a run id is one path component under --out: no separators, no "..", no leading dot or dash
RUN_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")
EPILOG = """\
commands:
  python -m hil reset-target NAME [--state PATH]    lift NAME's quarantine
  python -m hil reset-target --all [--state PATH]   lift every quarantine
  python -m hil reset-target --repair [--state PATH]
                   move a corrupt state file aside (<name>.corrupt-<time>), start an empty one

exit status: 0 every suite passed; 1 test failures only; 2 a hang, an infrastructure error,
a refused (quarantined) target, or a bad command line, config or state file.
"""


# what this interpreter must have besides the standard library (hil/pyproject.toml), by the
# import name and the pip requirement; docker only for the docker executor's runs
REQUIRED = {"tabulate": "tabulate>=0.9"}
if sys.version_info < (3, 11):  # pragma: no cover - Python 3.10
    REQUIRED["tomli"] = "tomli>=1.1"
DOCKER_REQUIRED = {"docker": "docker>=7"}


def missing_packages(required: dict) -> str:
    """A message naming the packages of ``required`` this interpreter cannot import, or ""."""
    missing = [req for name, req in required.items() if importlib.util.find_spec(name) is None]
    if not missing:
        return ""
    reqs = " ".join(f"'{r}'" for r in missing)
    return (
        f"this Python ({sys.executable}) lacks the package(s) {', '.join(missing)}, which the "
        f"HIL runner needs; install them with `{sys.executable} -m pip install {reqs}` "
        "(or `pip install ./hil`)"
    )


SCRIPT = "hil"  # the console script (hil/pyproject.toml)


def prog() -> str:
    """The name this process was started by: the console script's, else ``python -m hil``."""
    return SCRIPT if Path(sys.argv[0]).name == SCRIPT else "python -m hil"


class UsageError(ValueError):
    """A bad argument: reported as ``hil: ...``, exit 2."""


def repo_root() -> Path:
    """``$HIL_REPO``, else the checkout this module lives in (hil/src/hil/cli.py), else cwd."""
    if os.environ.get("HIL_REPO"):
        return Path(os.environ["HIL_REPO"]).expanduser().resolve()
    here = Path(__file__).resolve().parents[3]
    if (here / "hil" / "suites").is_dir() and (here / "packages").is_dir():
        return here
    return Path.cwd()


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=prog(),
        description=__doc__.splitlines()[0],
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
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
    p = argparse.ArgumentParser(
        prog=f"{prog()} reset-target",
        description="Lift a target's quarantine, every quarantine, or repair a corrupt state file.",
    )
    what = p.add_mutually_exclusive_group(required=True)
    what.add_argument("name", nargs="?", help="the target whose quarantine to lift")
    what.add_argument("--all", action="store_true", help="lift every quarantine")
    what.add_argument(
        "--repair",
        action="store_true",
        help="move an unreadable state file aside to <name>.corrupt-<time> and start an empty one",
    )
    p.add_argument("--state", type=Path, help="state file (default: $HIL_STATE or ~/.local/...)")
    args = p.parse_args(argv)
    store = QuarantineStore(args.state or default_state_path())
    try:
        if args.repair:
            aside = store.repair()
            if aside is None:
                print(f"state file {store.path} is readable: nothing to repair")
            else:
                print(
                    f"state file {store.path}: the unreadable one is kept as {aside}; "
                    "started an empty one (re-quarantine targets from it by hand if needed)"
                )
        elif args.all:
            names = store.release_all()
            print(f"quarantine lifted for {', '.join(names) or 'no target'} ({store.path})")
        elif store.release(args.name):
            print(f"target {args.name}: quarantine lifted ({store.path})")
        else:
            print(f"target {args.name} was not quarantined ({store.path})")
    except (ValueError, OSError) as exc:
        print(f"hil: {exc}", file=sys.stderr)
        return EXIT_HANG_OR_INFRA
    return EXIT_OK


def load(args) -> Config:
    repo = repo_root()
    path = args.config or Path(os.environ.get("HIL_CONFIG") or repo / "hil" / "targets.toml")
    path = path.expanduser()
    try:
        return load_config(path, repo / "hil" / "suites" / "suites.toml", repo=repo)
    except OSError as exc:  # missing, a directory, unreadable: name the file and the option
        raise UsageError(
            f"config file {exc.filename or path} (--config / $HIL_CONFIG) cannot be read: "
            f"{exc.strerror or exc}"
        ) from None


def names_of(option: str, text: str) -> list:
    """Comma-separated names; an empty item or a repeated name is an error (a repeated target
    would run twice into one artifact directory), so it is refused rather than de-duplicated."""
    names = [n.strip() for n in text.split(",")]
    if text.strip() and "" in names:
        raise UsageError(f"{option} has an empty name in {text!r}; expected NAME[,NAME...]")
    names = [n for n in names if n]
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise UsageError(f"{option} names {repeated} more than once in {text!r}")
    return names


def pick(config: Config, args) -> tuple:
    names = names_of("--target", args.target) or list(config.targets)
    unknown = [n for n in names if n not in config.targets]
    if unknown:
        raise UsageError(f"--target names unknown targets {unknown}; known: {list(config.targets)}")
    suites = names_of("--suite", args.suite)
    bad = [s for s in suites if s not in config.suites]
    if bad or not suites:
        raise UsageError(f"--suite must name suites from {list(config.suites)}, got {suites}")
    targets = [config.targets[n] for n in names]
    if args.executor == "docker":  # the image inputs the config names must exist here
        for t in targets:
            if t.unusable:
                raise UsageError(f"target {t.name} cannot be built here: {t.unusable}")
    return targets, [config.suites[s] for s in suites]


def check_run_id(run_id: str) -> str:
    if not RUN_ID.fullmatch(run_id) or ".." in run_id:
        raise UsageError(
            f"--run-id must be one path component (letters, digits, '.', '_', '-'; "
            f"starting with a letter or digit; no '..'; at most 100 characters), got {run_id!r}"
        )
    return run_id


class RunFolderExists(UsageError):
    """``OUT/RUN_ID`` is there already: another run (or an earlier one) owns it."""


def prepare_out(out_root: Path, run_id: str, default_id: bool = False) -> tuple:
    """(``OUT/RUN_ID``, the run id), created by this run alone and writable, checked before any
    target is touched: a summary that cannot be written would lose the run's results.

    The folder is created exclusively, so two runs with one --out and --run-id cannot
    interleave one log or keep one summary: the second is refused (RunFolderExists). A default
    (time) run id that is taken gets ``-2``, ``-3``, ... instead.
    """
    if out_root.exists() and not out_root.is_dir():
        raise UsageError(f"--out {out_root} is a file, expected a directory (or a new path)")
    base, n = run_id, 1
    while True:
        out = out_root / run_id
        try:
            out_root.mkdir(parents=True, exist_ok=True)
            out.mkdir()
            break
        except FileExistsError:
            if not default_id:
                raise RunFolderExists(
                    f"--out {out_root} --run-id {run_id}: the run folder {out} already exists "
                    "(RunFolderExists: another run, or an earlier one, uses it); pass another "
                    "--run-id or remove that folder"
                ) from None
            n += 1
            run_id = f"{base}-{n}"
        except OSError as exc:
            raise UsageError(
                f"--out {out_root}: cannot write {out} ({exc.strerror or exc})"
            ) from None
    try:
        probe = out / ".hil-write-check"
        os.close(os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600))
        probe.unlink()
    except OSError as exc:
        raise UsageError(f"--out {out_root}: cannot write {out} ({exc.strerror or exc})") from None
    return out, run_id


def list_targets(config: Config, store: QuarantineStore) -> str:
    from tabulate import tabulate

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
                wrap(
                    f"QUARANTINED: {q['reason']}"
                    if q
                    else (f"docker runs refused: {t.unusable}" if t.unusable else "ok")
                ),
                wrap(t.description),
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
    missing = missing_packages(REQUIRED)
    if missing:
        print(f"hil: {missing}", file=sys.stderr)
        return EXIT_HANG_OR_INFRA
    if argv and argv[0] == "reset-target":
        return reset_target(argv[1:])
    args = build_parser().parse_args(argv)
    # paths a shell did not expand (quoted, --out=~/x, from the environment): ~ is the home
    args.out = args.out.expanduser()
    args.wheels = os.path.expanduser(args.wheels) if args.wheels else ""
    store = QuarantineStore(args.state or default_state_path())
    # ValueError: bad arguments, config (ConfigError names the file and key) or state file
    # (StateError names the file and the repair command); OSError: a file that cannot be read.
    try:
        run_id = check_run_id(args.run_id or time.strftime("%Y%m%d-%H%M%S"))
        if args.wheels and not Path(args.wheels).is_dir():
            raise UsageError(
                f"--wheels (default $HIL_WHEELS) {args.wheels} is not a directory; expected a "
                "directory of wheels"
            )
        config = load(args)
        if args.list_targets:
            print(list_targets(config, store))
            return EXIT_OK
        targets, suites = pick(config, args)
        if args.dry_run:
            print(dry_run(targets, suites, args, store))
            return EXIT_OK
        missing = missing_packages(DOCKER_REQUIRED if args.executor == "docker" else {})
        if missing:
            raise UsageError(f"--executor docker: {missing}")
        store.check_writable()
        store.all()  # a corrupt state file stops the run here, not in every worker
        out, run_id = prepare_out(args.out, run_id, default_id=not args.run_id)
    except (ValueError, OSError) as exc:
        print(f"hil: {exc}", file=sys.stderr)
        return EXIT_HANG_OR_INFRA
    ctx = RunContext(
        repo=repo_root(),
        out=out,
        run_id=run_id,
        store=store,
        console=Console(echo=not args.quiet),
        executor=args.executor,
        recheck=args.recheck,
        quick=args.quick,
        wheels=args.wheels,
    )
    results = run_all(targets, suites, ctx)
    print(render(results))
    code = exit_code(results)
    try:
        write_summary(ctx.out / "summary.json", results, run_id)
    except OSError as exc:
        print(f"hil: cannot write the summary {ctx.out / 'summary.json'}: {exc}", file=sys.stderr)
        return EXIT_HANG_OR_INFRA
    print(f"exit {code}; summary in {ctx.out / 'summary.json'}")
    return code
