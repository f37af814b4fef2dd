"""The top floor: resolve once, then run. The public entry points live here.

- :mod:`.resolve`: the impure half of planning, done once per plan (settings snapshot, device
  profile, probed capabilities, native readiness, fused-prefill verification, overrides with
  explicit arguments first), then the pure planners; a cache of resolved decode plans keyed by
  shape, ``max_seq_len`` bucket, ``backend`` and settings generation;
- :mod:`.decode`: ``paged_decode`` (validate -> cached plan -> run);
- :mod:`.prefill`: ``paged_prefix_prefill`` and ``prefill_plan_for``.

Nothing below imports this folder.
"""
