"""Targets and suites as data, read from TOML.

A target is one Docker host with its devices (``[targets.NAME]``); a suite is a named list of
steps (``[suites.NAME]``) run inside one container. The built-in suites live in
``hil/suites/suites.toml``; a targets file may add suites of its own (the fault-injection tests
do). Strings may use ``${VAR}`` / ``${VAR:-default}`` (defaults may nest), expanded from the
environment at load time. Every field error is a ConfigError (a ValueError) naming the file, the
dotted key, what was expected and what was found; everything is checked at load time, so a bad
value never reaches a container (a negative probe timeout would kill a healthy target's probe
and quarantine it):

- target, suite and step names become paths (``<out>/<target>/<suite>/<step>.xml``): each must
  be one safe path component;
- every key of a map is checked: ``suite_timeouts`` against the suites, ``build_args`` against
  the Dockerfile's ``ARG`` lines, ``environment`` and ``build_args`` names are variable names;
  ``build_args.PACKAGES`` names only the repository's packages;
- files and directories the config names are checked when it loads: a missing Dockerfile is an
  error; a wheels directory that is missing here is recorded in :attr:`Target.unusable` (the
  config is shared with laptops that lack the lab's directories), and a Docker run or plan of
  that target is refused with it before anything starts.
"""

from __future__ import annotations

import math
import os
import re
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Optional

from hil.config_values import (
    check_name,
    check_variable_name,
    dockerfile_args,
    expand,
)

EXECUTORS = ("docker", "local")
DEVICE_KINDS = ("cpu", "cuda")
# the packages an image can install (build argument PACKAGES): directories under packages/
IMAGE_PACKAGES = ("attn-core", "engine-patch", "sim")
DEFAULT_DOCKERFILE = "hil/docker/Dockerfile"
# a subset of what docker-py's parse_bytes accepts: bytes, or a number with b, k, m, g (kb...)
MEMORY_SIZE = re.compile(r"[0-9]+(\.[0-9]+)?([kmgKMG][bB]?|[bB])?")
MEMORY_UNITS = {"": 1, "b": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30}
# bounds on numbers from a config: a timeout past a week is a typo (the longest suite timeout
# in use is 7200 s), and a 400-digit one overflowed float() with a traceback; memory sizes past
# 1 PiB are no machine's
MAX_SECONDS = 7 * 24 * 3600.0
MAX_MEMORY_BYTES = 1 << 50


class ConfigError(ValueError):
    """A bad config value; ``str()`` names the file (when known) and the dotted key."""


def default_repo() -> Path:
    """The checkout this module lives in (hil/src/hil/config.py)."""
    return Path(__file__).resolve().parents[3]


def _expand(text: str, environ: Mapping[str, str], key: str) -> str:
    """expand() with the dotted key of the value in its error."""
    try:
        return expand(text, environ)
    except ValueError as exc:
        raise ConfigError(f"{key}: {exc}") from None


@dataclass(frozen=True)
class Step:
    """One step of a suite: a pytest run over payload paths, or a command.

    Command arguments may name ``{python}``, ``{payload}``, ``{out}`` and ``{junit}``; a command
    step with ``junit = true`` writes its own JUnit file at ``{junit}``.
    """

    name: str
    pytest: tuple[str, ...] = ()
    markers: str = ""
    command: tuple[str, ...] = ()
    junit: bool = False
    timeout_s: Optional[float] = None  # per-test for pytest steps, whole step for commands
    cwd: str = ""

    def __post_init__(self):
        check_name(self.name, "step name")  # the step's JUnit file is <name>.xml


@dataclass(frozen=True)
class Suite:
    name: str
    steps: tuple[Step, ...]
    timeout_s: float
    description: str = ""
    payload: tuple[str, ...] = ()  # repo-relative paths copied in besides the suite runner

    def __post_init__(self):
        check_name(self.name, "suite name")  # artifacts go to <out>/<target>/<suite>/


