"""Which :class:`DeviceSpec` profile a device gets: a forced name or file, else detection.

``ATTN_CORE_DEVICE`` (read through :mod:`attn_core.core.settings`) forces a profile by name
(``bi-v100``, ``h200``, ...) or names a profile JSON file (:mod:`attn_core.device.profile_file`);
otherwise a CUDA device is matched by name (H200 / H100 -> ``h200``, A100 -> ``a100``,
Iluvatar -> ``bi-v100``); a CUDA device no profile matches gets one built from its driver's
answers (:mod:`attn_core.device.driver_profile`), and only a run without a CUDA device defaults to
``bi-v100``.
"""

from __future__ import annotations

import functools
from typing import Optional

import torch

from attn_core.core.settings import current_overrides
from attn_core.device.driver_profile import driver_spec
from attn_core.device.iluvatar import is_iluvatar
from attn_core.device.profile_file import is_profile_path, load_profile_file
from attn_core.device.spec import DEFAULT_DEVICE, DeviceSpec, get_device_spec

_UNSET = object()


def detect_device_spec(
    device: Optional[torch.device] = None, forced: object = _UNSET
) -> DeviceSpec:
    """The profile for ``device``.

    Args:
        device: the tensors' device (only a CUDA device's name is read; no sync).
        forced: a profile name or file that wins over detection; ``None`` means none; left
            out, ``ATTN_CORE_DEVICE`` (via :func:`attn_core.core.settings.current_overrides`).
    """
    name = current_overrides().device if forced is _UNSET else forced
    if name:
        return spec_named(str(name))
    return _matched(device)


@functools.lru_cache(maxsize=16)
def spec_named(name_or_path: str) -> DeviceSpec:
    """A built-in profile by name, or a profile JSON file by path."""
    if is_profile_path(name_or_path):
        return load_profile_file(name_or_path)
    return get_device_spec(name_or_path)


# Device names (lower case) -> built-in profile; Iluvatar devices (attn_core.device.iluvatar) get
# bi-v100.
_NAMED = (("h200", "h200"), ("h100", "h200"), ("a100", "a100"))


@functools.lru_cache(maxsize=16)
def _matched(device: Optional[torch.device]) -> DeviceSpec:
    if device is None or device.type != "cuda" or not torch.cuda.is_available():
        return get_device_spec(DEFAULT_DEVICE)  # planning for the default device, off-GPU
    if is_iluvatar(device):
        return get_device_spec("bi-v100")
    name = torch.cuda.get_device_name(device).lower()
    for key, profile in _NAMED:
        if key in name:
            return get_device_spec(profile)
    return driver_spec(device)
