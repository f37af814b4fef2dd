"""The chunked-prefill path: the pure planner, the torch and fused executors, their checks.

- :mod:`.plan`: :func:`~.plan.plan_prefill` and :class:`~.plan.PrefillPlan` (backend, tiles,
  streaming), a pure function of explicit inputs, choosing the cheapest verified backend;
- :mod:`.plan_native`: :class:`~.plan_native.NativePrefillPlan` (the native kernel's MMA
  variant, tile configuration, split and partials); :mod:`.cost`: every backend's price from
  the device profile's rates (the simulator prices with it too);
- :mod:`.problem`, :mod:`.gather`: one call's validated problem and the context gathers;
- :mod:`.torch_path`: the portable tiled executor; :mod:`.fused`, :mod:`.backends`: the fused
  kernels the platform has (torch's flash SDPA, the vendor's flash attention);
- :mod:`.native_path`: runs a resolved native plan (partials from the workspace);
- :mod:`.verify`: the fused backends' one-time check against the float64 reference (through
  the verify-once registry).

Imports ``core``, ``device``, ``native`` and ``reference``; never :mod:`attn_core.runtime`.
"""