@dataclass(frozen=True)
class Target:
    name: str
    endpoint: str = "env"  # unix://, tcp://, ssh://, or "env" (DOCKER_HOST)
    device: str = "cpu"  # what probes and suites compute on: cpu | cuda
    devices: tuple[str, ...] = ()  # "/dev/iluvatar0" or "host:container:rwm"
    mounts: tuple[str, ...] = ()  # "/usr/local/corex:/usr/local/corex:ro"
    gpus: tuple[str, ...] = ()  # NVIDIA device requests: ("all",) or device ids
    base_image: str = "hil-base:bookworm"
    environment: Mapping[str, str] = field(default_factory=dict)
    network: str = "none"
    mem_limit: Optional[str] = None
    shm_size: Optional[str] = None
    python: str = "python3"
    wheels: str = ""  # a directory of wheels copied into the image build context
    suite_timeouts: Mapping[str, float] = field(default_factory=dict)
    test_timeout_s: float = 600.0
    probe_timeout_s: float = 120.0
    build_timeout_s: float = 1800.0
    probe: tuple[str, ...] = ()  # overrides the probe command
    use_ssh_client: bool = False
    build_args: Mapping[str, str] = field(default_factory=dict)  # extra image build arguments
    dockerfile: str = ""  # repo-relative or absolute; default hil/docker/Dockerfile
    description: str = ""
    # why the docker executor cannot build this target's image here (a wheels directory that
    # does not exist on this machine), naming the file and key; "" when it can
    unusable: str = ""

    def __post_init__(self):
        check_name(self.name, "target name")  # artifacts go to <out>/<target>/

    def suite_timeout(self, suite: Suite) -> float:
        return float(self.suite_timeouts.get(suite.name, suite.timeout_s))


@dataclass(frozen=True)
class Config:
    targets: Mapping[str, Target]
    suites: Mapping[str, Suite]
    path: Optional[Path] = None


def _typed(table: Mapping[str, Any], key: str, kind: type, where: str, default: Any) -> Any:
    if key not in table:
        return default
    value = table[key]
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        try:
            value = float(value)
        except OverflowError:
            raise ConfigError(
                f"{where}.{key} must be at most {MAX_SECONDS:g} seconds, got an integer of "
                f"{len(str(abs(value)))} digits"
            ) from None
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise ConfigError(
            f"{where}.{key} must be {kind.__name__}, got {type(value).__name__} ({value!r})"
        )
    if kind is float and not math.isfinite(value):
        raise ConfigError(f"{where}.{key} must be a finite number, got {value!r}")
    return value


def _seconds(table: Mapping[str, Any], key: str, where: str, default: Any, zero_ok=False) -> Any:
    """A timeout in seconds: > 0 (or >= 0 where 0 means "no per-test timeout")."""
    value = _typed(table, key, float, where, default)
    if value is not None and (value < 0 or (value == 0 and not zero_ok)):
        bound = ">= 0" if zero_ok else "> 0"
        raise ConfigError(f"{where}.{key} must be {bound} seconds, got {value!r}")
    if value is not None and value > MAX_SECONDS:
        raise ConfigError(
            f"{where}.{key} must be at most {MAX_SECONDS:g} seconds (a week), got {value!r}"
        )
    return value


def _table(value: Any, where: str) -> Mapping[str, Any]:
    if not isinstance(value, dict):
        raise ConfigError(f"{where} must be a table, got {type(value).__name__} ({value!r})")
    return value


def _str_table(table: Mapping[str, Any], key: str, where: str, environ) -> dict:
    """A table of string values named by variable names (environment, build_args), expanded."""
    raw = _typed(table, key, dict, where, {})
    out = {}
    for k, v in raw.items():
        if not isinstance(v, str):
            raise ConfigError(f"{where}.{key}.{k} must be a string, got {type(v).__name__} ({v!r})")
        check_variable_name(k, f"{where}.{key} key {k!r}")
        out[str(k)] = _expand(v, environ, f"{where}.{key}.{k}")
    return out


def _reject_unknown_map_keys(values: Mapping[str, Any], known, where: str, what: str) -> None:
    unknown = sorted(set(values) - set(known))
    if unknown:
        raise ConfigError(
            f"{where} names unknown {what} {', '.join(map(repr, unknown))}; known: {sorted(known)}"
        )


