"""Targets and suites as data, read from TOML.

A target is one Docker host with its devices (``[targets.NAME]``); a suite is a named list of
steps (``[suites.NAME]``) run inside one container. The built-in suites live in
``hil/suites/suites.toml``; a targets file may add suites of its own (the fault-injection tests
do). Strings may use ``${VAR}`` / ``${VAR:-default}``, expanded from the environment at load time.
Every field error is a ValueError naming the field, what was expected and what was found.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

EXECUTORS = ("docker", "local")
DEVICE_KINDS = ("cpu", "cuda")
_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")


def expand(text: str, environ: Mapping[str, str]) -> str:
    """``${VAR}`` and ``${VAR:-default}``; an unset variable without default is an error."""

    def sub(m: re.Match) -> str:
        name, default = m.group(1), m.group(2)
        if name in environ and environ[name] != "":
            return environ[name]
        if default is not None:
            return default
        raise ValueError(f"environment variable {name} is not set (needed by {text!r})")

    return _VAR.sub(sub, text)


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


@dataclass(frozen=True)
class Suite:
    name: str
    steps: tuple[Step, ...]
    timeout_s: float
    description: str = ""
    payload: tuple[str, ...] = ()  # repo-relative paths copied in besides the suite runner


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
        value = float(value)
    if not isinstance(value, kind):
        raise ValueError(
            f"{where}.{key} must be {kind.__name__}, got {type(value).__name__} ({value!r})"
        )
    return value


def _str_list(table: Mapping[str, Any], key: str, where: str, environ) -> tuple[str, ...]:
    value = _typed(table, key, list, where, [])
    for item in value:
        if not isinstance(item, str):
            raise ValueError(f"{where}.{key} must be a list of strings, got item {item!r}")
    return tuple(expand(v, environ) for v in value)


def _opt_str(table, key, where, environ) -> Optional[str]:
    value = _typed(table, key, str, where, None)
    return None if value is None else expand(value, environ)


def parse_step(raw: Mapping[str, Any], where: str, environ) -> Step:
    known = {"name", "pytest", "markers", "command", "junit", "timeout_s", "cwd"}
    _reject_unknown(raw, known, where)
    name = _typed(raw, "name", str, where, None)
    if not name:
        raise ValueError(f"{where}.name must be a non-empty string, got {raw.get('name')!r}")
    step = Step(
        name=name,
        pytest=_str_list(raw, "pytest", where, environ),
        markers=_typed(raw, "markers", str, where, ""),
        command=tuple(_typed(raw, "command", list, where, [])),
        junit=_typed(raw, "junit", bool, where, False),
        timeout_s=_typed(raw, "timeout_s", float, where, None),
        cwd=_typed(raw, "cwd", str, where, ""),
    )
    if bool(step.pytest) == bool(step.command):
        raise ValueError(f"{where} must have exactly one of 'pytest' or 'command', got {raw!r}")
    return step


def parse_suite(name: str, raw: Mapping[str, Any], environ) -> Suite:
    where = f"suites.{name}"
    _reject_unknown(raw, {"description", "timeout_s", "steps", "payload"}, where)
    steps_raw = _typed(raw, "steps", list, where, [])
    if not steps_raw:
        raise ValueError(f"{where}.steps must list at least one step, got none")
    steps = tuple(parse_step(s, f"{where}.steps[{i}]", environ) for i, s in enumerate(steps_raw))
    names = [s.name for s in steps]
    if len(set(names)) != len(names):
        raise ValueError(f"{where}.steps names must be unique, got {names}")
    timeout = _typed(raw, "timeout_s", float, where, 1800.0)
    if timeout <= 0:
        raise ValueError(f"{where}.timeout_s must be > 0, got {timeout}")
    return Suite(
        name=name,
        steps=steps,
        timeout_s=timeout,
        description=_typed(raw, "description", str, where, ""),
        payload=_str_list(raw, "payload", where, environ),
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


def parse_target(name: str, raw: Mapping[str, Any], environ) -> Target:
    where = f"targets.{name}"
    _reject_unknown(raw, _TARGET_KEYS, where)
    endpoint = expand(_typed(raw, "endpoint", str, where, "env"), environ)
    if endpoint != "env" and not endpoint.startswith(("unix://", "tcp://", "ssh://", "npipe://")):
        raise ValueError(
            f"{where}.endpoint must be unix://, tcp://, ssh:// or 'env', got {endpoint!r}"
        )
    device = _typed(raw, "device", str, where, "cpu")
    if device not in DEVICE_KINDS:
        raise ValueError(f"{where}.device must be one of {DEVICE_KINDS}, got {device!r}")
    env_raw = _typed(raw, "environment", dict, where, {})
    environment = {str(k): expand(str(v), environ) for k, v in env_raw.items()}
    timeouts_raw = _typed(raw, "suite_timeouts", dict, where, {})
    suite_timeouts = {}
    for suite, value in timeouts_raw.items():
        if not isinstance(value, (int, float)) or value <= 0:
            raise ValueError(f"{where}.suite_timeouts.{suite} must be > 0 seconds, got {value!r}")
        suite_timeouts[suite] = float(value)
    target = Target(
        name=name,
        endpoint=endpoint,
        device=device,
        devices=_str_list(raw, "devices", where, environ),
        mounts=_str_list(raw, "mounts", where, environ),
        gpus=_str_list(raw, "gpus", where, environ),
        base_image=expand(_typed(raw, "base_image", str, where, "hil-base:bookworm"), environ),
        environment=environment,
        network=_typed(raw, "network", str, where, "none"),
        mem_limit=_opt_str(raw, "mem_limit", where, environ),
        shm_size=_opt_str(raw, "shm_size", where, environ),
        python=_typed(raw, "python", str, where, "python3"),
        wheels=expand(_typed(raw, "wheels", str, where, ""), environ),
        suite_timeouts=suite_timeouts,
        test_timeout_s=_typed(raw, "test_timeout_s", float, where, 600.0),
        probe_timeout_s=_typed(raw, "probe_timeout_s", float, where, 120.0),
        build_timeout_s=_typed(raw, "build_timeout_s", float, where, 1800.0),
        probe=_str_list(raw, "probe", where, environ),
        use_ssh_client=_typed(raw, "use_ssh_client", bool, where, False),
        build_args={
            str(k): expand(str(v), environ)
            for k, v in _typed(raw, "build_args", dict, where, {}).items()
        },
        dockerfile=expand(_typed(raw, "dockerfile", str, where, ""), environ),
        description=_typed(raw, "description", str, where, ""),
    )
    for m in target.mounts:
        if len(m.split(":")) not in (2, 3):
            raise ValueError(f"{where}.mounts entries must be 'host:container[:ro]', got {m!r}")
    return target


def _reject_unknown(raw: Mapping[str, Any], known: set, where: str) -> None:
    unknown = sorted(set(raw) - known)
    if unknown:
        raise ValueError(f"{where} has unknown keys {unknown}; expected some of {sorted(known)}")


def parse_config(
    data: Mapping[str, Any],
    builtin_suites: Optional[Mapping[str, Any]] = None,
    environ: Optional[Mapping[str, str]] = None,
    path: Optional[Path] = None,
) -> Config:
    """Targets from ``data["targets"]``; suites from the built-ins plus ``data["suites"]``.

    Strings expand at load time, so checked-in targets give defaults (``${LAB_HOST:-ssh://...}``)
    and a laptop can list the lab targets without the lab's variables.
    """
    environ = os.environ if environ is None else environ
    _reject_unknown(data, {"targets", "suites"}, "config")
    suites_raw = dict(builtin_suites or {})
    suites_raw.update(data.get("suites", {}))
    suites = {name: parse_suite(name, raw, environ) for name, raw in suites_raw.items()}
    targets = {}
    for name, raw in data.get("targets", {}).items():
        if not isinstance(raw, dict):
            raise ValueError(f"targets.{name} must be a table, got {type(raw).__name__}")
        targets[name] = parse_target(name, raw, environ)
    if not targets:
        raise ValueError("config must define at least one [targets.NAME] table, got none")
    return Config(targets=targets, suites=suites, path=path)


def load_toml(path: Path) -> dict:
    with open(path, "rb") as f:
        return tomllib.load(f)


def load_config(
    path: Path, suites_path: Optional[Path], environ: Optional[Mapping[str, str]] = None
) -> Config:
    builtin = load_toml(suites_path).get("suites", {}) if suites_path else {}
    return parse_config(load_toml(path), builtin, environ, path)
