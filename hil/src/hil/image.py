"""The HIL image: build context, content-hash tag, build through the Docker SDK.

The tag is ``bi100-hil:<hash>`` over the Dockerfile, the status check, every file of the three
packages' ``pyproject.toml`` + ``src``, the wheels (name and size: wheel names are immutable)
and the build arguments, so an unchanged tree reuses the image and any change rebuilds it.
"""

from __future__ import annotations

import hashlib
import io
import tarfile
import threading
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

from hil.config import IMAGE_PACKAGES
from hil.payload import SKIP_NAMES

IMAGE_REPO = "bi100-hil"
PACKAGES = IMAGE_PACKAGES
_build_locks: dict = {}
_locks_guard = threading.Lock()


class BuildFailed(RuntimeError):
    """The image build failed; the message ends with the build log's last lines."""


def packages_of(build_args: Mapping[str, str]) -> tuple[str, ...]:
    """The packages the image installs (build argument PACKAGES, default all three); a name
    that is not one of them is a ValueError (it would become a path under packages/)."""
    names = tuple(build_args.get("PACKAGES", " ".join(PACKAGES)).split())
    unknown = [n for n in names if n not in PACKAGES]
    if unknown:
        raise ValueError(
            f"build argument PACKAGES must name packages from {PACKAGES}, got {unknown}"
        )
    return names


def context_files(
    repo: Path, dockerfile: Path, wheels: str, packages: Iterable[str] = PACKAGES
) -> list[tuple[str, Path]]:
    """``(name in context, file)`` pairs, sorted; only the packages the image installs."""
    status_check = repo / "hil" / "docker" / "status-check.sh"
    files = [("Dockerfile", dockerfile), ("status-check.sh", status_check)]
    for pkg in packages:
        base = repo / "packages" / pkg
        files.append((f"packages/{pkg}/pyproject.toml", base / "pyproject.toml"))
        if (base / "setup.py").is_file():  # attn-core's build hook (the native kernel)
            files.append((f"packages/{pkg}/setup.py", base / "setup.py"))
        for path in sorted((base / "src").rglob("*")):
            rel = path.relative_to(base)
            egg = any(p.endswith(".egg-info") for p in rel.parts)
            skip = egg or SKIP_NAMES.intersection(rel.parts) or path.suffix == ".pyc"
            if path.is_file() and not skip:
                files.append((f"packages/{pkg}/{rel.as_posix()}", path))
    if wheels:
        for path in sorted(Path(wheels).glob("*.whl")):
            files.append((f"wheels/{path.name}", path))
    return sorted(files)


def content_tag(files: Iterable[tuple[str, Path]], build_args: Mapping[str, str]) -> str:
    h = hashlib.sha256()
    for name, path in files:
        h.update(name.encode() + b"\0")
        if name.startswith("wheels/"):
            h.update(str(path.stat().st_size).encode())
        else:
            h.update(path.read_bytes())
        h.update(b"\0")
    for key in sorted(build_args):
        h.update(f"{key}={build_args[key]}\0".encode())
    return f"{IMAGE_REPO}:{h.hexdigest()[:16]}"


def context_tar(files: Iterable[tuple[str, Path]]) -> io.BytesIO:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name in ("wheels", "packages"):  # COPY needs the directories even when empty
            info = tarfile.TarInfo(name)
            info.type, info.mode = tarfile.DIRTYPE, 0o755
            tar.addfile(info)
        for name, path in files:
            tar.add(path, arcname=name, recursive=False)
    buf.seek(0)
    return buf


def ensure_image(
    client,
    repo: Path,
    dockerfile: Path,
    wheels: str,
    build_args: Mapping[str, str],
    log: Callable[[str], None],
    timeout_s: float,
) -> str:
    """The image tag, built unless present. Raises BuildFailed with the log's tail."""
    import docker

    files = context_files(repo, dockerfile, wheels, packages_of(build_args))
    tag = content_tag(files, build_args)
    with _locks_guard:
        lock = _build_locks.setdefault((client.api.base_url, tag), threading.Lock())
    with lock:  # two targets on one engine build once
        try:
            client.images.get(tag)
            log(f"image {tag} is up to date")
            return tag
        except docker.errors.ImageNotFound:
            pass
        log(f"building image {tag} from {dockerfile} (base {build_args.get('BASE_IMAGE')})")
        lines: list[str] = []
        try:
            stream = client.api.build(
                fileobj=context_tar(files),
                custom_context=True,
                tag=tag,
                buildargs=dict(build_args),
                rm=True,
                forcerm=True,
                decode=True,
                network_mode="none",
                timeout=timeout_s,
            )
            for chunk in stream:
                if "stream" in chunk:
                    for line in chunk["stream"].splitlines():
                        if line.strip():
                            lines.append(line)
                            log(line)
                if "error" in chunk:
                    lines.append(chunk["error"])
                    log(chunk["error"])
                    raise BuildFailed(_tail(tag, lines))
        except docker.errors.APIError as exc:
            raise BuildFailed(f"building {tag}: {exc}") from exc
        try:
            client.images.get(tag)
        except docker.errors.ImageNotFound as exc:
            raise BuildFailed(_tail(tag, lines)) from exc
        return tag


def _tail(tag: str, lines: list[str]) -> str:
    return f"building {tag} failed: " + " | ".join(lines[-5:])