def _packages(value: str, where: str) -> None:
    """build_args.PACKAGES: names from IMAGE_PACKAGES, each once (they become paths under
    packages/ in the image's build context)."""
    names = value.split()
    bad = [n for n in names if n not in IMAGE_PACKAGES]
    repeated = sorted({n for n in names if names.count(n) > 1})
    if bad or repeated:
        raise ConfigError(
            f"{where} must name packages from {list(IMAGE_PACKAGES)} separated by spaces, each "
            f"once, got {value!r}"
        )


def _dockerfile(raw, where: str, environ, repo: Path) -> tuple:
    """(the dockerfile setting, the build arguments it declares); the file must exist."""
    setting = os.path.expanduser(_opt_str(raw, "dockerfile", where, environ) or "")
    path = Path(setting or DEFAULT_DOCKERFILE)
    path = path if path.is_absolute() else repo / path
    try:
        return setting, dockerfile_args(path)
    except OSError as exc:
        raise ConfigError(
            f"{where}.dockerfile names {path}, which cannot be read ({exc.strerror or exc}); "
            f"expected a Dockerfile, absolute or relative to the repository {repo}"
        ) from None


def _wheels_problem(wheels: str, where: str) -> str:
    if not wheels or Path(wheels).is_dir():
        return ""
    state = "is not a directory" if Path(wheels).exists() else "does not exist"
    return (
        f"{where}.wheels names {wheels}, which {state} on this machine; expected a directory of "
        "wheels for the image (set the variable it reads, or an empty string for none)"
    )


def _memory(table: Mapping[str, Any], key: str, where: str, environ) -> Optional[str]:
    value = _opt_str(table, key, where, environ)
    if value is not None and not MEMORY_SIZE.fullmatch(value):
        raise ConfigError(
            f"{where}.{key} must be a Docker memory size such as '512m', '4g' or '4gb' "
            f"(a number with an optional b, k, m or g suffix), got {value!r}"
        )
    if value is not None:
        number = value.rstrip("bBkKmMgG")
        unit = MEMORY_UNITS[value[len(number) :].lower()[:1]]
        if len(number) > 20 or float(number) * unit > MAX_MEMORY_BYTES:
            raise ConfigError(
                f"{where}.{key} must be at most {MAX_MEMORY_BYTES} bytes (1 PiB), got {value!r}"
            )
    return value


def _str_list(table: Mapping[str, Any], key: str, where: str, environ) -> tuple[str, ...]:
    value = _typed(table, key, list, where, [])
    for i, item in enumerate(value):
        if not isinstance(item, str):
            raise ConfigError(
                f"{where}.{key} must be a list of strings, got item {item!r} "
                f"({type(item).__name__}) at {where}.{key}[{i}]"
            )
    if environ is None:  # command steps: {python}-style placeholders, no ${VAR} expansion
        return tuple(value)
    return tuple(_expand(v, environ, f"{where}.{key}[{i}]") for i, v in enumerate(value))


def _opt_str(table, key, where, environ) -> Optional[str]:
    value = _typed(table, key, str, where, None)
    return None if value is None else _expand(value, environ, f"{where}.{key}")


def parse_step(raw: Any, where: str, environ) -> Step:
    raw = _table(raw, where)
    known = {"name", "pytest", "markers", "command", "junit", "timeout_s", "cwd"}
    _reject_unknown(raw, known, where)
    name = _typed(raw, "name", str, where, None)
    check_name(name, f"{where}.name")
    step = Step(
        name=name,
        pytest=_str_list(raw, "pytest", where, environ),
        markers=_typed(raw, "markers", str, where, ""),
        command=_str_list(raw, "command", where, None),
        junit=_typed(raw, "junit", bool, where, False),
        timeout_s=_seconds(raw, "timeout_s", where, None, zero_ok=True),
        cwd=_typed(raw, "cwd", str, where, ""),
    )
    if bool(step.pytest) == bool(step.command):
        raise ConfigError(f"{where} must have exactly one of 'pytest' or 'command', got {raw!r}")
    return step


def _payload(paths: tuple, where: str, repo: Path) -> tuple:
    """Repository-relative paths copied into the container: inside the repository (no
    absolute path, no ".."), and present when the config loads."""
    for i, rel in enumerate(paths):
        parts = Path(rel).parts
        if not rel.strip() or Path(rel).is_absolute() or ".." in parts:
            raise ConfigError(
                f"{where}.payload[{i}] must be a path inside the repository (relative, no "
                f"'..'), got {rel!r}"
            )
        if not (repo / rel).exists():
            raise ConfigError(
                f"{where}.payload[{i}] names {rel}, which does not exist under the repository "
                f"{repo}"
            )
    return paths


