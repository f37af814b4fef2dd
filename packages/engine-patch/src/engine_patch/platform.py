"""Which platform this process runs on, and whether it is Iluvatar CoreX.

On Iluvatar the GPU shows up as ``cuda`` through torch 2.1.0+corex, so "is it CUDA" says nothing.
Any one of three signs is enough, because a Triton launch there hangs the GPU for good and a
false negative costs far more than a false positive:

- the device name (``torch.cuda.get_device_name`` contains "iluvatar" or "bi-v100"),
- the CoreX toolkit directory (``/usr/local/corex``),
- the torch build (``torch.__version__`` or ``torch.version.corex`` mentions "corex").

Detection is injectable for tests: pass the facts to :func:`detect_platform`, or set
``ENGINE_PATCH_PLATFORM=iluvatar`` / ``generic`` to override it for a whole process (used by
tests that run vLLM's own loader in a subprocess). The name and build tests are attn-core's
(:mod:`attn_core.device.iluvatar`), so both packages decide "Iluvatar" by one rule.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Optional

import torch

from attn_core.device.iluvatar import corex_torch, iluvatar_name
from engine_patch.settings import PLATFORM_ENV, PLATFORMS, platform_override

__all__ = ["COREX_ROOT", "PLATFORM_ENV", "Platform", "detect_platform"]
COREX_ROOT = "/usr/local/corex"


@dataclass(frozen=True)
class Platform:
    """What :func:`detect_platform` found.

    Attributes:
        is_iluvatar: any of the signs below was present (or the override said so).
        reasons: the signs that decided it, in words (empty on other platforms).
        device_name: the CUDA device name, or "cpu".
        torch_version: ``torch.__version__`` as seen.
    """

    is_iluvatar: bool
    reasons: tuple[str, ...]
    device_name: str
    torch_version: str

    @property
    def label(self) -> str:
        kind = "iluvatar" if self.is_iluvatar else "generic"
        return f"{kind} ({self.device_name}, torch {self.torch_version})"


def _cuda_device_name() -> str:
    """The device name, read only where CUDA is already initialised.

    vLLM loads plugins in the engine process before it forks its workers; initialising CUDA
    there (``get_device_name`` does) breaks the forked workers ("Cannot re-initialize CUDA in
    forked subprocess"). The toolkit directory and the torch build identify Iluvatar without it.
    """
    if not torch.cuda.is_available():
        return "cpu"
    if not torch.cuda.is_initialized():
        return "cuda (not initialised here; name not read)"
    try:
        return torch.cuda.get_device_name(torch.cuda.current_device())
    except Exception as exc:  # a broken driver must not break plugin loading
        return f"cuda (name unavailable: {exc})"


def _torch_build() -> str:
    corex = getattr(torch.version, "corex", None)
    return f"{torch.__version__} corex={corex}" if corex else torch.__version__


def detect_platform(
    *,
    device_name: Optional[str] = None,
    corex_root: Optional[str] = None,
    torch_build: Optional[str] = None,
    override: Optional[str] = None,
) -> Platform:
    """Decide whether this is Iluvatar; every fact can be injected (tests simulate Iluvatar).

    Args:
        device_name: the GPU name; default the first CUDA device's, or "cpu".
        corex_root: the toolkit directory to look for; default ``/usr/local/corex``.
        torch_build: torch's version/build string; default this torch's.
        override: "iluvatar" or "generic"; default ``ENGINE_PATCH_PLATFORM`` if set.

    Raises:
        ValueError: ``override`` (or ``ENGINE_PATCH_PLATFORM``) is neither, naming it.
    """
    name = _cuda_device_name() if device_name is None else device_name
    build = _torch_build() if torch_build is None else torch_build
    if override is None:
        forced = platform_override()
    elif override in PLATFORMS:
        forced = override
    else:
        raise ValueError(f"override must be one of {', '.join(PLATFORMS)}, got {override!r}")
    if forced:
        why = (f"{PLATFORM_ENV}={forced}",) if forced == "iluvatar" else ()
        return Platform(forced == "iluvatar", why, name, build)
    reasons: list[str] = []
    if iluvatar_name(name):  # attn-core's one Iluvatar rule, on the name and the build
        reasons.append(f"device name {name!r}")
    root = COREX_ROOT if corex_root is None else corex_root
    if root and os.path.isdir(root):
        reasons.append(f"toolkit directory {root} exists")
    if corex_torch(build):
        reasons.append(f"torch build {build!r}")
    return Platform(bool(reasons), tuple(reasons), name, build)
