"""Is this Iluvatar CoreX? The one answer attn-core, its native loader and engine-patch share.

On Iluvatar the GPU shows up as ``cuda`` through torch 2.1.0+corex, so "is it CUDA" says
nothing. The signs: the torch build (``torch.version.corex``, or "corex" in the version) and
the device name (the driver says "Iluvatar BI-V100"; :data:`NAME_MARKS`). engine-patch adds
its process-wide override and the toolkit directory on top (:mod:`engine_patch.platform`), for
the plugin-loading moment when CUDA must not be initialised yet.
"""

from __future__ import annotations

from typing import Optional

import torch

# Lower-case fragments of an Iluvatar device name or build string.
NAME_MARKS = ("iluvatar", "bi-v100", "bi100", "corex")


def iluvatar_name(name: str) -> bool:
    """Whether a device name (or a torch build string) is an Iluvatar one."""
    text = name.lower()
    return any(mark in text for mark in NAME_MARKS)


def corex_torch(build: Optional[str] = None) -> bool:
    """Whether this torch (or the ``build`` string given) is CoreX's build."""
    if build is not None:
        return "corex" in build.lower()
    return bool(getattr(torch.version, "corex", None)) or "corex" in torch.__version__.lower()


def is_iluvatar(device: torch.device) -> bool:
    """Whether ``device`` is an Iluvatar CoreX GPU (which exposes itself as ``cuda``)."""
    if device.type != "cuda" or not torch.cuda.is_available():
        return False
    if corex_torch():
        return True
    return iluvatar_name(torch.cuda.get_device_name(device))