def parse_suite(name: str, raw: Any, environ, repo: Optional[Path] = None) -> Suite:
    where = f"suites.{name}"
    check_name(name, f"suites.{name!r}: the suite name")
    raw = _table(raw, where)
    _reject_unknown(raw, {"description", "timeout_s", "steps", "payload"}, where)
    steps_raw = _typed(raw, "steps", list, where, [])
    if not steps_raw:
        raise ConfigError(f"{where}.steps must list at least one step, got none")
    steps = tuple(parse_step(s, f"{where}.steps[{i}]", environ) for i, s in enumerate(steps_raw))
    names = [s.name for s in steps]
    if len(set(names)) != len(names):
        raise ConfigError(f"{where}.steps names must be unique, got {names}")
    timeout = _seconds(raw, "timeout_s", where, 1800.0)
    return Suite(
        name=name,
        steps=steps,
        timeout_s=timeout,
        description=_typed(raw, "description", str, where, ""),
        payload=_payload(_str_list(raw, "payload", where, environ), where, repo or default_repo()),
    )


_TARGET_KEYS = {
    "endpoint",
    "device",
    "devices",
    "mounts",
    "gpus",
    "base_image",
    "environment",
    "network",
    "mem_limit",
    "shm_size",
    "python",
    "wheels",
    "suite_timeouts",
    "test_timeout_s",
    "probe_timeout_s",
    "build_timeout_s",
    "probe",
    "use_ssh_client",
    "build_args",
    "dockerfile",
    "description",
}


def parse_target(
    name: str,
    raw: Any,
    environ,
    suite_names: Optional[Iterable[str]] = None,
    repo: Optional[Path] = None,
) -> Target:
    """One target; ``suite_names`` are what ``suite_timeouts`` may name (default: any), ``repo``
    what a relative ``dockerfile`` is relative to."""
    where = f"targets.{name}"
    check_name(name, f"targets.{name!r}: the target name")
    raw = _table(raw, where)
    _reject_unknown(raw, _TARGET_KEYS, where)
    endpoint = _expand(_typed(raw, "endpoint", str, where, "env"), environ, f"{where}.endpoint")
    if endpoint != "env" and not endpoint.startswith(("unix://", "tcp://", "ssh://", "npipe://")):
        raise ConfigError(
            f"{where}.endpoint must be unix://, tcp://, ssh:// or 'env', got {endpoint!r}"
        )
    device = _typed(raw, "device", str, where, "cpu")
    if device not in DEVICE_KINDS:
        raise ConfigError(f"{where}.device must be one of {DEVICE_KINDS}, got {device!r}")
    timeouts_raw = _typed(raw, "suite_timeouts", dict, where, {})
    suite_timeouts = {
        suite: _seconds(timeouts_raw, suite, f"{where}.suite_timeouts", None)
        for suite in timeouts_raw
    }
    if suite_names is not None:
        _reject_unknown_map_keys(suite_timeouts, suite_names, f"{where}.suite_timeouts", "suites")
    dockerfile, build_arg_names = _dockerfile(raw, where, environ, repo or default_repo())
    build_args = _str_table(raw, "build_args", where, environ)
    _reject_unknown_map_keys(build_args, build_arg_names, f"{where}.build_args", "build arguments")
    if "PACKAGES" in build_args:
        _packages(build_args["PACKAGES"], f"{where}.build_args.PACKAGES")
    wheels = os.path.expanduser(_opt_str(raw, "wheels", where, environ) or "")
    target = Target(
        name=name,
        endpoint=endpoint,
        device=device,
        devices=_str_list(raw, "devices", where, environ),
        mounts=_str_list(raw, "mounts", where, environ),
        gpus=_str_list(raw, "gpus", where, environ),
        base_image=_opt_str(raw, "base_image", where, environ) or "hil-base:bookworm",
        environment=_str_table(raw, "environment", where, environ),
        network=_typed(raw, "network", str, where, "none"),
        mem_limit=_memory(raw, "mem_limit", where, environ),
        shm_size=_memory(raw, "shm_size", where, environ),
        python=_typed(raw, "python", str, where, "python3"),
        wheels=wheels,
        suite_timeouts=suite_timeouts,
        test_timeout_s=_seconds(raw, "test_timeout_s", where, 600.0),
        probe_timeout_s=_seconds(raw, "probe_timeout_s", where, 120.0),
        build_timeout_s=_seconds(raw, "build_timeout_s", where, 1800.0),
        probe=_str_list(raw, "probe", where, environ),
        use_ssh_client=_typed(raw, "use_ssh_client", bool, where, False),
        build_args=build_args,
        dockerfile=dockerfile,
        description=_typed(raw, "description", str, where, ""),
        unusable=_wheels_problem(wheels, where),
    )
    for m in target.mounts:
        if len(m.split(":")) not in (2, 3):
            raise ConfigError(f"{where}.mounts entries must be 'host:container[:ro]', got {m!r}")
        if m.startswith("~"):  # a path on the Docker host (the lab over ssh): not our home
            raise ConfigError(
                f"{where}.mounts entries name paths on the Docker host, whose home this machine "
                f"does not know: write the host path absolute, got {m!r}"
            )
    return target


