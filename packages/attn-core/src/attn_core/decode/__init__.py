"""The decode path: pure planners and the executors of their plans.

- :mod:`.plan`: :func:`~.plan.plan_decode`, the torch path's :class:`~.plan.DecodePlan` (tiers,
  partitions, workspace, launches), a pure function of explicit inputs;
- :mod:`.plan_native`: the native kernel's :class:`~.plan_native.NativeDecodePlan` and the
  backend choice with its reason;
- :mod:`.inputs`: :class:`~.inputs.DecodeInputs`, one step's validated tensors and scalars;
- :mod:`.bounds`: what each bad value does without value checks;
- :mod:`.gather`, :mod:`.torch_path`: the torch executor; :mod:`.native_step`: the native one.

Imports ``core``, ``device`` and ``native`` (its split, facts and launch); never the resolver
or the entry point (:mod:`attn_core.runtime`), and the planners never a module that builds,
loads or verifies a kernel.
"""
