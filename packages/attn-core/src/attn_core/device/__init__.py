"""What the device is and can do: profiles, detection, capabilities, "is it Iluvatar?".

- :mod:`.spec`: :class:`~.spec.DeviceSpec` profiles with the provenance of every constant, and
  CUDA's occupancy rule;
- :mod:`.detect`: which profile a device gets (``ATTN_CORE_DEVICE``, a name, the driver);
- :mod:`.driver_profile`, :mod:`.profile_file`: profiles from a driver's answers or a file;
- :mod:`.capabilities`: what the device's torch can do for a dtype (probed once, or stated for
  a profile), and which fused prefill backends are available;
- :mod:`.iluvatar`: the one Iluvatar CoreX test (engine-patch uses it too).

Imports only :mod:`attn_core.core`. Probing runs tiny ops; nothing here builds, loads or
verifies a kernel.
"""