def _reject_unknown(raw: Mapping[str, Any], known: set, where: str) -> None:
    unknown = sorted(set(raw) - known)
    if unknown:
        raise ConfigError(f"{where} has unknown keys {unknown}; expected some of {sorted(known)}")


def parse_config(
    data: Mapping[str, Any],
    builtin_suites: Optional[Mapping[str, Any]] = None,
    environ: Optional[Mapping[str, str]] = None,
    path: Optional[Path] = None,
    repo: Optional[Path] = None,
) -> Config:
    """Targets from ``data["targets"]``; suites from the built-ins plus ``data["suites"]``.

    Strings expand at load time, so checked-in targets give defaults (``${LAB_HOST:-ssh://...}``)
    and a laptop can list the lab targets without the lab's variables.
    """
    environ = os.environ if environ is None else environ
    try:
        _reject_unknown(data, {"targets", "suites"}, "config")
        suites_raw = dict(_table(builtin_suites or {}, "suites"))
        suites_raw.update(_table(data.get("suites", {}), "suites"))
        suites = {name: parse_suite(name, raw, environ, repo) for name, raw in suites_raw.items()}
        targets = {
            name: parse_target(name, raw, environ, suites, repo)
            for name, raw in _table(data.get("targets", {}), "targets").items()
        }
        if not targets:
            raise ConfigError("config must define at least one [targets.NAME] table, got none")
    except ValueError as exc:  # every error gets the file's path in front of its key
        raise ConfigError(f"{path}: {exc}" if path else str(exc)) from None
    if path:
        for name, t in targets.items():
            if t.unusable:
                targets[name] = replace(t, unusable=f"{path}: {t.unusable}")
    return Config(targets=targets, suites=suites, path=path)


def load_toml(path: Path) -> dict:
    """The file's TOML; OSError / ConfigError (bad TOML) naming the path."""
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover - Python 3.10; the CLI checks that tomli is there first
        import tomli as tomllib

    with open(path, "rb") as f:
        try:
            return tomllib.load(f)
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
            raise ConfigError(f"{path}: not valid TOML: {exc}") from None
        except RecursionError:  # arrays or tables nested thousands deep
            raise ConfigError(
                f"{path}: nested deeper than the TOML parser can read (RecursionError); "
                "expected tables of targets and suites"
            ) from None


def load_config(
    path: Path,
    suites_path: Optional[Path],
    environ: Optional[Mapping[str, str]] = None,
    repo: Optional[Path] = None,
) -> Config:
    builtin = {}
    if suites_path:
        raw = load_toml(suites_path)
        try:
            _reject_unknown(raw, {"suites"}, "config")
            builtin = dict(_table(raw.get("suites", {}), "suites"))
            for name, suite in builtin.items():  # errors here name suites.toml, not the config
                parse_suite(name, suite, os.environ if environ is None else environ, repo)
        except ValueError as exc:
            raise ConfigError(f"{suites_path}: {exc}") from None
    return parse_config(load_toml(path), builtin, environ, path, repo)
