"""Helpers shared by the HIL tests (a uniquely named module: several packages' test trees
each have a ``conftest``, so importing from ``conftest`` breaks a combined pytest run).
"""

from __future__ import annotations

import io
import os
import tarfile
import uuid
from pathlib import Path

from hil.config import Step, Suite, Target

REPO = Path(__file__).resolve().parents[2]
FAULTS = "hil/tests/faults"
DEFAULT_SOCKET = "unix:///run/hil-docker.sock"
# how a laptop starts the engine the docker tests need; the README says the same (it runs as
# root: dockerd, debootstrap, apt)
ENGINE_COMMAND = "bash .ci/docker-engine.sh"  # as root: sudo is not on every machine
LIGHT_WHEELS = ("pytest-", "pytest_timeout-", "pluggy-", "iniconfig-", "packaging-", "pygments-")


def light_target(host: str, wheels: Path, name: str = "", **changes) -> Target:
    fields = dict(
        name=name or f"light-{uuid.uuid4().hex[:6]}",
        endpoint=host,
        device="cpu",
        base_image=os.environ.get("HIL_BASE_IMAGE", "hil-base:bookworm"),
        wheels=str(wheels),
        build_args={"PACKAGES": "", "STATUS_CHECK": "0"},
        probe=("{python}", "-c", "print('probe ok')"),
        probe_timeout_s=60.0,
        test_timeout_s=60.0,
        mem_limit="512m",
    )
    fields.update(changes)
    return Target(**fields)


def tar_of(members: dict) -> io.BytesIO:
    """An uncompressed tar stream of ``{name: bytes}``, as a container's copy-out sends it."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    buf.seek(0)
    return buf


def fault_suite(name: str, *steps: tuple, timeout_s: float = 120.0) -> Suite:
    """Suite of pytest steps over fault files: ``(step name, file, per-test timeout or None)``."""
    built = tuple(Step(name=s, pytest=(f"{FAULTS}/{f}",), timeout_s=t) for s, f, t in steps)
    return Suite(name, built, timeout_s, payload=(FAULTS,))


OK = ("ok", "fault_ok.py", None)


def leftovers(client, run_id: str) -> list:
    """Containers of this run still on the engine (there must be none)."""
    found = client.containers.list(all=True, filters={"label": "bi100-hil"})
    return [c.name for c in found if c.name.startswith(f"hil-{run_id}-")]
